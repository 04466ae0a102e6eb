"""Ahead-of-time tracing: captured FX graph -> functional ATen graph (our decompositions)."""
from minicompile.aot.lift import lift_attributes
from minicompile.aot.passes import ATEN_PASSES, COMPILE_PASSES, trace_inference

__all__ = ["ATEN_PASSES", "COMPILE_PASSES", "lift_attributes", "trace_inference"]
