"""Dropout in inference: the identity. Training-mode dropout is random and stays eager."""
from __future__ import annotations

import torch

from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.dropout.default)
def dropout(input, p, train):
    if train and p != 0:
        return NotImplemented
    return input  # eager returns the input itself, not a copy


@register_decomposition(aten.native_dropout.default)
def native_dropout(input, p, train):
    if train is None or train:  # train=None means training in native_dropout's schema
        return NotImplemented
    keep = aten.ones_like.default(input, dtype=torch.bool)
    return aten.clone.default(input), keep
