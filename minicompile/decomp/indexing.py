"""Embedding lookups as plain indexing."""
from __future__ import annotations

import torch

from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx, scale_grad_by_freq and sparse only change the gradient.
    return aten.index.Tensor(weight, [indices])
