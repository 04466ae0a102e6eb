"""The lowering registry: one entry per ATen op we compile to loop IR.

A lowering is ``fn(lw, node, *args, **kwargs) -> TensorValue | list | number`` where ``lw``
is the GraphLowering in progress, ``node`` the FX node (``node.meta["val"]`` holds eager's
size, stride and dtype for the result) and tensor arguments arrive as TensorValues.
Raising ``Unsupported(reason)`` sends the op to the extern path with that reason.
"""
from __future__ import annotations

from typing import Callable

import torch

aten = torch.ops.aten

LOWERINGS: dict = {}


class Unsupported(Exception):
    """This op, dtype or pattern runs as an eager ATen call; the message says why."""


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def register_lowering(ops, *, all_overloads: bool = False) -> Callable:
    """Register ``fn`` for OpOverloads (or packets), or for an overload's name ("prims.fma.default")
    where the op is registered with torch only later; ``lowering_for`` finds both."""
    ops = ops if isinstance(ops, (list, tuple)) else [ops]

    def decorator(fn):
        for op in ops:
            targets = _overloads(op) if all_overloads or isinstance(op, torch._ops.OpOverloadPacket) else [op]
            for target in targets:
                LOWERINGS[target] = fn
        return fn
    return decorator


def lowering_for(target) -> Callable | None:
    return LOWERINGS.get(target) or (LOWERINGS.get(str(target)) if isinstance(target, torch._ops.OpOverload) else None)
