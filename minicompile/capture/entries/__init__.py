"""Compiled entries: tracing a segment of a frame into one, the Python it runs, its guards, the
per-code cache that picks it, and what runs in real Python at a graph break."""
