"""The loop IR: buffers that get memory, and the loop bodies that fill them.

A loop body is a plain Python function over an ``ops`` handler (see ir/ops.py):
``body(ops, index) -> value`` for a Pointwise, ``body(ops, index, rindex) -> value`` for a
Reduction. The same body is printed, analysed (which buffers it reads, at which index)
and rendered to C++ or Triton by swapping the handler.

Lowering works on *values* (TensorValue): a lazy pointwise computation, a strided view of
a buffer, or a re-indexed view of another value. Only buffers are materialised; a lazy
value is inlined into whatever reads it, which is how pointwise chains fuse.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.utils._sympy.value_ranges import bound_sympy

from minicompile.ir.expr import Expr, NotSymbolic, Sym, flat_index, make_vars, size_value


def prod(xs):
    """The product of sizes: an int, or an Expr when a size is symbolic."""
    out = 1
    for x in xs:
        out = out * x if isinstance(x, Expr) or isinstance(out, Expr) else out * int(x)
    return size_value(out)


def contiguous_strides(size) -> tuple:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc = size_value(acc * s) if isinstance(s, Expr) or isinstance(acc, Expr) else acc * max(int(s), 1)
    return tuple(reversed(strides))


def is_static(sizes) -> bool:
    return not any(isinstance(s, Expr) for s in sizes)


def sym_value(x, stride: bool = False):
    """A torch int or SymInt as the IR keeps it: an int, or an Expr over Sym atoms
    (``s77``, ``16*s77``, ``s27*s77``). A size the index algebra cannot represent (a
    FloorDiv of symbols, a Max) raises NotSymbolic."""
    if isinstance(x, Expr):   # a size the graph computed (sym_size, SymInt arithmetic), lowered already
        return x
    if not isinstance(x, torch.SymInt):
        return int(x)
    as_int = x.node.maybe_as_int()
    return as_int if as_int is not None else _from_sympy(x.node.expr, stride, x.node.shape_env)


def shape_of(t: torch.Tensor) -> tuple:
    return tuple(sym_value(s) for s in t.shape)


def strides_of(t: torch.Tensor) -> tuple:
    return tuple(sym_value(s, stride=True) for s in t.stride())


def _from_sympy(e, stride: bool = False, shape_env=None):
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return Expr.of(Sym(e.name))
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:  # t**2: the scores of attention over t tokens
        return prod([_from_sympy(e.base, shape_env=shape_env)] * int(e.exp))
    parts = [_from_sympy(a, stride and e.is_Mul, shape_env) for a in e.args]   # 2*Max(1, u0): a stride too
    if (type(e).__name__ == "FloorDiv" and isinstance(parts[1], int) and parts[1] > 0   # the guards: s0 >= 7
            and max(Expr.of(parts[0]).range()[0], _lower_bound(e.args[0], shape_env)) >= 0
            and _nonnegative(e.args[0], shape_env)):
        return size_value(Expr.of(parts[0]) // parts[1])  # a strided slice's length: (s0 + 2)//3, (s0 - 7)//2
    if e.is_Function and type(e).__name__ == "Max" and len(parts) == 2:  # a stride: Max(1, (s0 + 2)//3)
        (small, _), (big, big_sympy) = sorted(zip(parts, e.args), key=lambda p: isinstance(p[0], Expr))
        low = max(Expr.of(big).range()[0], _lower_bound(big_sympy, shape_env))   # the trace's guards: s0 >= 7
        if isinstance(small, int) and low >= small:
            return big
        # a stride Max(1, s0 - 7) or Max(1, u0) over a size that may be 0: it differs from the size
        # only where that is 0, and then the tensor has no element for the stride to place
        if stride and small == 1 and low >= 0:
            return big
    if e.is_Add:
        return size_value(sum(parts[1:], Expr.of(parts[0])))
    if e.is_Mul:
        return prod(parts)
    raise NotSymbolic(f"the size {e} is not a polynomial in the symbols")


def _lower_bound(e, shape_env) -> float:
    """The least value of ``e`` by the trace's value ranges (which hold its guards), -inf unknown."""
    if shape_env is None:
        return float("-inf")
    try:
        return bound_sympy(e, shape_env.var_to_range).lower
    except Exception:   # an expression the range analysis does not know
        return float("-inf")


def _nonnegative(e, shape_env) -> bool:
    """``e`` >= 0 by the trace's value ranges. A data-dependent symbol (``u0``, a value
    ``.item()`` read) is non-negative only where the trace knows it (a size, a torch._check);
    a rendered division truncates, where Python's floors, so the two differ below 0."""
    if not any(s.name.startswith("u") for s in e.free_symbols):
        return True
    return shape_env is not None and bound_sympy(e, shape_env.var_to_range).lower >= 0


@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements live in its buffer: eager's sizes, strides and offset."""
    size: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: torch.Tensor) -> "Layout":
        return Layout(tuple(sym_value(s) for s in t.shape), strides_of(t),
                      sym_value(t.storage_offset()), t.dtype, t.device)

    def index(self, idx) -> Expr:
        return flat_index(idx, self.stride) + self.offset

    def storage_numel(self) -> int:
        """Elements the buffer must hold for this layout (0 for an empty tensor)."""
        if prod(self.size) == 0:
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))


# -- buffers ------------------------------------------------------------------------------

@dataclass(eq=False)
class Buffer:
    name: str
    layout: Layout
    origins: list = field(default_factory=list)  # FX node names this buffer comes from

    @property
    def dtype(self):
        return self.layout.dtype

    @property
    def device(self):
        return self.layout.device


@dataclass(eq=False)
class InputBuffer(Buffer):
    """A graph input (or a constant the graph captured); its memory belongs to the caller."""
    position: int = 0


@dataclass(eq=False)
class Pointwise:
    ranges: tuple
    body: Callable  # body(ops, index) -> value

    @property
    def reduction_ranges(self):
        return ()


@dataclass(eq=False)
class Reduction:
    ranges: tuple            # the output's sizes
    reduction_ranges: tuple  # the sizes reduced over
    reduction_type: str      # sum, prod, max, min, argmax, argmin, any, all
    body: Callable           # body(ops, index, rindex) -> value to accumulate
    src_dtype: torch.dtype   # dtype of the accumulated values


@dataclass(eq=False)
class ComputedBuffer(Buffer):
    """A buffer filled by a generated loop nest (Pointwise or Reduction)."""
    data: Any = None
    mutates: Optional[str] = None  # the name of the input buffer this writes into, if any
    # data's loops run over the dims in this order (memory order, see ``in_memory_order``);
    # store_index takes an index in that order
    loop_order: Optional[tuple] = None

    def store_index(self, index) -> Expr:
        return self.layout.index(logical_index(index, self.loop_order) if self.loop_order else index)


def memory_order(layout: Layout) -> tuple | None:
    """The dims of a dense, static, permuted layout from outermost to innermost in memory (e.g.
    channels-last NCHW: (0, 2, 3, 1)); None when the loops may run in logical order."""
    if not (is_static(layout.size) and is_static(layout.stride)) or layout.storage_numel() != prod(layout.size):
        return None
    order = tuple(sorted(range(len(layout.size)), key=lambda d: (-layout.stride[d] if layout.size[d] > 1 else 0, d)))
    moved = [d for d in order if layout.size[d] > 1]
    return order if moved != sorted(moved) else None


def logical_index(index, order) -> list:
    out = [None] * len(order)
    for k, d in enumerate(order):
        out[d] = index[k]
    return out


def in_memory_order(data: Pointwise, order: tuple) -> Pointwise:
    """``data`` with its loops permuted to ``order``: consecutive iterations store consecutively."""
    body = data.body
    return Pointwise(tuple(data.ranges[d] for d in order), lambda ops, idx: body(ops, logical_index(idx, order)))


@dataclass(eq=False)
class ExternKernel(Buffer):
    """An eager ATen call inside the compiled graph, with the reason it is not compiled."""
    op: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    reason: str = ""
    outputs: list = field(default_factory=list)  # MultiOutput children when op returns several


@dataclass(eq=False)
class MultiOutput(Buffer):
    """The k-th tensor an extern call returns."""
    parent: Optional[ExternKernel] = None
    path: tuple = ()


# -- values -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScalarRef:
    """A number the graph computes at run time that no size expression holds (a float or bool
    read with .item(), a comparison for torch._check): the host wrapper keeps it in a variable
    of this name, and ops that take it run as extern calls."""
    name: str

    def __repr__(self) -> str:
        return self.name


class TensorValue:
    """What a lowering takes and returns. Knows its dtype, device and sizes, and how to load."""
    dtype: torch.dtype
    device: torch.device
    size: tuple

    def loader(self) -> Callable:  # loader(ops, index) -> value
        raise NotImplementedError


@dataclass(eq=False)
class Lazy(TensorValue):
    """A pointwise computation not yet given memory; inlined into every reader."""
    dtype: torch.dtype
    device: torch.device
    size: tuple
    body: Callable
    origins: list = field(default_factory=list)

    def loader(self):
        if self.dtype not in (torch.bfloat16, torch.float16):
            return self.body
        # A narrow value is computed in float32; round it as eager does after every op, so a
        # reader (a float32 op, a reduction) sees the bf16/fp16 value, not the wider one.
        body, dtype = self.body, self.dtype
        return lambda ops, index: ops.to_dtype(body(ops, index), dtype)


@dataclass(eq=False)
class StorageView(TensorValue):
    """A strided window on a buffer: loads are ``offset + sum(index * stride)``."""
    buffer: Buffer
    size: tuple
    stride: tuple
    offset: int

    @property
    def dtype(self):
        return self.buffer.dtype

    @property
    def device(self):
        return self.buffer.device

    @staticmethod
    def whole(buffer: Buffer) -> "StorageView":
        lay = buffer.layout
        return StorageView(buffer, lay.size, lay.stride, lay.offset)

    def is_whole(self) -> bool:
        lay = self.buffer.layout
        return (self.size, self.stride, self.offset) == (lay.size, lay.stride, lay.offset)

    def loader(self):
        name, stride, offset = self.buffer.name, self.stride, self.offset
        dtype = self.dtype

        def load(ops, index):
            return ops.load(name, flat_index(index, stride) + offset, dtype)
        return load


@dataclass(eq=False)
class ReindexView(TensorValue):
    """A view of a lazy value: index math maps this value's index to the base's."""
    base: TensorValue
    size: tuple
    reindex: Callable  # reindex(index) -> base index
    origins: list = field(default_factory=list)

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def device(self):
        return self.base.device

    def loader(self):
        inner, reindex = self.base.loader(), self.reindex

        def load(ops, index):
            return inner(ops, reindex(index))
        return load


def iteration_vars(ranges, prefix="i"):
    """Fresh symbolic loop variables for printing or analysing a body on its own."""
    return [Expr.of(v) for v in make_vars(prefix, ranges)]
