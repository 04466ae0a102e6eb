"""Dropout: the identity in inference; in training, eager's own draws.

Eager's CPU dropout fills ``torch.empty_like(input)`` with ``bernoulli_``, and that kernel
draws a dense tensor in memory order: for a transposed input the mask is the transpose of
the contiguous one. ``bernoulli.p``, which functionalization and our in-place rewrite put in
``bernoulli_``'s place, fills a fresh contiguous tensor, in logical order. So a dense input that
is not contiguous gets its draws from ``bernoulli.p`` over the input's dimensions permuted into
memory order (a contiguous view), permuted back: the same numbers at the same addresses as
eager's, and the mask has eager's strides. CUDA's ``bernoulli_`` draws in memory order too (a
nullary TensorIterator coalesces a dense tensor to one dimension), so alpha dropout and
``bernoulli_`` take the same route there; CUDA's dropout is its own fused kernel
(``native_dropout``), kept as eager's op.
"""
from __future__ import annotations

import math

import torch

from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten
_MEMORY_ORDER_DRAWS = ("cpu", "cuda")   # devices whose bernoulli_ fills a dense tensor in memory order


@register_decomposition(aten.dropout.default)
def dropout(input, p, train):
    if not train or p == 0:
        return input  # eager returns the input itself, not a copy
    if p == 1 or input.device.type != "cpu" or memory_order(input) is None:
        return NotImplemented  # eager's kernel, unchanged: its draws are in logical order here
    noise = aten.div.Scalar(bernoulli_like(input, 1 - p), 1 - p)
    return aten.mul.Tensor(input, noise)


@register_decomposition(aten.alpha_dropout.default)
def alpha_dropout(input, p, train):
    """Eager's CPU alpha dropout (SELU's), with dropout's draws."""
    if not train or p == 0:
        return input
    if p == 1 or input.device.type not in _MEMORY_ORDER_DRAWS or memory_order(input) is None:
        return NotImplemented
    alpha = 1.7580993408473766
    a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
    noise = bernoulli_like(input, 1 - p)
    b = aten.add.Scalar(aten.mul.Scalar(aten.add.Scalar(noise, -1), alpha * a), alpha * a * p)
    return aten.add.Tensor(aten.mul.Tensor(input, aten.mul.Scalar(noise, a)), b)


@register_decomposition(aten.bernoulli_.float)
def bernoulli_(self, p=0.5, *, generator=None):
    if generator is not None or self.device.type not in _MEMORY_ORDER_DRAWS or memory_order(self) is None:
        return NotImplemented
    return aten.copy_.default(self, bernoulli_like(self, p))


@register_decomposition(aten.native_dropout.default)
def native_dropout(input, p, train):
    if train is None or train:  # train=None means training in native_dropout's schema
        return NotImplemented
    keep = aten.ones_like.default(input, dtype=torch.bool)
    return aten.clone.default(input), keep


def bernoulli_like(t, p):
    """What ``torch.empty_like(t).bernoulli_(p)`` holds on CPU: draws in ``t``'s memory order, in
    ``t``'s layout where it is dense (else contiguous, as empty_like gives)."""
    order = memory_order(t)
    if order is None:
        return aten.bernoulli.p(t, p)
    draws = aten.bernoulli.p(aten.permute.default(t, order), p)
    return aten.permute.default(draws, sorted(range(len(order)), key=order.__getitem__))


def memory_order(t) -> list | None:
    """``t``'s dimensions from outermost to innermost in memory when it is dense but not contiguous
    (static sizes); None otherwise."""
    if not all(isinstance(s, int) for s in (*t.shape, *t.stride())) or t.is_contiguous():
        return None
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    step = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != step:
            return None  # overlapping or with gaps: empty_like gives a contiguous tensor
        step *= t.shape[d]
    return order
