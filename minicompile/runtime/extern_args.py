"""Arguments some eager kernels accept only in a layout of their own, conformed just before the call.

CUDA's memory-efficient attention reads its additive bias with every stride but the last a
multiple of 16 bytes; eager's ``scaled_dot_product_attention`` pads the bias's rows so before
calling it. A compiled graph may hand the kernel a compact bias (one it computed), so the wrapper
passes the bias through ``aligned_rows``: the same tensor when already aligned, else a copy in rows
padded as eager pads them.

torch's CPU ``convolution_backward`` corrupts the heap computing the weight gradient of a 1x1
convolution with a stride above 1 when the input is channels-last (torch 2.13: 2-7 input
channels, a batch of 2 or more; an NCHW input never does, whatever the other layouts). Our
channels-last training pass would turn an NCHW model that trains in eager into one that
crashes, so the wrapper calls ``convolution_backward`` below, which hands such a call an NCHW
input; the wrapper conforms the results to the layout the kernels read.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

# op -> position of the argument that must have aligned rows
ALIGNED_ROW_ARGS = {
    aten._scaled_dot_product_efficient_attention.default: 3,
    aten._scaled_dot_product_efficient_attention_backward.default: 4,
}


def aligned_rows(t, align_bytes: int = 16):
    """``t`` with unit last stride and other strides multiples of ``align_bytes`` (a padded copy if not)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    n = max(1, align_bytes // t.element_size())
    if t.stride(-1) == 1 and all(s % n == 0 for s in t.stride()[:-1]):
        return t
    last = t.shape[-1]
    padded = t.new_empty(*t.shape[:-1], -(-last // n) * n)[..., :last]
    return padded.copy_(t)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, *rest):
    """``aten.convolution_backward`` with the input of a strided 1x1 convolution's weight gradient
    in NCHW on the CPU (see the module's docstring)."""
    if (input.device.type == "cpu" and weight.shape[2:].numel() == 1 and any(s > 1 for s in stride)
            and rest[-1][1] and not input.is_contiguous()):
        input = input.contiguous()
    return aten.convolution_backward.default(grad_output, input, weight, bias_sizes, stride, *rest)


# op -> the function the wrapper calls in its place
SAFE_CALLS = {aten.convolution_backward.default: convolution_backward}


def fast_call(op):
    """What the wrapper calls for ``op``: ``SAFE_CALLS``' function, else torch's generated binding of
    an aten op's default or out overload (``torch.convolution``: its arguments select that overload),
    else the op, whose call converts each argument by its schema: 6 us more than the binding for a
    small convolution, 2 us for ``mm.out`` (one thread), 10% of DenseNet's time (61 library calls).
    Not for a ``Tensor?[]`` (index_put's indices, x[:, i]'s backward): its binding rejects a None."""
    if (op in SAFE_CALLS or not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten"
            or op._overloadname not in ("default", "out") or "Tensor?[]" in str(op._schema)):
        return SAFE_CALLS.get(op, op)
    name = op._schema.name.split("::", 1)[1]
    return next((fn for ns in (torch._C._VariableFunctions, torch._C._nn) if (fn := getattr(ns, name, None))), op)
