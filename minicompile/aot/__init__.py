"""Ahead-of-time tracing: captured FX graph -> functional ATen graph (our decompositions)."""
from minicompile.aot.lift import lift_attributes
from minicompile.aot.passes import aten_passes, trace_inference

__all__ = ["aten_passes", "lift_attributes", "trace_inference"]
