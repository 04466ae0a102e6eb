"""Matrix products, down to mm / bmm (extern BLAS calls) plus pointwise ops.

linear and matmul are CompositeImplicitAutograd: inside make_fx the dispatcher decomposes
them (into view/t/addmm/mm/bmm/mv/dot) before the table is consulted, so their entries
here are for direct use; the ops they reach (addmm, mv, dot, ...) are decomposed below.
"""
from __future__ import annotations

import functools
import math

import torch

from minicompile.config import config

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
    if beta == 1 and alpha == 1 and self.dim() == 1 and self.shape[0] == mat2.shape[1] and self.dtype == mat1.dtype \
            and use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), self, "none", [], "")
    return _scale_and_add(aten.mm.default(mat1, mat2), self, beta, alpha)


@register_decomposition(aten.mm.default)
def mm(mat1, mat2):
    if use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), None, "none", [], "")
    return NotImplemented


def use_onednn_linear(mat1, mat2) -> bool:
    """Run ``mat1 @ mat2`` as oneDNN's linear: CPU float32, few rows, a large transposed weight.

    With a weight much larger than the activations (an MLP layer at small batch), oneDNN's
    matmul beat MKL's sgemm behind ``aten.mm`` on the 2-core AVX-512 machine by 5-19%
    (256x1024 @ 1024x4096: 6.7 vs 7.3 ms; 256x4096 @ 4096x1024: 6.2 vs 6.6 ms; 32x4096 @
    4096x4096: 5.1 vs 6.1 ms), and lost by 6-14% from 512 rows up (the transformer block's
    products). The bias is added inside the product, which also saves a kernel pass.
    ``config.onednn_linear_max_rows`` / ``onednn_linear_min_weight`` set the bounds.
    """
    max_rows, min_weight = config.onednn_linear_max_rows, config.onednn_linear_min_weight
    if max_rows <= 0 or mat1.device.type != "cpu" or mat1.dtype != torch.float32 or mat2.dtype != torch.float32:
        return False
    m, k, n = mat1.shape[0], mat1.shape[1], mat2.shape[1]
    if not all(isinstance(v, int) for v in (m, k, n)) or m > max_rows or k * n < min_weight:
        return False
    # mat2 must be a weight seen through .t(): (k, n) with strides (1, k)
    return tuple(mat2.stride()) == (1, k) and _onednn_available()


@functools.lru_cache(maxsize=None)
def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


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


def fold_gelu_into_onednn_linear(gm: torch.fx.GraphModule) -> int:
    """Replace ``gelu(linear(x, W, b))`` by one oneDNN linear with GELU as its post-op.

    Runs on the traced ATen graph, where ``use_onednn_linear`` left a
    ``mkldnn._linear_pointwise(x, W, b, "none")`` and ``decomp/activations.py`` wrote the exact
    GELU as ``0.5 * y * (erf(y / sqrt(2)) + 1)``. When the linear's value feeds nothing else,
    oneDNN applies GELU while the product is still in registers: the MLP's separate GELU
    kernel (0.43-0.48 ms of ~14 ms) and its 4 MiB intermediate are gone. Returns the number
    of folds.
    """
    linear = torch.ops.mkldnn._linear_pointwise.default if _onednn_available() else None
    folds = 0
    for node in list(gm.graph.nodes):
        if linear is None or node.target is not linear or tuple(node.args[3:]) != ("none", [], ""):
            continue
        match = _exact_gelu_of(node)
        if match is None:
            continue
        out, dead = match
        with gm.graph.inserting_before(out):
            fused = gm.graph.call_function(linear, (*node.args[:3], "gelu", [], "none"))
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        for n in [out, *dead, node]:
            gm.graph.erase_node(n)
        folds += 1
    if folds:
        gm.recompile()
    return folds


def _exact_gelu_of(y):
    """(the GELU's result node, its other nodes) if y's only users compute GELU(y), else None."""
    def scalar_mul(n, c):
        return (n.target is aten.mul.Scalar and n.args[0] is y and isinstance(n.args[1], float)
                and abs(n.args[1] - c) < 1e-12)

    users = list(y.users)
    half = [u for u in users if scalar_mul(u, 0.5)]
    scaled = [u for u in users if scalar_mul(u, 1.0 / math.sqrt(2.0))]
    if len(users) != 2 or len(half) != 1 or len(scaled) != 1:
        return None
    half, scaled = half[0], scaled[0]
    erf = _only_user(scaled)
    one = _only_user(erf) if erf is not None and erf.target is aten.erf.default else None
    if one is None or one.target is not aten.add.Scalar or one.args[1] != 1.0:
        return None
    out = _only_user(one)
    if out is None or out.target is not aten.mul.Tensor or set(out.args) != {half, one} or _only_user(half) is not out:
        return None
    return out, [one, erf, scaled, half]


def _only_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None
