"""ATen core ops -> loop IR. Importing this package fills the LOWERINGS registry."""
from minicompile.lowering import misc, pointwise, reductions, views  # noqa: F401  (registration)
from minicompile.lowering.graph import ExternRecord, GraphLowering
from minicompile.lowering.registry import LOWERINGS, Unsupported, register_lowering

__all__ = ["GraphLowering", "ExternRecord", "LOWERINGS", "Unsupported", "register_lowering"]
