"""Normalisation layers: layer norm, RMS norm, batch norm (eval, and train with its running statistics).

All of them compute bf16/fp16 inputs in float32 like eager's kernels and cast back.
"""
from __future__ import annotations

import torch

from minicompile.decomp.precision import opmath_dtype, to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


def _trailing_dims(x, normalized_shape):
    return list(range(x.dim() - len(normalized_shape), x.dim()))


@register_decomposition(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    dims = _trailing_dims(input, normalized_shape)
    x = upcast(input)
    var, mean = aten.var_mean.correction(x, dims, correction=0, keepdim=True)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    # The saved mean/rstd come back in the input dtype on CPU, in float32 elsewhere.
    stats_dtype = input.dtype if input.device.type == "cpu" else opmath_dtype(input.dtype)
    # eager's kernel writes a fresh contiguous output whatever the input's strides
    out = aten.clone.default(to_dtype(out, input.dtype), memory_format=torch.contiguous_format)
    return out, to_dtype(mean, stats_dtype), to_dtype(rstd, stats_dtype)


def _rms_norm(input, normalized_shape, weight, eps):
    dims = _trailing_dims(input, normalized_shape)
    x = upcast(input)
    if eps is None:
        # Eager's default is the epsilon of the compute dtype (float32 for bf16 input).
        eps = torch.finfo(x.dtype).eps
    mean_sq = aten.mean.dim(aten.mul.Tensor(x, x), dims, True)
    rstd = aten.rsqrt.default(aten.add.Scalar(mean_sq, eps))
    out = aten.mul.Tensor(x, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    return to_dtype(out, input.dtype), rstd


@register_decomposition(aten.rms_norm.default)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    return _rms_norm(input, normalized_shape, weight, eps)[0]


@register_decomposition(aten._fused_rms_norm.default)
def fused_rms_norm(input, normalized_shape, weight, eps):
    return _rms_norm(input, normalized_shape, weight, eps)


def _suggested_memory_format(x) -> torch.memory_format:
    """Channels-last (2d or 3d) for a tensor laid out that way and not also contiguous, else contiguous."""
    for dim, layout in ((4, torch.channels_last), (5, torch.channels_last_3d)):
        if x.dim() == dim and x.is_contiguous(memory_format=layout) and not x.is_contiguous():
            return layout
    return torch.contiguous_format


def _channel_view(t, input, compute):
    return aten.view.default(to_dtype(t, compute), [1, input.shape[1]] + [1] * (input.dim() - 2))


def _in_suggested_layout(out, input):
    """Eager's kernel allocates its output in the input's suggested memory format (contiguous or
    channels-last), not with the strides elementwise ops would give a permuted input."""
    layout = _suggested_memory_format(input)
    if not out.is_contiguous(memory_format=layout):
        out = aten.clone.default(out, memory_format=layout)
    return to_dtype(out, input.dtype)


def _batch_norm_eval(input, weight, bias, running_mean, running_var, eps):
    # Fold the per-channel statistics into one scale and shift, as eager's CPU kernel
    # does: out = x * (w / sqrt(var + eps)) + (b - mean * w / sqrt(var + eps)).
    compute = opmath_dtype(input.dtype)
    scale = aten.rsqrt.default(aten.add.Scalar(to_dtype(running_var, compute), eps))
    if weight is not None:
        scale = aten.mul.Tensor(scale, to_dtype(weight, compute))
    shift = aten.neg.default(aten.mul.Tensor(to_dtype(running_mean, compute), scale))
    if bias is not None:
        shift = aten.add.Tensor(shift, to_dtype(bias, compute))
    out = aten.add.Tensor(aten.mul.Tensor(upcast(input), _channel_view(scale, input, compute)),
                          _channel_view(shift, input, compute))
    # No statistics are saved in eval mode: eager returns two empty tensors, typed like
    # the running statistics.
    def empty():
        return aten.empty.memory_format([0], dtype=running_mean.dtype, device=input.device)

    return _in_suggested_layout(out, input), empty(), empty()


def _batch_norm_train(input, weight, bias, running_mean, running_var, momentum, eps):
    """Normalise by the batch's statistics (every dim but the channel one). Returns the output,
    the saved mean and inverse std (for backward, per channel, in the compute dtype) and the new
    running statistics, None when not tracked: ``(1 - momentum) * old + momentum * batch``, the
    variance unbiased (n / (n - 1)), as eager's kernel updates them."""
    compute = opmath_dtype(input.dtype)
    channels, n = input.shape[1], input.numel() // max(input.shape[1], 1)
    var, mean = aten.var_mean.correction(upcast(input), [0] + list(range(2, input.dim())), correction=0,
                                         keepdim=True)
    invstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(upcast(input), mean), invstd)
    if weight is not None:
        out = aten.mul.Tensor(out, _channel_view(weight, input, compute))
    if bias is not None:
        out = aten.add.Tensor(out, _channel_view(bias, input, compute))
    mean, invstd, var = (aten.view.default(t, [channels]) for t in (mean, invstd, var))
    running = [None, None]
    for k, (old, batch) in enumerate(((running_mean, mean), (running_var, aten.mul.Scalar(var, n / max(n - 1, 1))))):
        if old is not None:
            new = aten.add.Tensor(aten.mul.Scalar(batch, momentum), aten.mul.Scalar(to_dtype(old, compute), 1 - momentum))
            running[k] = to_dtype(new, old.dtype)
    return _in_suggested_layout(out, input), mean, invstd, *running


def _batch_norm_train_in_place(input, weight, bias, running_mean, running_var, momentum, eps):
    """The ops that update the running statistics in place: the update is a ``copy_`` into them,
    which the trace functionalizes (an input write-back, aot/trace.py and aot/joint.py)."""
    out, mean, invstd, new_mean, new_var = _batch_norm_train(input, weight, bias, running_mean, running_var,
                                                             momentum, eps)
    for old, new in ((running_mean, new_mean), (running_var, new_var)):
        if old is not None:
            aten.copy_.default(old, new)
    return out, mean, invstd


@register_decomposition(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@register_decomposition(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        return _batch_norm_train_in_place(input, weight, bias, running_mean, running_var, momentum, eps)
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@register_decomposition(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """What functionalization turns _native_batch_norm_legit into: the running stats come
    back as outputs (unchanged in eval) instead of being updated in place."""
    if training:
        return _batch_norm_train(input, weight, bias, running_mean, running_var, momentum, eps)
    out, save_mean, save_rstd = _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
    return out, save_mean, save_rstd, aten.clone.default(running_mean), aten.clone.default(running_var)


@register_decomposition(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        return _batch_norm_train_in_place(input, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is None or running_var is None:
        return NotImplemented  # eval mode without statistics: eager raises, let it
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
