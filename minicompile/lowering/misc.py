"""Casts, copies, constants, ranges, concatenation, padding and input mutation."""
from __future__ import annotations

import torch

from minicompile.ir.expr import Expr, NotSymbolic, size_value
from minicompile.ir.nodes import (ComputedBuffer, InputBuffer, Lazy, Pointwise, ReindexView, StorageView,
                                  iteration_vars, shape_of)
from minicompile.ir.ops import compute_dtype
from minicompile.lowering.pointwise import broadcast_loader
from minicompile.lowering.registry import Unsupported, aten, register_lowering


def cast(x, dtype, origins=()):
    """``x`` converted to ``dtype`` (bf16/fp16 targets are rounded, then computed in fp32)."""
    load = x.loader()
    return Lazy(dtype, x.device, tuple(x.size), lambda ops, idx: ops.to_dtype(load(ops, idx), dtype), list(origins))


@register_lowering(aten._to_copy.default)
def to_copy(lw, node, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    meta = node.meta["val"]
    if meta.device != x.device:
        raise Unsupported(f"copy between devices ({x.device} -> {meta.device})")
    return cast(x, meta.dtype, [node.name])


@register_lowering(aten.copy.default)
def copy(lw, node, dst, src, non_blocking=False):
    load = broadcast_loader(src, tuple(dst.size), lw.same_size)
    return Lazy(dst.dtype, dst.device, tuple(dst.size),
                lambda ops, idx: ops.to_dtype(load(ops, idx), dst.dtype), [node.name])


def constant_value(node, value):
    meta = node.meta["val"]
    dtype = meta.dtype
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point:
        value = int(value)
    else:
        value = float(value)
    return Lazy(dtype, meta.device, shape_of(meta),
                lambda ops, idx: ops.constant(value, compute_dtype(dtype)), [node.name])


@register_lowering(aten.full.default)
def full(lw, node, size, value, **kwargs):
    return constant_value(node, value)


@register_lowering(aten.full_like.default)
def full_like(lw, node, x, value, **kwargs):
    return constant_value(node, value)


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(lw, node, value, **kwargs):
    return constant_value(node, value)


@register_lowering([aten.zeros_like.default, aten.empty_like.default, aten.zeros.default,
                    aten.empty.memory_format, aten.new_zeros.default, aten.new_empty.default])
def zeros(lw, node, *args, **kwargs):
    return constant_value(node, 0)


@register_lowering([aten.ones_like.default, aten.ones.default, aten.new_ones.default])
def ones(lw, node, *args, **kwargs):
    return constant_value(node, 1)


@register_lowering([aten.arange.start_step, aten.arange.start, aten.arange.default])
def arange(lw, node, *args, **kwargs):
    meta = node.meta["val"]
    nums = [a for a in args if isinstance(a, (int, float))]
    start, step = 0, 1
    if node.target is aten.arange.start_step:
        start, step = nums[0], (nums[2] if len(nums) > 2 else 1)
    elif node.target is aten.arange.start:
        start = nums[0]
    dtype = meta.dtype
    cdt = compute_dtype(dtype)
    exact = all(isinstance(v, int) for v in (start, step))

    def body(ops, idx):
        if exact:
            return ops.index_expr(Expr.of(idx[0]) * step + start, cdt)
        i = ops.index_expr(idx[0], torch.float64)
        v = ops.pointwise("add", ops.pointwise("mul", i, ops.constant(float(step), torch.float64), dtype=torch.float64),
                          ops.constant(float(start), torch.float64), dtype=torch.float64)
        return ops.to_dtype(v, cdt)
    return Lazy(dtype, meta.device, shape_of(meta), body, [node.name])


def _nonempty(size) -> bool:
    """size > 0 for every value of its symbols. A size that is 0 for some (a data-dependent
    size: nonzero's row count) is Unsupported: the pieces are selected by position, and an
    empty piece has no element to load, so the op runs as an extern call."""
    if isinstance(size, int):
        return size > 0
    if size.range()[0] > 0:
        return True
    raise Unsupported(f"a piece of size {size}, which may be 0 at run time")


def _static(value) -> int:
    if isinstance(value, Expr):
        raise NotSymbolic(f"a pad of {value} elements, which depends on the size")
    return value


def index_value(ops, value):
    """An int64 value in a loop body: a literal, or a size read at run time."""
    return ops.constant(value, torch.int64) if isinstance(value, int) else ops.index_expr(value, torch.int64)


def in_bounds(ops, pos: Expr, size):
    """0 <= pos < size, as a bool value in a loop body (a padded read's mask)."""
    p = ops.index_expr(pos, torch.int64)
    return ops.pointwise("logical_and", ops.pointwise("ge", p, ops.constant(0, torch.int64), dtype=torch.bool),
                         ops.pointwise("lt", p, index_value(ops, size), dtype=torch.bool), dtype=torch.bool)


@register_lowering(aten.cat.default)
def cat(lw, node, tensors, dim=0):
    meta = node.meta["val"]
    size = shape_of(meta)
    dim = dim + len(size) if dim < 0 else dim
    # legacy: 1-D empty tensors are skipped whatever the other tensors' rank
    parts = [t for t in tensors if not (len(t.size) == 1 and t.size[0] == 0) and _nonempty(t.size[dim])]
    if not parts:
        return constant_value(node, 0)
    dtype = meta.dtype
    cdt = compute_dtype(dtype)
    pieces, offset = [], 0
    for t in parts:
        pieces.append((offset, t.size[dim], t.loader(), t.dtype))
        offset += t.size[dim]

    def body(ops, idx):
        pos = Expr.of(idx[dim])
        lo, hi = pos.range()   # a loop cut at the pieces' edges reads one piece (codegen/cpp_plan.py)
        out = None
        for start, length, load, dt in reversed([p for p in pieces if _may_read(p[0], p[1], lo, hi)] or pieces):
            local = (pos - start).clamp(0, length - 1)
            v = load(ops, idx[:dim] + [local] + idx[dim + 1:])
            if dt != dtype:
                v = ops.to_dtype(v, dtype)
            if out is None:
                out = v
            else:
                below = ops.pointwise("lt", ops.index_expr(pos, torch.int64), index_value(ops, start + length),
                                      dtype=torch.bool)
                out = ops.pointwise("where", below, v, out, dtype=cdt)
        return out
    return Lazy(dtype, meta.device, size, body, [node.name])


def _may_read(start, length, lo: int, hi: int) -> bool:
    """A piece at ``start`` of ``length`` overlaps positions lo .. hi (a symbolic one may)."""
    return not (isinstance(start, int) and isinstance(length, int)) or (start <= hi and start + length > lo)


@register_lowering(aten.repeat.default)
def repeat(lw, node, x, repeats):
    """``x`` tiled ``repeats`` times along each dimension: output index i reads ``i mod size`` (a copy,
    inlined into its readers: Swin's attention mask repeated over the batch costs no pass)."""
    size = shape_of(node.meta["val"])
    lead = len(size) - len(x.size)
    load = x.loader()

    def source(idx):
        out = []
        for k, n in enumerate(x.size):
            i = Expr.of(idx[lead + k])
            out.append(i if repeats[lead + k] == 1 else Expr.of(0) if n == 1 else i % _static_size(n, "repeat"))
        return out
    if any(s == 0 for s in size):
        return constant_value(node, 0)
    return Lazy(x.dtype, x.device, size, lambda ops, idx: load(ops, source(idx)), [node.name])


@register_lowering(aten.roll.default)
def roll(lw, node, x, shifts, dims=()):
    """``x`` rotated: output index i along a rolled dimension of size n reads ``(i - shift) mod n``."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims or len(dims) != len(shifts):
        raise Unsupported("roll of the flattened tensor")
    ndim = len(x.size)
    moves = {}
    for d, s in zip(dims, shifts):
        d = d + ndim if d < 0 else d
        n = _static_size(x.size[d], "roll")
        if n:
            moves[d] = (moves.get(d, 0) - s) % n
    load = x.loader()

    def source(idx):
        return [(Expr.of(i) + moves[d]) % x.size[d] if moves.get(d) else i for d, i in enumerate(idx)]
    return Lazy(x.dtype, x.device, tuple(x.size), lambda ops, idx: load(ops, source(idx)), [node.name])


def _static_size(n, what):
    if isinstance(n, Expr):
        raise NotSymbolic(f"a {what} over a dimension of symbolic size {n}")
    return n


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(lw, node, x, pad, value=0):
    meta = node.meta["val"]
    size = shape_of(meta)
    ndim = len(size)
    dtype = meta.dtype
    cdt = compute_dtype(dtype)
    lows = [0] * ndim
    for k in range(len(pad) // 2):
        lows[ndim - 1 - k] = pad[2 * k]
    load = x.loader()
    fill = bool(value) if dtype == torch.bool else (value if dtype.is_floating_point else int(value))

    def body(ops, idx):
        src, inside = [], None
        for d in range(ndim):
            p = Expr.of(idx[d]) - lows[d]
            src.append(p.clamp(0, x.size[d] - 1))
            if lows[d] > 0 or _static(size_value(Expr.of(size[d]) - lows[d] - x.size[d])) > 0:  # padded above
                ok = in_bounds(ops, p, x.size[d])
                inside = ok if inside is None else ops.pointwise("logical_and", inside, ok, dtype=torch.bool)
        v = load(ops, src)
        if inside is None:
            return v
        return ops.pointwise("where", inside, v, ops.constant(fill, cdt), dtype=cdt)
    if any(s == 0 for s in x.size) and any(s > 0 for s in size):
        return constant_value(node, fill)
    return Lazy(dtype, meta.device, size, body, [node.name])


@register_lowering(aten.copy_.default)
def copy_(lw, node, dst, src, non_blocking=False):
    """Input mutation (what functionalization leaves at the end): write into the caller's tensor."""
    if not (isinstance(dst, StorageView) and isinstance(dst.buffer, InputBuffer) and dst.is_whole()):
        raise Unsupported("copy_ into something other than a whole graph input")
    target = dst.buffer
    _realize_readers_of(lw, target, node)
    src = lw.env[node.args[1]] if isinstance(node.args[1], torch.fx.Node) else src
    load = broadcast_loader(src, tuple(dst.size), lw.same_size)
    value = Lazy(dst.dtype, dst.device, tuple(dst.size), lambda ops, idx: ops.to_dtype(load(ops, idx), dst.dtype))
    if _reads_elsewhere(lw, value, target):
        value = lw.realize(src)  # read all of the old values before any is overwritten
        load = broadcast_loader(value, tuple(dst.size), lw.same_size)
    buf = ComputedBuffer(lw.new_name(), target.layout, [node.name],
                         data=Pointwise(tuple(dst.size), lambda ops, idx: ops.to_dtype(load(ops, idx), dst.dtype)),
                         mutates=target.name)
    lw.register(buf)
    return StorageView.whole(buf)


def _realize_readers_of(lw, target: InputBuffer, mutation) -> None:
    """Values still to be read after this mutation must see the old contents: compute them now.

    Only a reader not lowered yet needs that; one lowered already has inlined the value (or
    realized it) and is itself checked here when it is still to be read."""
    for fx_node, value in list(lw.env.items()):
        pending = [u for u in fx_node.users if u is not mutation and u not in lw.env]
        if (isinstance(value, (Lazy, ReindexView)) and pending
                and any(r.name == target.name for r in lw.recorded(value).reads)):
            lw.env[fx_node] = lw.realize_as_node(value, fx_node)


def _reads_elsewhere(lw, value, target: InputBuffer) -> bool:
    here = target.layout.index(iteration_vars(value.size))
    return any(r.name == target.name and r.index != here for r in lw.recorded(value).reads)


def _triangle(upper: bool):
    def lower(lw, node, x, diagonal=0):
        load, n = x.loader(), len(x.size)
        zero = 0 if x.dtype != torch.bool else False

        def body(ops, idx):
            row = ops.index_expr(idx[n - 2], torch.int64)
            col = ops.index_expr(Expr.of(idx[n - 1]) - diagonal, torch.int64)
            keep = ops.pointwise("ge" if upper else "le", col, row, dtype=torch.bool)
            return ops.pointwise("where", keep, load(ops, idx), ops.constant(zero, compute_dtype(x.dtype)),
                                 dtype=compute_dtype(x.dtype))
        return Lazy(x.dtype, x.device, tuple(x.size), body, [node.name])
    return lower


register_lowering(aten.tril.default)(_triangle(upper=False))
register_lowering(aten.triu.default)(_triangle(upper=True))
