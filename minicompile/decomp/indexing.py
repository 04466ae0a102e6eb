"""Embedding lookups as eager's CPU and CUDA kernels compute them: rows picked by index_select."""
from __future__ import annotations

import torch

from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx, scale_grad_by_freq and sparse only change the gradient. index_select, as in
    # ATen's embedding, rejects a negative index as eager does (plain indexing would wrap it).
    rows = aten.index_select.default(weight, 0, aten.reshape.default(indices, [-1]))
    return aten.view.default(rows, list(indices.shape) + list(weight.shape[1:]))
