"""The lowering registry: one entry per ATen overload we compile to loop IR.

A lowering is ``fn(lw, node, *args, **kwargs) -> TensorValue | list | number`` where ``lw``
is the GraphLowering in progress, ``node`` the FX node (``node.meta["val"]`` holds eager's
size, stride and dtype for the result) and tensor arguments arrive as TensorValues.
Raising ``Unsupported(reason)`` sends the op to the extern path with that reason.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._ops import OpOverloadPacket

aten = torch.ops.aten

LOWERINGS: dict = {}   # OpOverload, or "ns.name.overload" for ops of a library loaded later


def lowering_for(target):
    """The lowering of an FX call target, or None. Ops that only exist once another library
    has loaded (``prims::fma`` appears when Dynamo imports it) are registered by name."""
    found = LOWERINGS.get(target)
    if found is None and isinstance(target, torch._ops.OpOverload):
        found = LOWERINGS.get(str(target))
    return found


class Unsupported(Exception):
    """This op, dtype or pattern runs as an eager ATen call; the message says why."""


def register_lowering(ops) -> Callable:
    """Register ``fn`` as the lowering of one overload or a list of overloads.

    Like ``register_decomposition``, it refuses a packet (which would also claim ``.out``
    overloads) and a second lowering for the same overload.
    """
    ops = list(ops) if isinstance(ops, (list, tuple)) else [ops]

    def decorator(fn):
        for op in ops:
            if isinstance(op, str) and op.count(".") != 2:
                raise ValueError(f"register_lowering({op!r}): name an op as 'namespace.name.overload'")
            if isinstance(op, OpOverloadPacket):
                raise TypeError(f"register_lowering({op}) got an overload packet; name the overloads "
                                f"(available: {op.overloads()})")
            if op in LOWERINGS:
                raise ValueError(f"{op} already has a lowering ({LOWERINGS[op].__module__}."
                                 f"{LOWERINGS[op].__qualname__}); remove one of the two registrations")
            LOWERINGS[op] = fn
        return fn
    return decorator
