"""The symbolic interpreter: frames and their opcode handlers, the values on the stack, and the
tracer that records the FX graph and the guards while it runs."""
