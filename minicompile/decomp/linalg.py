"""Matrix products, down to mm / bmm (extern BLAS calls) plus pointwise ops.

linear and matmul are CompositeImplicitAutograd: inside make_fx the dispatcher decomposes
them (into view/t/addmm/mm/bmm/mv/dot) before the table is consulted, so their entries
here are for direct use; the ops they reach (addmm, mv, dot, ...) are decomposed below.
"""
from __future__ import annotations

import math

import torch

from minicompile.decomp.precision import to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


def _scale_and_add(product, bias, beta, alpha):
    """beta * bias + alpha * product, with eager's rule that beta == 0 ignores bias (even NaN)."""
    if alpha != 1:
        product = aten.mul.Scalar(product, alpha)
    if beta == 0:
        return product
    if beta != 1:
        bias = aten.mul.Scalar(bias, beta)
    return aten.add.Tensor(bias, product)


@register_decomposition(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    # On CPU, cpu/claims.py may claim it first (oneDNN's linear where it measured faster).
    return _scale_and_add(aten.mm.default(mat1, mat2), self, beta, alpha)


@register_decomposition(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scale_and_add(aten.bmm.default(batch1, batch2), self, beta, alpha)


@register_decomposition(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scale_and_add(mv(mat, vec), self, beta, alpha)


@register_decomposition(aten.mv.default)
def mv(mat, vec):
    return aten.squeeze.dim(aten.mm.default(mat, aten.unsqueeze.default(vec, 1)), 1)


@register_decomposition(aten.dot.default)
def dot(a, b):
    # Eager accumulates a bf16/fp16 dot product in float32 and rounds once.
    return to_dtype(aten.sum.default(aten.mul.Tensor(upcast(a), upcast(b))), a.dtype)


def _reshape(x, shape):
    # aten.reshape is itself composite: the dispatcher turns it into view or clone+view.
    return aten.reshape.default(x, list(shape))


@register_decomposition(aten.matmul.default)
def matmul(a, b):
    da, db = a.dim(), b.dim()
    if da == 1 and db == 1:
        return dot(a, b)
    if da == 2 and db == 1:
        return mv(a, b)
    if da == 1 and db == 2:
        return aten.squeeze.dim(aten.mm.default(aten.unsqueeze.default(a, 0), b), 0)
    if da == 2 and db == 2:
        return aten.mm.default(a, b)
    if da >= 3 and db <= 2:
        # Fold the batch dims of `a` into its rows: one mm instead of a bmm.
        b2 = aten.unsqueeze.default(b, 1) if db == 1 else b
        out = aten.mm.default(_reshape(a, (-1, a.shape[-1])), b2)
        tail = [] if db == 1 else [b.shape[-1]]
        return aten.view.default(out, list(a.shape[:-1]) + tail)
    # General case: broadcast the batch dims, flatten them, one bmm.
    a2 = aten.unsqueeze.default(a, 0) if da == 1 else a
    b2 = aten.unsqueeze.default(b, 1) if db == 1 else b
    batch = list(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    n, k, m = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    nbatch = math.prod(batch)
    a3 = _reshape(aten.expand.default(a2, batch + [n, k]), (nbatch, n, k))
    b3 = _reshape(aten.expand.default(b2, batch + [k, m]), (nbatch, k, m))
    out = aten.view.default(aten.bmm.default(a3, b3), batch + [n, m])
    if da == 1:
        out = aten.squeeze.dim(out, -2)
    if db == 1:
        out = aten.squeeze.dim(out, -1)
    return out


@register_decomposition(aten.linear.default)
def linear(input, weight, bias=None):
    out = matmul(input, aten.t.default(weight))
    return out if bias is None else aten.add.Tensor(out, bias)
