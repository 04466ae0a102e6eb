"""What Python means on symbolic values: operators and attributes, builtins, calls (inlined,
recorded or run), and objects made while tracing."""
