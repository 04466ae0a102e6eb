"""Values as arguments of an FX graph node: constants FX can spell, fake tensors to run an op on
while tracing, and the nested containers (tuples, lists, dicts, slices, sizes) mapped through."""
from __future__ import annotations

import torch

from minicompile.capture import dynamic
from minicompile.capture.interp.variables import GraphBreak, SymCell, SymIter, TensorVar, refuse_opaque


# Constants FX writes into graph code as literals (or names it defines itself).
_GRAPH_CONSTANTS = {int, float, bool, complex, str, type(None), type(...), torch.dtype, torch.device,
                    torch.layout, torch.memory_format}
_GRAPH_TYPES = {int, float, bool, complex}


def graph_constant(v):
    """``v`` as a graph argument: a NumPy scalar becomes the Python number it equals; a value
    the graph's generated code could not spell (an array, a ``typing`` object, a class) is a
    graph break rather than a NameError or SyntaxError when the graph runs."""
    refuse_opaque("a torch op", v)
    if isinstance(v, (TensorVar, torch.Tensor, *dynamic.SYM_TYPES)) or type(v) in _GRAPH_CONSTANTS or (
            type(v) is type and v in _GRAPH_TYPES):
        return v
    if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "shape", None) == ():
        return v.item()
    raise GraphBreak(f"a {type(v).__name__} cannot be a constant in the graph")


def to_fake(v):
    if isinstance(v, TensorVar):
        return v.fake
    if isinstance(v, torch.Tensor):
        raise GraphBreak("a real tensor reached the graph without a source (cannot be an input)")
    return v


def map_args(value, fn):
    if isinstance(value, (TensorVar, torch.Tensor)):
        return fn(value)
    if type(value) is tuple:
        return tuple(map_args(v, fn) for v in value)
    if type(value) is list:
        return [map_args(v, fn) for v in value]
    if type(value) is dict:
        return {k: map_args(v, fn) for k, v in value.items()}
    if type(value) is slice:
        return slice(map_args(value.start, fn), map_args(value.stop, fn), map_args(value.step, fn))
    if isinstance(value, torch.Size):
        return value if all(type(s) is int for s in value) else tuple(map_args(s, fn) for s in value)
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)(*[map_args(v, fn) for v in value])
    if isinstance(value, (SymIter, SymCell)):
        raise GraphBreak(f"cannot pass a {type(value).__name__} to a torch op")
    return fn(value)


def has_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) or (isinstance(v, (tuple, list)) and any(has_tensor(x) for x in v))
