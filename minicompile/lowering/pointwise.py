"""Elementwise ATen ops -> lazy loop bodies. One registry line per simple op."""
from __future__ import annotations

import torch

from minicompile.ir.nodes import Lazy, TensorValue
from minicompile.ir.ops import compute_dtype
from minicompile.lowering.registry import Unsupported, aten, register_lowering


def out_meta(node):
    return node.meta["val"]


def broadcast_loader(value, out_size):
    """A loader for ``value`` read at an index of ``out_size`` (right-aligned broadcasting)."""
    if not isinstance(value, TensorValue):
        return None
    load, size = value.loader(), tuple(value.size)
    if size == tuple(out_size):
        return load
    lead = len(out_size) - len(size)

    def broadcast(ops, index):
        inner = [0 if s == 1 and out_size[lead + k] != 1 else index[lead + k] for k, s in enumerate(size)]
        return load(ops, inner)
    return broadcast


def make_pointwise(op: str, *, compare: bool = False, operand_dtype=None):
    """Build a lowering that applies ``ops.pointwise(op, ...)`` to broadcast operands.

    Operands are cast to the compute dtype of the result (bf16/fp16 compute in fp32), or for
    comparisons and logical ops to the promoted operand dtype.
    """
    def lower(lw, node, *args, **kwargs):
        meta = out_meta(node)
        size = tuple(meta.shape)
        if compare:
            cdtype = compute_dtype(_promote_all(node, args))
        else:
            cdtype = compute_dtype(operand_dtype or meta.dtype)
        loaders = [broadcast_loader(a, size) for a in args]
        out_dtype = compute_dtype(meta.dtype)

        def body(ops, index):
            vals = []
            for k, (a, ld) in enumerate(zip(args, loaders)):
                if ld is not None:
                    v = ld(ops, index)
                    keep = compute_dtype(a.dtype) == cdtype or (op == "where" and k == 0)  # the condition stays bool
                    vals.append(v if keep else ops.to_dtype(v, cdtype))
                else:
                    vals.append(ops.constant(a, cdtype))
            return ops.pointwise(op, *vals, dtype=out_dtype)
        return Lazy(meta.dtype, meta.device, size, body, [node.name])
    return lower


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


UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
         "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
         "acosh", "atanh", "erf", "erfc", "sigmoid", "relu", "floor", "ceil", "round", "trunc",
         "sign", "bitwise_not"]
for _name in UNARY:
    register_lowering(getattr(aten, _name).default)(make_pointwise(_name))
register_lowering(aten.logical_not.default)(make_pointwise("logical_not", compare=True))
register_lowering(aten.isnan.default)(make_pointwise("isnan", compare=True))
register_lowering(aten.isinf.default)(make_pointwise("isinf", compare=True))

for _aten, _name in [("mul", "mul"), ("maximum", "maximum"), ("minimum", "minimum"), ("atan2", "atan2"),
                     ("bitwise_and", "bitwise_and"), ("bitwise_or", "bitwise_or"), ("bitwise_xor", "bitwise_xor")]:
    for _ov in ("Tensor", "Scalar", "default"):
        if hasattr(getattr(aten, _aten), _ov):
            register_lowering(getattr(getattr(aten, _aten), _ov))(make_pointwise(_name))
for _aten in ["eq", "ne", "lt", "le", "gt", "ge"]:
    for _ov in ("Tensor", "Scalar"):
        register_lowering(getattr(getattr(aten, _aten), _ov))(make_pointwise(_aten, compare=True))
for _aten in ["logical_and", "logical_or", "logical_xor"]:
    register_lowering(getattr(aten, _aten).default)(make_pointwise(_aten, compare=True))
register_lowering(aten.where.self)(make_pointwise("where"))
# Dynamo writes addcmul_(..., value=) and add_(..., alpha=tensor) as Inductor's prims.fma; the op
# exists only once Dynamo has imported torch._inductor.inductor_prims, so it is keyed by name.
register_lowering("prims.fma.default")(make_pointwise("fma"))


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


for _op in ("add", "sub"):
    register_lowering([getattr(aten, _op).Tensor, getattr(aten, _op).Scalar])(_add_sub(_op))
register_lowering(aten.rsub.Scalar)(lambda lw, node, a, b, alpha=1: _add_sub("sub")(lw, node, b, a, alpha))


@register_lowering([aten.div.Tensor, aten.div.Scalar])
def div(lw, node, a, b):
    return make_pointwise("truediv")(lw, node, a, b)


def _int_divisor_ok(b):
    if isinstance(b, TensorValue):
        if not b.dtype.is_floating_point:
            # integer division by zero raises in eager; a generated loop cannot raise
            raise Unsupported("integer division by a tensor (eager checks for division by zero)")
    elif b == 0:
        raise Unsupported("integer division by zero")


@register_lowering([aten.div.Tensor_mode, aten.div.Scalar_mode])
def div_mode(lw, node, a, b, *, rounding_mode=None):
    meta = out_meta(node)
    if rounding_mode is None:
        return make_pointwise("truediv")(lw, node, a, b)
    if not meta.dtype.is_floating_point:
        _int_divisor_ok(b)
    name = {"trunc": "truncdiv", "floor": "floordiv"}[rounding_mode]
    return make_pointwise(name)(lw, node, a, b)


def _int_checked(name):
    fn = make_pointwise(name)

    def lower(lw, node, a, b):
        if not out_meta(node).dtype.is_floating_point:
            _int_divisor_ok(b)
        return fn(lw, node, a, b)
    return lower


register_lowering([aten.floor_divide.default, aten.floor_divide.Scalar])(_int_checked("floordiv"))
register_lowering([aten.remainder.Tensor, aten.remainder.Scalar])(_int_checked("remainder"))
register_lowering([aten.fmod.Tensor, aten.fmod.Scalar])(_int_checked("fmod"))


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
    size = tuple(meta.shape)
    cdtype = compute_dtype(meta.dtype)
    loads = [broadcast_loader(v, size) for v in (x, lo, hi)]

    def operand(ops, v, ld, index):
        if ld is not None:
            return ops.to_dtype(ld(ops, index), cdtype)
        return ops.constant(v, cdtype)

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
