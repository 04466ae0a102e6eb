"""Reductions that are not core: mean over everything, std, std_mean, logsumexp.

var.correction and var_mean.correction are core (the lowering computes them in one
pass), so std is their square root rather than a hand-written two-pass formula.
"""
from __future__ import annotations

import torch

from minicompile.decomp.precision import fill_where, to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.mean.default)
def mean(x, *, dtype=None):
    return aten.mean.dim(x, list(range(x.dim())), False, dtype=dtype)


@register_decomposition(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    # Eager takes the square root before rounding bf16/fp16 back.
    var = aten.var.correction(upcast(x), dim, correction=correction, keepdim=keepdim)
    return to_dtype(aten.sqrt.default(var), x.dtype)


@register_decomposition(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    var, mean_ = aten.var_mean.correction(upcast(x), dim, correction=correction, keepdim=keepdim)
    return to_dtype(aten.sqrt.default(var), x.dtype), to_dtype(mean_, x.dtype)


@register_decomposition(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    if not x.is_floating_point():
        x = to_dtype(x, torch.get_default_dtype())  # eager promotes integers the same way
    dim = list(dim) if len(dim) else list(range(x.dim()))
    maxes = aten.amax.default(x, dim, True)
    # An infinite max would turn x - max into NaN; eager shifts by 0 instead.
    maxes = fill_where(aten.isinf.default(maxes), 0, maxes)
    total = aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(x, maxes)), dim, keepdim)
    if not keepdim:
        maxes = aten.squeeze.dims(maxes, dim)
    return aten.add.Tensor(aten.log.default(total), maxes)
