"""Backward ops, as autograd's formulas emit them into a joint forward/backward trace.

Each is the derivative of a forward decomposition in this package, written in core ops so
backward kernels fuse like forward ones (aot/joint.py traces them). Low-precision inputs are
computed in float32 and rounded once, as eager's backward kernels do.
"""
from __future__ import annotations

import math

import torch

from minicompile.decomp.precision import fill_where, opmath_dtype, to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return fill_where(aten.le.Scalar(self, threshold), 0, grad_output)


@register_decomposition(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    gy = aten.mul.Tensor(g, y)
    grad = aten.sub.Tensor(gy, aten.mul.Tensor(y, aten.sum.dim_IntList(gy, [dim], True)))
    return to_dtype(grad, input_dtype)


@register_decomposition(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    grad = aten.sub.Tensor(g, aten.mul.Tensor(aten.exp.default(y), aten.sum.dim_IntList(g, [dim], True)))
    return to_dtype(grad, input_dtype)


def _gelu_derivative(x, approximate):
    """d gelu(x) / dx for the exact (erf) and tanh forms."""
    if approximate == "tanh":
        beta, kappa = math.sqrt(2 / math.pi), 0.044715
        x_sq = aten.mul.Tensor(x, x)
        inner = aten.mul.Scalar(aten.add.Tensor(x, aten.mul.Scalar(aten.mul.Tensor(x_sq, x), kappa)), beta)
        t = aten.tanh.default(inner)
        left = aten.mul.Scalar(aten.add.Scalar(t, 1), 0.5)
        d_inner = aten.mul.Scalar(aten.add.Scalar(aten.mul.Scalar(x_sq, 3 * kappa), 1), beta)
        right = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Scalar(x, 0.5), aten.rsub.Scalar(aten.mul.Tensor(t, t), 1)),
                                d_inner)
        return aten.add.Tensor(left, right)
    cdf = aten.mul.Scalar(aten.add.Scalar(aten.erf.default(aten.mul.Scalar(x, math.sqrt(0.5))), 1), 0.5)
    pdf = aten.mul.Scalar(aten.exp.default(aten.mul.Scalar(aten.mul.Tensor(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return aten.add.Tensor(cdf, aten.mul.Tensor(x, pdf))


@register_decomposition(aten.gelu_backward.default)
def gelu_backward(grad_output, self, approximate="none"):
    grad = aten.mul.Tensor(upcast(grad_output), _gelu_derivative(upcast(self), approximate))
    return to_dtype(grad, grad_output.dtype)


@register_decomposition(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    y = upcast(output)
    return to_dtype(aten.mul.Tensor(upcast(grad_output), aten.rsub.Scalar(aten.mul.Tensor(y, y), 1)), grad_output.dtype)


@register_decomposition(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    y = upcast(output)
    grad = aten.mul.Tensor(upcast(grad_output), aten.mul.Tensor(y, aten.rsub.Scalar(y, 1)))
    return to_dtype(grad, grad_output.dtype)


@register_decomposition(aten.silu_backward.default)
def silu_backward(grad_output, self):
    x = upcast(self)
    s = aten.sigmoid.default(x)
    d = aten.mul.Tensor(s, aten.add.Scalar(aten.mul.Tensor(x, aten.rsub.Scalar(s, 1)), 1))
    return to_dtype(aten.mul.Tensor(upcast(grad_output), d), grad_output.dtype)


@register_decomposition(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """grad_input = rstd / N * (N * g - sum(g) - x_hat * sum(g * x_hat)), g = grad_out * weight,
    summed over the normalized dims; weight and bias grads sum over the leading dims."""
    axis = input.dim() - len(normalized_shape)
    inner, outer = list(range(axis, input.dim())), list(range(axis))
    n = math.prod(input.shape[axis:])
    compute = opmath_dtype(input.dtype)
    dy = upcast(grad_out)
    x_hat = aten.mul.Tensor(aten.sub.Tensor(upcast(input), to_dtype(mean, compute)), to_dtype(rstd, compute))
    g = dy if weight is None else aten.mul.Tensor(dy, upcast(weight))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        sum_g = aten.sum.dim_IntList(g, inner, True)
        sum_gx = aten.sum.dim_IntList(aten.mul.Tensor(g, x_hat), inner, True)
        centered = aten.sub.Tensor(aten.sub.Tensor(aten.mul.Scalar(g, n), sum_g), aten.mul.Tensor(x_hat, sum_gx))
        grad_input = to_dtype(aten.mul.Tensor(aten.div.Scalar(to_dtype(rstd, compute), n), centered), input.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = to_dtype(_sum_leading(aten.mul.Tensor(dy, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = to_dtype(_sum_leading(dy, outer), bias.dtype)
    return grad_input, grad_weight, grad_bias


def _sum_leading(x, dims):
    return aten.sum.dim_IntList(x, dims, False) if dims else aten.clone.default(x)
