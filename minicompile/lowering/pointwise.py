"""Elementwise ATen ops -> lazy loop bodies.

One loop registers every row of ``ir.ops.POINTWISE_OPS`` for all of its ATen overloads; add and
sub (alpha), div's rounding modes, pow and clamp are the few with a lowering of their own.
"""
from __future__ import annotations

import operator

import torch

from minicompile.ir.expr import Expr, NotSymbolic
from minicompile.ir.nodes import Lazy, TensorValue, shape_of
from minicompile.ir.ops import POINTWISE_OPS, aten_overloads, compute_dtype
from minicompile.lowering.registry import Unsupported, aten, register_lowering


def out_meta(node):
    return node.meta["val"]


def broadcast_loader(value, out_size, same=operator.eq):
    """A loader for ``value`` read at an index of ``out_size`` (right-aligned broadcasting);
    ``same(a, b)``: sizes known equal (``GraphLowering.same_size``, which knows run-time checks)."""
    if not isinstance(value, TensorValue):
        return None
    load, size = value.loader(), tuple(value.size)
    if size == tuple(out_size):
        return load
    lead = len(out_size) - len(size)
    spread = broadcast_dims(size, out_size, same)

    def broadcast(ops, index):
        return load(ops, [0 if b else index[lead + k] for k, b in enumerate(spread)])
    return broadcast


def broadcast_dims(size, out_size, same=operator.eq) -> list[bool]:
    """Which dims of ``size`` (right-aligned) are broadcast to ``out_size``: those of size 1
    under a larger size. A symbolic size that is neither 1 nor the output's size (``s0 // 3``
    under ``s0``: it broadcast at the traced size because it was 1 there) cannot be told
    apart from an equal size written differently, so it is not compiled symbolically; unless
    ``same`` knows them equal: two data-dependent sizes (``u5`` of ``v[:k]``, ``u3`` of a
    nonzero) that the graph checks equal at run time (``_assert_scalar(Eq(u5, u3))``, which
    torch's broadcasting adds) are equal in every run that gets past the check."""
    lead = len(out_size) - len(size)
    spread = []
    for k, s in enumerate(size):
        out = out_size[lead + k]
        if same(s, out):
            spread.append(False)
            continue
        if s != 1 and not (isinstance(s, int) and isinstance(out, int)):
            raise NotSymbolic(f"size {s} broadcast to {out}: equal or 1 depends on the sizes")
        spread.append(s == 1 and out != 1)
    return spread


def make_pointwise(op: str):
    """Build a lowering that applies ``ops.pointwise(op, ...)`` to broadcast operands.

    Operands are cast to the compute dtype of the result (bf16/fp16 compute in fp32), or for
    ops with a bool result (comparisons, logical ops, isnan) to the promoted operand dtype.
    Integer division by a tensor or by zero stays extern: eager raises there, a loop cannot.
    """
    row = POINTWISE_OPS[op]

    def lower(lw, node, *args, **kwargs):
        meta = out_meta(node)
        size = shape_of(meta)
        if row.int_div and not meta.dtype.is_floating_point:
            _int_divisor_ok(args[1])
        cdtype = compute_dtype(_promote_all(node, args) if row.bool_result else meta.dtype)
        loaders = [broadcast_loader(a, size, lw.same_size) for a in args]
        out_dtype = compute_dtype(meta.dtype)

        def body(ops, index):
            vals = []
            for k, (a, ld) in enumerate(zip(args, loaders)):
                if ld is not None:
                    v = ld(ops, index)
                    keep = compute_dtype(a.dtype) == cdtype or (op == "where" and k == 0)  # the condition stays bool
                    vals.append(v if keep else ops.to_dtype(v, cdtype))
                else:   # a symbolic size (``arange(n) + s0``) is read in the loop body
                    vals.append(ops.index_expr(a, cdtype) if isinstance(a, Expr) else ops.constant(a, cdtype))
            return ops.pointwise(op, *vals, dtype=out_dtype)
        return Lazy(meta.dtype, meta.device, size, body, [node.name])
    return lower


def _int_divisor_ok(b):
    if isinstance(b, TensorValue):
        if not b.dtype.is_floating_point:
            # integer division by zero raises in eager; a generated loop cannot raise
            raise Unsupported("integer division by a tensor (eager checks for division by zero)")
    elif b == 0:
        raise Unsupported("integer division by zero")


def _promote_all(node, args):
    tensors = [n.meta["val"] for a, n in zip(args, node.args) if isinstance(a, TensorValue)]
    scalars = [a for a in args if isinstance(a, (bool, int, float))]
    dims = [t for t in tensors if t.dim() > 0]
    zero_dim = [t for t in tensors if t.dim() == 0]
    # torch: dimensioned tensors > zero-dim tensors > python scalars, by category
    probe = [torch.empty((1,), dtype=t.dtype, device="meta") for t in dims]
    probe += [torch.empty((), dtype=t.dtype, device="meta") for t in zero_dim]
    res = probe[0].dtype if probe else None
    acc = probe[0] if probe else None
    for p in probe[1:]:
        res = torch.result_type(acc, p)
        acc = torch.empty((1,) if acc.dim() or p.dim() else (), dtype=res, device="meta")
    for s in scalars:
        if acc is None:
            acc = torch.tensor(s).to("meta")
            res = acc.dtype
        else:
            res = torch.result_type(acc, s)
            acc = torch.empty(acc.shape, dtype=res, device="meta")
    return res


for _name in POINTWISE_OPS:
    register_lowering(aten_overloads(_name))(make_pointwise(_name))


def _add_sub(op):
    plain = make_pointwise(op)

    def lower(lw, node, a, b, alpha=1):
        if alpha == 1:
            return plain(lw, node, a, b)
        if isinstance(b, TensorValue):
            meta = out_meta(node)
            cdtype = compute_dtype(meta.dtype)
            load_b = b.loader()
            scaled_b = Lazy(meta.dtype, b.device, b.size,
                            lambda ops, idx: ops.pointwise("mul", ops.to_dtype(load_b(ops, idx), cdtype),
                                                           ops.constant(alpha, cdtype), dtype=cdtype))
            return plain(lw, node, a, scaled_b)
        return plain(lw, node, a, b * alpha)
    return lower


register_lowering([aten.add.Tensor, aten.add.Scalar])(_add_sub("add"))
register_lowering([aten.sub.Tensor, aten.sub.Scalar])(_add_sub("sub"))
register_lowering(aten.rsub.Scalar)(lambda lw, node, a, b, alpha=1: _add_sub("sub")(lw, node, b, a, alpha))


@register_lowering([aten.div.Tensor_mode, aten.div.Scalar_mode])
def div_mode(lw, node, a, b, *, rounding_mode=None):
    name = {None: "truediv", "trunc": "truncdiv", "floor": "floordiv"}[rounding_mode]
    return make_pointwise(name)(lw, node, a, b)


@register_lowering([aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar])
def pow_(lw, node, a, b):
    meta = out_meta(node)
    if not meta.dtype.is_floating_point:
        raise Unsupported("integer pow (eager's exact integer power)")
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b == 2:
        return make_pointwise("square")(lw, node, a)
    return make_pointwise("pow")(lw, node, a, b)


def _clamp(lw, node, x, lo=None, hi=None):
    meta = out_meta(node)
    size = shape_of(meta)
    cdtype = compute_dtype(meta.dtype)
    loads = [broadcast_loader(v, size, lw.same_size) for v in (x, lo, hi)]

    def operand(ops, v, ld, index):
        if ld is not None:
            return ops.to_dtype(ld(ops, index), cdtype)
        # a symbolic bound (bilinear upsampling clamps a source index to s0 - 1) is read in the body
        return ops.index_expr(v, cdtype) if isinstance(v, Expr) else ops.constant(v, cdtype)

    def body(ops, index):
        out = operand(ops, x, loads[0], index)
        if lo is not None:
            out = ops.pointwise("maximum", out, operand(ops, lo, loads[1], index), dtype=cdtype)
        if hi is not None:
            out = ops.pointwise("minimum", out, operand(ops, hi, loads[2], index), dtype=cdtype)
        return out
    return Lazy(meta.dtype, meta.device, size, body, [node.name])


register_lowering([aten.clamp.default, aten.clamp.Tensor])(_clamp)
register_lowering([aten.clamp_min.default, aten.clamp_min.Tensor])(lambda lw, node, x, lo: _clamp(lw, node, x, lo, None))
register_lowering([aten.clamp_max.default, aten.clamp_max.Tensor])(lambda lw, node, x, hi: _clamp(lw, node, x, None, hi))
