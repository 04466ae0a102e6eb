"""Ahead-of-time tracing: captured FX graph -> functional ATen graph (our decompositions)."""
from minicompile.aot.lift import lift_attributes
from minicompile.aot.trace import trace_inference

__all__ = ["lift_attributes", "trace_inference"]
