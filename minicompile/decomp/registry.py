"""The decomposition table and the decorator that fills it.

A decomposition rewrites one ATen overload into other ATen ops (ideally core ops, see
``core_ops.py``) with exactly eager's semantics. ``make_fx`` consults the table for every
op that reaches its dispatch mode; a decomposition may return ``NotImplemented`` to leave
a call (e.g. a training-mode batch norm) as it is.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch._ops import OpOverload, OpOverloadPacket

DECOMPOSITIONS: dict[OpOverload, Callable] = {}


def register_decomposition(ops: OpOverload | Iterable[OpOverload]) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the decomposition of one overload or a list of overloads."""
    op_list = [ops] if isinstance(ops, (OpOverload, OpOverloadPacket)) else list(ops)

    def register(fn: Callable) -> Callable:
        for op in op_list:
            if isinstance(op, OpOverloadPacket):
                # A packet would silently also claim its .out overloads, which must not be
                # decomposed into functional ops.
                raise TypeError(
                    f"register_decomposition({op}) got an overload packet; name the overload, "
                    f"e.g. {op}.default (available: {op.overloads()})"
                )
            if op in DECOMPOSITIONS:
                raise ValueError(
                    f"{op} already has a decomposition ({DECOMPOSITIONS[op].__module__}."
                    f"{DECOMPOSITIONS[op].__name__}); remove one of the two registrations"
                )
            DECOMPOSITIONS[op] = fn
        return fn

    return register
