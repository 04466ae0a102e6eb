"""Pointwise ops that are a few core ops: addcmul, addcdiv, masked_fill, lerp, rsub,
and pow with the exponents eager itself special-cases (2 -> x*x, 3 -> x*x*x, -2 -> 1/(x*x),
-1 -> 1/x, 0.5 -> sqrt, -0.5 -> rsqrt).
"""
from __future__ import annotations

import torch

from minicompile.decomp.precision import LOW_PRECISION, scalar_like, to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


def _common_opmath(*tensors):
    """Promote like eager, then compute bf16/fp16 in float32; returns (inputs, result dtype)."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    compute = torch.float32 if dtype in LOW_PRECISION else dtype
    return [to_dtype(t, compute) for t in tensors], dtype


@register_decomposition(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    (s, t1, t2), dtype = _common_opmath(self, tensor1, tensor2)
    # Eager evaluates self + (value * t1) * t2 in this order.
    product = aten.mul.Tensor(aten.mul.Scalar(t1, value), t2)
    return to_dtype(aten.add.Tensor(s, product), dtype)


@register_decomposition(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    (s, t1, t2), dtype = _common_opmath(self, tensor1, tensor2)
    if not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported; use "
            "(input + value * trunc(tensor1 / tensor2)) for integer inputs"
        )
    quotient = aten.div.Tensor(aten.mul.Scalar(t1, value), t2)
    return to_dtype(aten.add.Tensor(s, quotient), dtype)


@register_decomposition(aten.masked_fill.Scalar)
def masked_fill_scalar(self, mask, value):
    return aten.where.self(mask, scalar_like(value, self), self)


@register_decomposition(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    return aten.where.self(mask, to_dtype(value, self.dtype), self)


def _mul(t, w):
    return aten.mul.Tensor(t, w) if isinstance(w, torch.Tensor) else aten.mul.Scalar(t, w)


def _lerp(start, end, weight, one_minus_weight, weight_is_small):
    # Eager's two-sided formula, exact at weight 0 and at weight 1:
    # |w| < 0.5 ? start + w * (end - start) : end - (end - start) * (1 - w)
    diff = aten.sub.Tensor(end, start)
    near_start = aten.add.Tensor(start, _mul(diff, weight))
    near_end = aten.sub.Tensor(end, _mul(diff, one_minus_weight))
    if isinstance(weight_is_small, bool):
        return near_start if weight_is_small else near_end
    return aten.where.self(weight_is_small, near_start, near_end)


@register_decomposition(aten.lerp.Scalar)
def lerp_scalar(start, end, weight):
    return to_dtype(_lerp(upcast(start), upcast(end), weight, 1 - weight, abs(weight) < 0.5), start.dtype)


@register_decomposition(aten.lerp.Tensor)
def lerp_tensor(start, end, weight):
    w = upcast(weight)
    small = aten.lt.Scalar(aten.abs.default(w), 0.5)
    one_minus = aten.add.Scalar(aten.neg.default(w), 1)
    return to_dtype(_lerp(upcast(start), upcast(end), w, one_minus, small), start.dtype)


@register_decomposition(aten.rsub.Scalar)
def rsub_scalar(self, other, alpha=1):
    scaled = aten.neg.default(self) if alpha == 1 else aten.mul.Scalar(self, -alpha)
    return aten.add.Scalar(scaled, other)


@register_decomposition(aten.rsub.Tensor)
def rsub_tensor(self, other, alpha=1):
    return aten.sub.Tensor(other, self, alpha=alpha)


# pow(x, n) that eager computes as products, bit for bit (float16 rounds otherwise there)
_POW_AS_PRODUCTS = (torch.float32, torch.float64, torch.bfloat16)
_POW_AS_PRODUCTS_OF = {
    3: lambda x: aten.mul.Tensor(aten.mul.Tensor(x, x), x),
    -2: lambda x: aten.reciprocal.default(aten.mul.Tensor(x, x)),
    -1: aten.reciprocal.default,
}


@register_decomposition(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(self, exponent):
    if torch.result_type(self, exponent) != self.dtype:
        return NotImplemented  # e.g. int tensor ** 2.0 promotes: leave it to pow
    if exponent == 2:
        return aten.mul.Tensor(self, self)
    if self.dtype in _POW_AS_PRODUCTS and exponent in (3, -2, -1):
        # eager's own products for these (GPT-2's gelu_new cubes x; std::pow there ran 25x slower)
        return _POW_AS_PRODUCTS_OF[exponent](self)
    if self.is_floating_point() and exponent == 0.5:
        return aten.sqrt.default(self)
    if self.is_floating_point() and exponent == -0.5:
        return aten.rsqrt.default(self)
    return NotImplemented  # pow itself is a core op
