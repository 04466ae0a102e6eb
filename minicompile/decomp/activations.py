"""Activation functions and softmax, in terms of core pointwise ops and reductions.

Transcendental activations upcast bf16/fp16 to float32 and round once, like eager's
vectorised CPU kernels; piecewise-linear ones (hardtanh, leaky_relu) need no upcast since
each output is a single rounded operation either way.
"""
from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

from minicompile.decomp.precision import fill_where, to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


def _in_opmath(fn):
    """Run fn on the input upcast to float32 (for bf16/fp16) and cast the result back."""

    def wrapper(x, *args, **kwargs):
        return to_dtype(fn(upcast(x), *args, **kwargs), x.dtype)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@register_decomposition(aten.gelu.default)
@_in_opmath
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        inner = aten.mul.Scalar(
            aten.add.Tensor(x, aten.mul.Scalar(aten.mul.Tensor(aten.mul.Tensor(x, x), x), 0.044715)),
            math.sqrt(2.0 / math.pi),
        )
        cdf = aten.add.Scalar(aten.tanh.default(inner), 1.0)
    else:
        cdf = aten.add.Scalar(aten.erf.default(aten.mul.Scalar(x, 1.0 / math.sqrt(2.0))), 1.0)
    return aten.mul.Tensor(aten.mul.Scalar(x, 0.5), cdf)


@register_decomposition(aten.silu.default)
@_in_opmath
def silu(x):
    return aten.mul.Tensor(x, aten.sigmoid.default(x))


@register_decomposition(aten.mish.default)
@_in_opmath
def mish(x):
    # Eager's mish has no softplus threshold: tanh(log1p(exp(x))) saturates to 1 anyway.
    return aten.mul.Tensor(x, aten.tanh.default(aten.log1p.default(aten.exp.default(x))))


@register_decomposition(aten.softplus.default)
@_in_opmath
def softplus(x, beta=1, threshold=20):
    scaled = aten.mul.Scalar(x, beta)
    soft = aten.div.Scalar(aten.log1p.default(aten.exp.default(scaled)), beta)
    return aten.where.self(aten.gt.Scalar(scaled, threshold), x, soft)


@register_decomposition(aten.elu.default)
@_in_opmath
def elu(x, alpha=1, scale=1, input_scale=1):
    negative = aten.mul.Scalar(aten.expm1.default(aten.mul.Scalar(x, input_scale)), alpha * scale)
    return aten.where.self(aten.gt.Scalar(x, 0), aten.mul.Scalar(x, scale), negative)


def _relu6_of_x_plus_3(x):
    return aten.clamp.default(aten.add.Scalar(x, 3), 0, 6)


@register_decomposition(aten.hardswish.default)
@_in_opmath
def hardswish(x):
    return aten.div.Scalar(aten.mul.Tensor(x, _relu6_of_x_plus_3(x)), 6)


@register_decomposition(aten.hardsigmoid.default)
@_in_opmath
def hardsigmoid(x):
    return aten.div.Scalar(_relu6_of_x_plus_3(x), 6)


@register_decomposition(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return aten.clamp.default(x, min_val, max_val)


@register_decomposition(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return aten.where.self(aten.gt.Scalar(x, 0), x, aten.mul.Scalar(x, negative_slope))


@register_decomposition(aten._softmax.default)
def softmax(x, dim, half_to_float):
    # Eager computes low-precision softmax in float32; half_to_float keeps that result.
    xf = upcast(x)
    if guard_or_false(x.numel() == 0):  # amax over an empty dim raises; eager returns the empty tensor
        return _like_eager(xf if half_to_float else x)
    if _may_be_empty(x, dim):
        return NotImplemented
    shifted = aten.sub.Tensor(xf, aten.amax.default(xf, [dim], True))
    e = aten.exp.default(shifted)
    out = aten.div.Tensor(e, aten.sum.dim_IntList(e, [dim], True))
    return _like_eager(out if half_to_float else to_dtype(out, x.dtype))


def _may_be_empty(x, dim) -> bool:
    """The reduced dim has a data-dependent size that may be 0 (the rows nonzero() found): the
    amax would raise there, so the op stays eager's (NotImplemented keeps it undecomposed)."""
    return x.dim() > 0 and not statically_known_true(x.shape[dim] != 0)


def _like_eager(out):
    # eager's softmax kernels allocate a contiguous result whatever the input's strides
    return aten.clone.default(out, memory_format=torch.contiguous_format)


@register_decomposition(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    xf = upcast(x)
    if guard_or_false(x.numel() == 0):
        return _like_eager(xf if half_to_float else x)
    if _may_be_empty(x, dim):
        return NotImplemented
    shifted = aten.sub.Tensor(xf, aten.amax.default(xf, [dim], True))
    lse = aten.log.default(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))
    out = aten.sub.Tensor(shifted, lse)
    return _like_eager(out if half_to_float else to_dtype(out, x.dtype))


@register_decomposition(aten._safe_softmax.default)
def safe_softmax(x, dim, dtype=None):
    """softmax that gives 0 (not NaN) on rows that are entirely -inf (sdpa's math path)."""
    src = x if dtype is None else to_dtype(x, dtype)
    out = softmax(src, dim, False)
    fully_masked = aten.all.dim(aten.eq.Scalar(src, float("-inf")), dim, True)
    return fill_where(fully_masked, 0, out)
