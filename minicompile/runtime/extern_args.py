"""Arguments some eager kernels accept only in a layout of their own, conformed just before the call.

CUDA's memory-efficient attention reads its additive bias with every stride but the last a
multiple of 16 bytes; eager's ``scaled_dot_product_attention`` pads the bias's rows so before
calling it. A compiled graph may hand the kernel a compact bias (one it computed), so the wrapper
passes the bias through ``aligned_rows``: the same tensor when already aligned, else a copy in rows
padded as eager pads them.
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
