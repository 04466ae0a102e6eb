"""ATen core ops -> loop IR (``lower(gm) -> LoopGraph``). Importing this package fills LOWERINGS."""
from minicompile.lowering import flex, gathers, misc, pointwise, pooling, reductions, views  # noqa: F401  (registration)
from minicompile.lowering.graph import ExternRecord, GraphLowering, lower
from minicompile.lowering.registry import LOWERINGS, Unsupported, register_lowering

__all__ = ["lower", "GraphLowering", "ExternRecord", "LOWERINGS", "Unsupported", "register_lowering"]
