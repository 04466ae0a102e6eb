"""Backward ops of whole models in training (CNNs with BatchNorm, HF GPT-2 / BERT / Llama).

Autograd emits these into the joint trace (aot/joint.py): batch norm's backward, the
gradients of slicing and selecting (a zero-padded gradient), nll_loss's (the loss of
cross_entropy) and the fused dropout's. Each is written in core ops so it fuses with its neighbours; what is left
an extern on purpose: ``embedding_dense_backward`` (a scatter-add of rows, which a generated
loop cannot do without atomics) and the fused attention kernels' backward.
"""
from __future__ import annotations

import torch

from minicompile.decomp.losses import REDUCTION_MEAN, REDUCTION_NONE
from minicompile.decomp.precision import opmath_dtype, to_dtype, upcast, where_scalar
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    """With x_hat = (x - mean) * invstd over the batch's statistics (train) or the running ones
    (eval): grad_input = w * invstd * (dy - [train] (sum(dy) + x_hat * sum(dy * x_hat)) / n),
    grad_weight = sum(dy * x_hat), grad_bias = sum(dy), sums over every dim but the channel."""
    compute = opmath_dtype(input.dtype)
    dims = [0] + list(range(2, input.dim()))
    shape = [1, input.shape[1]] + [1] * (input.dim() - 2)

    def per_channel(t):
        return aten.view.default(to_dtype(t, compute), shape)

    if train:
        mean, invstd = per_channel(save_mean), per_channel(save_invstd)
    else:
        mean = per_channel(running_mean)
        invstd = aten.rsqrt.default(aten.add.Scalar(per_channel(running_var), eps))
    dy = upcast(grad_out)
    x_hat = aten.mul.Tensor(aten.sub.Tensor(upcast(input), mean), invstd)
    sum_dy = aten.sum.dim_IntList(dy, dims, True)
    sum_dy_xhat = aten.sum.dim_IntList(aten.mul.Tensor(dy, x_hat), dims, True)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        scale = invstd if weight is None else aten.mul.Tensor(invstd, per_channel(weight))
        centered = dy
        if train:
            n = input.numel() // input.shape[1]
            mean_terms = aten.add.Tensor(sum_dy, aten.mul.Tensor(x_hat, sum_dy_xhat))
            centered = aten.sub.Tensor(dy, aten.div.Scalar(mean_terms, n))
        grad_input = to_dtype(aten.mul.Tensor(centered, scale), input.dtype)
    channels = [input.shape[1]]
    if output_mask[1] and weight is not None:
        grad_weight = to_dtype(aten.view.default(sum_dy_xhat, channels), weight.dtype)
    if output_mask[2]:
        grad_bias = to_dtype(aten.view.default(sum_dy, channels), compute if weight is None else weight.dtype)
    return grad_input, grad_weight, grad_bias


@register_decomposition(aten.slice_backward.default)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    """The gradient of ``x[start:end]`` along ``dim``: zeros around it (a strided slice stays extern)."""
    if step != 1:
        return NotImplemented
    dim = dim % len(input_sizes)
    size = input_sizes[dim]
    start = min(max(start + size if start < 0 else start, 0), size)
    after = size - start - grad_output.shape[dim]
    return _pad_dim(grad_output, dim, start, after)


@register_decomposition(aten.select_backward.default)
def select_backward(grad_output, input_sizes, dim, index):
    dim = dim % len(input_sizes)
    # not index % size: with a symbolic size that is Mod(4, s82), which no index math can take;
    # the forward's select checked 0 <= index (+ size) < size already
    index = index + input_sizes[dim] if index < 0 else index
    return _pad_dim(aten.unsqueeze.default(grad_output, dim), dim, index, input_sizes[dim] - index - 1)


def _pad_dim(x, dim, before, after):
    if any(isinstance(n, torch.SymInt) for n in (*x.shape, before, after)):
        return _pad_dim_symbolic(x, dim, before, after)
    pad = [0, 0] * (x.dim() - 1 - dim) + [before, after]   # constant_pad_nd pads the last dim first
    return aten.constant_pad_nd.default(x, pad, 0)


def _pad_dim_symbolic(x, dim, before, after):
    """With symbolic sizes: zeros, ``x``, zeros concatenated (the C++ constant_pad_nd, which fake
    tensors run, reads the sizes as ints: it would specialise every symbol to the traced size)."""
    pieces = []
    for n in (before, None, after):
        if n is None:
            pieces.append(x)
        elif not (isinstance(n, int) and n == 0):
            shape = [*x.shape[:dim], n, *x.shape[dim + 1:]]
            pieces.append(aten.full.default(shape, 0, dtype=x.dtype, device=x.device))
    return pieces[0] if len(pieces) == 1 else aten.cat.default(pieces, dim)


@register_decomposition([aten.nll_loss_backward.default, aten.nll_loss2d_backward.default])
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """-grad at each row's target class, 0 elsewhere and on ignored rows (divided by the total
    weight for a mean): a compare with the class index, no scatter. A class weight stays extern."""
    if weight is not None:
        return NotImplemented
    class_dim = 0 if self.dim() == 1 else 1
    classes = aten.arange.start_step(0, self.shape[class_dim], 1, dtype=target.dtype, device=self.device)
    classes = aten.view.default(classes, [-1] + [1] * (self.dim() - 1 - class_dim))
    t = aten.unsqueeze.default(target, class_dim)
    hit = aten.logical_and.default(aten.eq.Tensor(t, classes), aten.ne.Scalar(t, ignore_index))
    grad = aten.neg.default(upcast(grad_output))
    if reduction == REDUCTION_NONE and self.dim() > 1:
        grad = aten.unsqueeze.default(grad, class_dim)
    elif reduction == REDUCTION_MEAN:
        grad = aten.div.Tensor(grad, upcast(total_weight))
    return to_dtype(where_scalar(hit, grad, 0), self.dtype)


@register_decomposition(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    """The fused dropout's backward (CUDA's F.dropout): the forward's mask, never a new one."""
    grad = aten.mul.Scalar(aten.mul.Tensor(upcast(grad_output), to_dtype(mask, opmath_dtype(grad_output.dtype))), scale)
    return to_dtype(grad, grad_output.dtype)
