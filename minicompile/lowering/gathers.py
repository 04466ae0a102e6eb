"""Gathers (``x[idx]``, index_select, embeddings) as reads of ``x`` at index expressions: where an index
tensor is one (an arange and integer add / sub / mul: Hugging Face's masks) provably in bounds, its
value; else (token ids, T5's position buckets) an index read from memory (expr.Indirect) from a buffer
a C++ kernel checked as eager checks it (the wrapper raises eager's error). Triton keeps the extern call."""
from __future__ import annotations

import torch

from minicompile.ir.expr import Expr, Indirect, NotSymbolic, flat_index, size_value
from minicompile.ir.nodes import Lazy, TensorValue, iteration_vars, shape_of
from minicompile.lowering.registry import Unsupported, aten, register_lowering

_INDEX_DTYPES = (torch.int64, torch.int32)
_ARITHMETIC = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


class IndexProbe:
    """An ops handler that evaluates a body to an Expr: index_expr and integer constants are values,
    add / sub / mul combine them; a load or any other op raises NotSymbolic."""

    def __getattr__(self, op):   # where, floordiv, a reduction...: not an index expression
        raise NotSymbolic(f"the op {op}")

    def load(self, name, index, dtype):
        raise NotSymbolic(f"a load of {name}")

    def constant(self, value, dtype):
        if isinstance(value, int) and not isinstance(value, bool):
            return self.to_dtype(value, dtype)
        raise NotSymbolic(f"the constant {value!r}")

    def index_expr(self, expr, dtype):
        return self.to_dtype(Expr.of(expr), dtype)

    def to_dtype(self, x, dtype):   # int32 only where no value wraps
        if dtype is torch.int64 or (dtype is torch.int32 and -2**31 <= Expr.of(x).range()[0] <= Expr.of(x).range()[1] < 2**31):
            return x
        raise NotSymbolic(f"a value of {dtype}")

    def pointwise(self, op, *args, dtype):
        try:
            return self.to_dtype(_ARITHMETIC[op](Expr.of(args[0]), args[1]), dtype)
        except (KeyError, TypeError) as e:   # another op, or a product of two loop variables
            raise NotSymbolic(op) from e


def index_expression(value: TensorValue, index) -> Expr | None:
    """``value`` at ``index`` as an Expr over the index's variables, or None where it reads memory."""
    try:
        return Expr.of(value.loader()(IndexProbe(), index)) if value.dtype in _INDEX_DTYPES else None
    except NotSymbolic:
        return None


def _shift(e: Expr | None, size, wraps: bool) -> int | None:
    """What maps ``e`` into ``[0, size)``: 0, or ``size`` for negative indices where the op ``wraps``
    them; None where some value of ``e`` is or may be out of bounds (eager raises there)."""
    if e is None:
        return None
    lo, hi = e.range()
    if lo >= 0 and e.clamp(0, size_value(size - 1)) == e:   # provably below a symbolic size too
        return 0
    return size if wraps and isinstance(size, int) and hi < 0 and lo >= -size else None


def _from_memory(lw, node, x: TensorValue, t: TensorValue, d: int, dim: int, check: int):
    """The index tensor ``t`` of dim ``d`` of ``x`` checked whole, as eager checks it (see Indirect for
    ``dim`` and ``check``), into a buffer of int64 indices in bounds: ``at(positions)`` reads that."""
    v = lw.realize(t)
    name, stride, offset, size = v.buffer.name, v.stride, v.offset, x.size[d]
    checked = lw.realize(Lazy(torch.int64, t.device, tuple(t.size), lambda ops, idx: ops.index_expr(
        Expr.of(Indirect(name, flat_index(idx, stride) + offset, t.dtype, size, dim, check)), torch.int64), [node.name]))
    return lambda pos: Expr.of(Indirect(checked.buffer.name, flat_index(pos, checked.stride), torch.int64, size, dim, 0))


def gather(lw, node, x: TensorValue, indices: list, wraps: bool) -> Lazy:
    """``x[indices]`` (``None`` takes a whole dim) as a read of ``x`` at index expressions; ``wraps``:
    ``x[idx]``, where a negative index counts from the end, else ``index_select``, which refuses it."""
    if len(indices) != len(x.size):   # index_select of a 0-d tensor treats it as 1-d
        raise Unsupported(f"{len(indices)} indices for a {len(x.size)}-d tensor")
    adv = [d for d, t in enumerate(indices) if t is not None]
    nb = node.meta["val"].dim() - (len(x.size) - len(adv))   # the broadcast index tensors' dims
    shifts = [_shift(index_expression(indices[d], iteration_vars(indices[d].size)), x.size[d], wraps) for d in adv]
    unchecked = [d for d, s in zip(adv, shifts) if s is None]
    if unchecked and ("checked_gather" not in lw.templates
                      or any(indices[d].dtype not in _INDEX_DTYPES or x.size[d] == 0 for d in unchecked)):
        raise Unsupported("its indices are read from memory: eager checks each (a C++ kernel checks them too; "
                          "a Triton kernel does not)")
    first = adv[0] if adv == list(range(adv[0], adv[-1] + 1)) else 0   # eager keeps adjacent ones in place
    load, ndim = x.loader(), len(x.size)
    # per index tensor: its value at positions, index math where provably in bounds, else read and checked
    reads = {d: (lambda t, s: lambda pos: index_expression(t, pos) + s)(indices[d], s) if s is not None
             else _from_memory(lw, node, x, indices[d], d, *((k, 2) if wraps else (d, 3 if d == 1 and ndim > 1 else 1)))
             for k, (d, s) in enumerate(zip(adv, shifts))}

    def at(d, extent):   # index tensor d broadcast to the gathered dims' positions
        t = indices[d]
        return reads[d]([0 if s == 1 else extent[nb - len(t.size) + k] for k, s in enumerate(t.size)])

    def body(ops, idx):
        extent, rest = idx[first:first + nb], iter(list(idx[:first]) + list(idx[first + nb:]))
        picked = {d: at(d, extent) for d in adv}
        return load(ops, [picked[d] if d in picked else next(rest) for d in range(ndim)])
    return Lazy(x.dtype, x.device, shape_of(node.meta["val"]), body, [node.name])


@register_lowering(aten.index.Tensor)
def index(lw, node, x, indices):
    if not all(t is None or isinstance(t, TensorValue) for t in indices) or all(t is None for t in indices):
        raise Unsupported("no index tensor")
    return gather(lw, node, x, list(indices) + [None] * (len(x.size) - len(indices)), wraps=True)


@register_lowering(aten.index_select.default)
def index_select(lw, node, x, dim, idx):
    dim = dim + len(x.size) if dim < 0 else dim
    return gather(lw, node, x, [None] * dim + [idx] + [None] * (len(x.size) - dim - 1), wraps=False)
