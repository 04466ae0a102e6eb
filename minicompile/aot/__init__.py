"""Ahead-of-time tracing: captured FX graph -> functional ATen graph (our decompositions)."""
from minicompile.aot.trace import trace_inference

__all__ = ["trace_inference"]
