"""Reductions -> Reduction buffers (sum, prod, max, min, argmax, argmin, any, all).

mean, var and var_mean are built from sums: var takes two passes (sum, then the sum of
squared deviations from the mean), which the scheduler fuses into one kernel that reads
each row twice from cache.
"""
from __future__ import annotations

import torch

from minicompile.ir.expr import Expr
from minicompile.ir.nodes import (ComputedBuffer, Layout, Lazy, Reduction, StorageView, contiguous_strides, prod,
                                  shape_of, strides_of)
from minicompile.ir.ops import compute_dtype
from minicompile.lowering.registry import Unsupported, aten, register_lowering
from minicompile.lowering.views import make_view, reshape


def _norm_dims(dims, ndim):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + ndim if d < 0 else d for d in dims}) if ndim else []


def reduce(lw, x, dims, keepdim, reduction_type, out_dtype, *, node=None, body=None, name_node=None):
    """A Reduction buffer over ``dims`` of ``x``; returns a view of it."""
    ndim = len(x.size)
    dims = _norm_dims(dims, ndim)
    kept = [k for k in range(ndim) if k not in dims]
    out_size = tuple(1 if (k in dims) else x.size[k] for k in range(ndim)) if keepdim else tuple(x.size[k] for k in kept)
    red_size = tuple(x.size[k] for k in dims)
    if prod(red_size) == 0 and reduction_type in ("max", "min", "argmax", "argmin"):
        raise Unsupported(f"{reduction_type} over an empty dimension raises in eager")
    load = x.loader()
    src_dtype = compute_dtype(x.dtype)
    if reduction_type == "sum" and body is None and (copies := _copies(x, dims, keepdim, out_dtype, prod(red_size),
                                                                       name_node or node)):
        return copies

    def full_index(index, rindex):
        out, it_r = [], iter(rindex)
        pos = {k: j for j, k in enumerate(kept)}
        for k in range(ndim):
            if k in dims:
                out.append(next(it_r))
            else:
                out.append(index[k] if keepdim else index[pos[k]])
        return out

    def default_body(ops, index, rindex):
        return load(ops, full_index(index, rindex))

    def custom_body(ops, index, rindex):
        return body(ops, full_index(index, rindex))

    meta = node.meta.get("val") if node is not None else None
    if isinstance(meta, torch.Tensor) and meta.dtype == out_dtype and shape_of(meta) == out_size:
        layout = Layout(out_size, strides_of(meta), 0, out_dtype, x.device)
    else:
        layout = Layout(out_size, contiguous_strides(out_size), 0, out_dtype, x.device)
    data = Reduction(out_size, red_size, reduction_type, default_body if body is None else custom_body, src_dtype)
    names = list(getattr(x, "origins", [])) + ([(name_node or node).name] if (name_node or node) is not None else [])
    buf = ComputedBuffer(lw.new_name(), layout, list(dict.fromkeys(names)), data=data)
    lw.register(buf)
    return StorageView.whole(buf)


def _copies(x, dims, keepdim, dtype, n, node):
    """A sum over dimensions that ``x`` expands (stride 0) as ``n`` copies of one value times n
    (n=None: their mean, the value), rounded once as in float64, not at every addition (eager's
    is exact for some lengths only); + 0.0 as a sum starts from +0.0. None for other sums."""
    if not (isinstance(x, StorageView) and dims and all(x.stride[k] == 0 and x.size[k] != 0 for k in dims)):
        return None   # (an empty row has no value to load: its sum is 0, its mean NaN)
    load = x.loader()

    def body(ops, idx):
        at = iter(idx)
        v = ops.to_dtype(load(ops, [Expr.of(0) if k in dims else idx[k] if keepdim else next(at)
                                    for k in range(len(x.size))]), dtype)
        v = v if n is None else ops.pointwise("mul", v, _number(ops, n, dtype), dtype=dtype)
        return ops.pointwise("add", v, ops.constant(0.0, dtype), dtype=dtype) if dtype.is_floating_point else v
    size = tuple(1 if k in dims else s for k, s in enumerate(x.size) if keepdim or k not in dims)
    return Lazy(dtype, x.device, size, body, [node.name] if node is not None else [])


def _accumulate(kind):
    """sum/prod: accumulate in the result's compute dtype (fp32 for bf16/fp16), cast back once."""
    def lower(lw, node, x, dims=None, keepdim=False, *, dtype=None):
        out = node.meta["val"]
        if dtype is not None or out.dtype != x.dtype:
            x = _cast(x, out.dtype)
        acc = reduce(lw, x, dims, keepdim, kind, compute_dtype(out.dtype), node=node)
        return _cast(acc, out.dtype, node) if acc.dtype != out.dtype else acc
    return lower


register_lowering([aten.sum.dim_IntList, aten.sum.default])(_accumulate("sum"))
register_lowering([aten.prod.default, aten.prod.dim_int])(_accumulate("prod"))


def _minmax(kind):
    def lower(lw, node, x, dims=(), keepdim=False):
        out = node.meta["val"]
        acc = reduce(lw, x, dims, keepdim, kind, compute_dtype(out.dtype), node=node)
        return _cast(acc, out.dtype, node) if acc.dtype != out.dtype else acc
    return lower


register_lowering(aten.amax.default)(_minmax("max"))
register_lowering(aten.amin.default)(_minmax("min"))


def _arg(kind):
    def lower(lw, node, x, dim=None, keepdim=False):
        if dim is None:
            flat = reshape(x, (prod(x.size),)) if len(x.size) != 1 else x
            res = reduce(lw, flat, [0], False, kind, torch.int64, node=node)
            if keepdim:
                raise Unsupported(f"{kind} with dim=None and keepdim=True")
            return res
        return reduce(lw, x, [dim], keepdim, kind, torch.int64, node=node)
    return lower


register_lowering(aten.argmax.default)(_arg("argmax"))
register_lowering(aten.argmin.default)(_arg("argmin"))


def _anyall(kind):
    def lower(lw, node, x, dims=None, keepdim=False):
        b = _cast(x, torch.bool)
        return reduce(lw, b, dims, keepdim, kind, torch.bool, node=node)
    return lower


register_lowering([aten.any.default, aten.any.dim, aten.any.dims])(_anyall("any"))
register_lowering([aten.all.default, aten.all.dim, aten.all.dims])(_anyall("all"))


@register_lowering(aten.mean.dim)
def mean(lw, node, x, dims, keepdim=False, *, dtype=None):
    out = node.meta["val"]
    if not out.dtype.is_floating_point:
        raise Unsupported("mean of an integer tensor")
    cdt = compute_dtype(out.dtype)
    x = _cast(x, out.dtype) if x.dtype != out.dtype else x
    n = _count(x, dims)
    if (copies := _copies(x, _norm_dims(dims, len(x.size)), keepdim, cdt, None, node)) is not None:
        return _cast(copies, out.dtype, node)
    total = reduce(lw, x, dims, keepdim, "sum", cdt, name_node=node)
    return _div(total, n if isinstance(n, Expr) else float(n), out.dtype, node)


@register_lowering([aten.var.correction, aten.var_mean.correction])
def var(lw, node, x, dims=None, *, correction=None, keepdim=False):
    out = node.meta["val"]
    out0 = out[0] if isinstance(out, (tuple, list)) else out
    if not out0.dtype.is_floating_point:
        raise Unsupported("var of a non-floating tensor")
    cdt = compute_dtype(out0.dtype)
    correction = 1 if correction is None else correction
    n = _count(x, dims)
    ndim = len(x.size)
    rdims = _norm_dims(dims, ndim)
    # The mean is summed relative to the row's first element: a constant row then has exactly
    # its value as mean and exactly zero variance (as eager's Welford kernels give), and large
    # offsets cancel before they are accumulated.
    load_x = x.loader()

    def first(ops, index):
        if n == 0:  # nothing to read: the mean is 0/0
            return ops.constant(0.0, cdt)
        return ops.to_dtype(load_x(ops, [Expr.of(0) if k in rdims else index[k] for k in range(ndim)]), cdt)

    def shifted(ops, index):
        return ops.pointwise("sub", ops.to_dtype(load_x(ops, index), cdt), first(ops, index), dtype=cdt)
    total = reduce(lw, x, rdims, True, "sum", cdt, body=shifted, name_node=node)
    load_t = total.loader()
    mean_keep = Lazy(cdt, x.device, total.size, lambda ops, idx: ops.pointwise(
        "add", first(ops, idx), ops.pointwise("truediv", load_t(ops, idx), _number(ops, n, cdt), dtype=cdt),
        dtype=cdt))
    load_m = mean_keep.loader()

    def sq_dev(ops, index):
        m_index = [Expr.of(0) if k in rdims else index[k] for k in range(ndim)]
        d = ops.pointwise("sub", ops.to_dtype(load_x(ops, index), cdt), load_m(ops, m_index), dtype=cdt)
        return ops.pointwise("mul", d, d, dtype=cdt)
    m2 = reduce(lw, x, rdims, keepdim, "sum", cdt, body=sq_dev, name_node=node)
    if isinstance(n, Expr) and correction > 1:  # n - correction could be negative for a small size
        raise Unsupported("not supported symbolically: var with correction > 1")
    variance = _div(m2, n - correction if isinstance(n, Expr) else float(max(n - correction, 0)), out0.dtype, node)
    if node.target is aten.var_mean.correction:
        mean_out = _cast(mean_keep, out0.dtype, node)
        if not keepdim:  # the keepdim sum serves both: drop its size-1 dims
            kept = [k for k in range(ndim) if k not in rdims]
            mean_out = make_view(mean_out, [x.size[k] for k in kept], _unsqueeze_at(rdims, kept, ndim))
        return [variance, mean_out]
    return variance


def _unsqueeze_at(rdims, kept, ndim):
    def reindex(idx):
        out = [Expr.of(0)] * ndim
        for j, k in enumerate(kept):
            out[k] = idx[j]
        return out
    return reindex


def _count(x, dims):
    ndim = len(x.size)
    return prod(x.size[k] for k in _norm_dims(dims, ndim))


def _cast(x, dtype, node=None):
    load = x.loader()
    cdt = compute_dtype(dtype)
    return Lazy(dtype, x.device, tuple(x.size), lambda ops, idx: ops.to_dtype(load(ops, idx), dtype if dtype in (torch.bfloat16, torch.float16) else cdt),
                [node.name] if node is not None else [])


def _number(ops, n, dtype):
    """A count as a value in a loop body: a literal, or the symbolic size read at run time."""
    return ops.index_expr(n, dtype) if isinstance(n, Expr) else ops.constant(float(n), dtype)


def _div(x, divisor, dtype, node):
    load = x.loader()
    cdt = compute_dtype(dtype)

    def body(ops, idx):
        v = ops.to_dtype(load(ops, idx), cdt)
        return ops.to_dtype(ops.pointwise("truediv", v, _number(ops, divisor, cdt), dtype=cdt), dtype)
    return Lazy(dtype, x.device, tuple(x.size), body, [node.name] if node is not None else [])
