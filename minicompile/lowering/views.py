"""Views as index math: no copies.

Each view op is a function from the view's index to its base's index. On a buffer the
composed index is evaluated symbolically; when it comes out linear the view is just new
strides and an offset on the same memory (a StorageView), exactly as eager would alias it.
On a lazy value the map is applied inside the loop body (a ReindexView).
"""
from __future__ import annotations

from minicompile.ir.expr import Expr, NotSymbolic, Prod, Sym, Var, make_vars, size_value, symbols_of
from minicompile.ir.nodes import (ExternKernel, InputBuffer, Lazy, MultiOutput, ReindexView, ScalarRef, StorageView,
                                  TensorValue, contiguous_strides, is_static, prod, shape_of, sym_value)
from minicompile.lowering.pointwise import broadcast_dims
from minicompile.lowering.registry import Unsupported, aten, register_lowering


def make_view(base: TensorValue, size, reindex) -> TensorValue:
    size = tuple(size_value(s) for s in size)
    if not is_static(size):  # raises NotSymbolic now, not in the scheduler, when a division is unprovable
        # (not an extern view: the wrapper's memory reuse does not know an extern's result may alias)
        reindex([Expr.of(v) for v in make_vars("v", size)])
    if isinstance(base, StorageView):
        strided = _as_strides(base, size, reindex)
        if strided is not None:
            return strided
    return ReindexView(base, size, reindex)


def _as_strides(base: StorageView, size, reindex):
    variables = make_vars("v", size)
    flat = Expr.of(base.offset)
    for i, st in zip(reindex([Expr.of(v) for v in variables]), base.stride):
        flat = flat + Expr.of(i) * st
    strides, offset = {}, Expr.of(flat.const)
    for a, c in flat.terms:  # c*v, or c*v*s0*... where a stride is symbolic, or a symbolic offset
        factors = a.factors if isinstance(a, Prod) else (a,)
        loop_vars = [f for f in factors if isinstance(f, Var)]
        if not all(isinstance(f, (Var, Sym)) for f in factors) or len(loop_vars) > 1:
            return None
        term = Expr.of(c)
        for f in factors:
            term = term * Expr.of(f) if f not in loop_vars else term
        if loop_vars:
            strides[loop_vars[0]] = strides.get(loop_vars[0], 0) + term
        else:
            offset = offset + term
    stride = tuple(size_value(strides.get(v, 0)) for v in variables)
    return StorageView(base.buffer, size, stride, size_value(offset))


def _dim(d, ndim):
    return d + ndim if d < 0 else d


def _identity(lw, node, x, *args, **kwargs):
    return x


register_lowering([aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default])(_identity)


@register_lowering(aten.permute.default)
def permute(lw, node, x, dims):
    dims = [_dim(d, len(x.size)) for d in dims]
    size = [x.size[d] for d in dims]
    inverse = [dims.index(k) for k in range(len(dims))]
    return make_view(x, size, lambda idx: [idx[inverse[k]] for k in range(len(dims))])


@register_lowering(aten.transpose.int)
def transpose(lw, node, x, d0, d1):
    n = len(x.size)
    dims = list(range(n))
    if n:
        d0, d1 = _dim(d0, n), _dim(d1, n)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(lw, node, x, dims)


@register_lowering(aten.t.default)
def t(lw, node, x):
    return transpose(lw, node, x, 0, 1) if len(x.size) == 2 else x


@register_lowering(aten.expand.default)
def expand(lw, node, x, size, implicit=False):
    size = shape_of(node.meta["val"])
    lead = len(size) - len(x.size)
    spread = broadcast_dims(tuple(x.size), size, lw.same_size)
    return make_view(x, size, lambda idx: [0 if b else idx[lead + k] for k, b in enumerate(spread)])


@register_lowering(aten.unsqueeze.default)
def unsqueeze(lw, node, x, dim):
    dim = _dim(dim, len(x.size) + 1)
    size = list(x.size)
    size.insert(dim, 1)
    return make_view(x, size, lambda idx: idx[:dim] + idx[dim + 1:])


@register_lowering([aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims])
def squeeze(lw, node, x, dims=None):
    n = len(x.size)
    if dims is None:
        dims = range(n)
    elif isinstance(dims, int):
        dims = [dims]
    drop = {_dim(d, n) for d in dims if n and x.size[_dim(d, n)] == 1}
    keep = [k for k in range(n) if k not in drop]
    size = [x.size[k] for k in keep]

    def reindex(idx):
        out = [Expr.of(0)] * n
        for j, k in enumerate(keep):
            out[k] = idx[j]
        return out
    return make_view(x, size, reindex)


@register_lowering(aten.slice.Tensor)
def slice_(lw, node, x, dim=0, start=None, end=None, step=1):
    if any(_from_data(b) for b in (start, end)):
        # a bound read from data (x[:k], k from .item()): tracing may have replaced the length by
        # the size it was broadcast against (seed 500766: k = 1 read as n); eagerly, the result's
        # size is checked against the compiled one (the wrapper's conform)
        raise Unsupported("a slice bound read from data (its length is checked at run time)")
    dim = _dim(dim, len(x.size))
    length = node.meta["val"].shape[dim]
    start = _clip_start(start, x.size[dim])
    size = list(x.size)
    size[dim] = size_value(sym_value(length))
    return make_view(x, size, lambda idx: idx[:dim] + [Expr.of(idx[dim]) * step + start] + idx[dim + 1:])


def _from_data(bound) -> bool:
    """A number the graph reads from data: an unbacked symbol (torch names them u0, u1, ...)."""
    return isinstance(bound, ScalarRef) or (isinstance(bound, Expr)
                                            and any(sym.name.startswith("u") for sym in symbols_of(bound)))


def _clip_start(start, n):
    if start is None:
        return 0
    if start < 0:
        start += n
    if isinstance(n, Expr) or isinstance(start, Expr):
        # Symbolic: a start past n leaves an empty slice, whose length Dynamo's guards fix, so
        # only a start that may be negative (n - 3 with n = 2) needs the clip, which is no polynomial
        if Expr.of(start).range()[0] < 0:
            raise NotSymbolic(f"a slice start {start} that is negative for some sizes")
        return size_value(Expr.of(start))
    return min(max(start, 0), n)


@register_lowering(aten.select.int)
def select(lw, node, x, dim, index):
    dim = _dim(dim, len(x.size))
    if index < 0:
        index += x.size[dim]
    size = list(x.size[:dim]) + list(x.size[dim + 1:])
    return make_view(x, size, lambda idx: idx[:dim] + [Expr.of(index)] + idx[dim:])


@register_lowering([aten.view.default, aten._unsafe_view.default, aten.reshape.default])
def view(lw, node, x, size):
    return reshape(x, shape_of(node.meta["val"]))


def reshape(x, new: tuple):
    """``x`` viewed as ``new`` (same number of elements), row-major."""
    old = tuple(x.size)
    if new == old:
        return x
    new_strides, old_strides = contiguous_strides(new), contiguous_strides(old)
    if prod(old) == 0:
        return make_view(x, new, lambda idx: [Expr.of(0)] * len(old))  # nothing is ever read

    def reindex(idx):
        flat = Expr.of(0)
        for i, st in zip(idx, new_strides):
            flat = flat + Expr.of(i) * st
        # (the outermost index needs no modulo: flat < numel; a symbolic one must not have it)
        return [flat // st if k == 0 and not is_static([s]) else (flat // st) % s
                for k, (st, s) in enumerate(zip(old_strides, old))]
    return make_view(x, new, reindex)


@register_lowering([aten.split.Tensor, aten.split_with_sizes.default])
def split(lw, node, x, sizes, dim=0):
    dim = _dim(dim, len(x.size))
    outs, start = [], 0
    for meta in node.meta["val"]:
        length = sym_value(meta.shape[dim])
        size = list(x.size)
        size[dim] = length
        outs.append(make_view(x, size, _shift(dim, start)))
        start += length
    return outs


def _shift(dim, start):
    return lambda idx: idx[:dim] + [Expr.of(idx[dim]) + start] + idx[dim + 1:]


@register_lowering(aten.unbind.int)
def unbind(lw, node, x, dim=0):
    dim = _dim(dim, len(x.size))
    size = list(x.size[:dim]) + list(x.size[dim + 1:])
    return [make_view(x, size, _pick(dim, k)) for k in range(x.size[dim])]


def _pick(dim, k):
    return lambda idx: idx[:dim] + [Expr.of(k)] + idx[dim:]


@register_lowering(aten.as_strided.default)
def as_strided(lw, node, x, size, stride, storage_offset=None):
    x = lw.storage_view(x, node.args[0])  # eager's storage of x (and of the values x views)
    if isinstance(x.buffer, (InputBuffer, ExternKernel, MultiOutput)):
        # as_strided counts from the start of the storage, but kernels see a graph input or an
        # extern's result from its data_ptr: where its storage starts is known only at run time
        # (as_strided_scatter returns its input's whole storage, its result at the input's offset)
        what = "a graph input" if isinstance(x.buffer, InputBuffer) else "an extern call's result"
        raise Unsupported(f"as_strided of {what} (its storage offset is known only at run time)")
    # x.offset is where eager's x starts, counted from the buffer's start
    offset = x.offset if storage_offset is None else \
        Expr.of(x.offset) + sym_value(storage_offset) - sym_value(node.args[0].meta["val"].storage_offset())
    return StorageView(x.buffer, tuple(size_value(sym_value(s)) for s in size),
                       tuple(size_value(sym_value(s)) for s in stride), size_value(offset))


@register_lowering([aten.clone.default, aten.contiguous.default])
def clone(lw, node, x, memory_format=None):
    # A copy: later mutation of the source must not show through, so it is a new value.
    load = x.loader()
    return Lazy(x.dtype, x.device, tuple(x.size), lambda ops, idx: load(ops, idx), [node.name])


def numel(value) -> int:
    return prod(value.size)


__all__ = ["make_view", "Unsupported"]
