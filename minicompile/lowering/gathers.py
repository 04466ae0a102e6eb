"""Gathers whose indices the graph computes from positions: index math, no extern call.

``x[batch_idx, q_idx]`` with ``batch_idx = arange(b)[:, None]`` (Hugging Face's attention masks, GPT-2's
position embedding): where every index tensor is an index expression (an arange and integer add / sub /
mul on it) whose range lies inside the indexed size, the gather reads ``x`` there. Any other index (read
from memory: token ids, a cumsum) keeps the extern call, which checks each index as eager does."""
from __future__ import annotations

import torch

from minicompile.ir.expr import Expr, NotSymbolic, size_value
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


def gather(node, x: TensorValue, indices: list, wraps: bool) -> Lazy:
    """``x[indices]`` (``None`` takes a whole dim) as a read of ``x`` at index expressions."""
    if len(indices) != len(x.size):   # index_select of a 0-d tensor treats it as 1-d
        raise Unsupported(f"{len(indices)} indices for a {len(x.size)}-d tensor")
    adv = [d for d, t in enumerate(indices) if t is not None]
    nb = node.meta["val"].dim() - (len(x.size) - len(adv))   # the broadcast index tensors' dims
    shifts = [_shift(index_expression(indices[d], iteration_vars(indices[d].size)), x.size[d], wraps) for d in adv]
    if None in shifts:
        raise Unsupported("its indices are read from memory or may be out of bounds: eager checks each")
    first = adv[0] if adv == list(range(adv[0], adv[-1] + 1)) else 0   # eager keeps adjacent ones in place
    load, ndim = x.loader(), len(x.size)

    def at(t, extent, shift):   # index tensor t broadcast to the gathered dims' positions
        return index_expression(t, [0 if s == 1 else extent[nb - len(t.size) + k] for k, s in enumerate(t.size)]) + shift

    def body(ops, idx):
        extent, rest = idx[first:first + nb], iter(list(idx[:first]) + list(idx[first + nb:]))
        picked = {d: at(indices[d], extent, s) for d, s in zip(adv, shifts)}
        return load(ops, [picked[d] if d in picked else next(rest) for d in range(ndim)])
    return Lazy(x.dtype, x.device, shape_of(node.meta["val"]), body, [node.name])


@register_lowering(aten.index.Tensor)
def index(lw, node, x, indices):
    if not all(t is None or isinstance(t, TensorValue) for t in indices) or all(t is None for t in indices):
        raise Unsupported("no index tensor")
    return gather(node, x, list(indices) + [None] * (len(x.size) - len(indices)), wraps=True)


@register_lowering(aten.index_select.default)
def index_select(lw, node, x, dim, idx):
    dim = dim + len(x.size) if dim < 0 else dim
    return gather(node, x, [None] * dim + [idx] + [None] * (len(x.size) - dim - 1), wraps=False)
