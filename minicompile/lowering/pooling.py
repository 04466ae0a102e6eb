"""Max pooling as a window of loads: each output compares its window's elements in a fixed order.

``max_pool2d_with_indices`` is lowered where nothing reads its indices (inference): the
values are a lazy value whose body loads the ``kh * kw`` window elements, so a BatchNorm and
ReLU before the pool fuse into it and no pass runs for the pool alone. Eager's NCHW max pool
is a slow scalar loop (ResNet-18's stem pool, 2x64x64x64: 2.2 ms against 0.14 ms for its NHWC
kernel); this one runs in whatever layout the input has. Where the indices are read (the
backward of a training graph) the op stays eager's call, as before.
"""
from __future__ import annotations

import operator

import torch

from minicompile.ir.expr import Expr
from minicompile.ir.nodes import Lazy, is_static, shape_of
from minicompile.ir.ops import compute_dtype
from minicompile.lowering.misc import in_bounds
from minicompile.lowering.registry import Unsupported, aten, register_lowering


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    return [v, v] if isinstance(v, int) else list(v) * (2 // len(v))


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(lw, node, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        raise Unsupported("max-pool indices are read (return_indices, or the pool's backward): eager's kernel computes them")
    if not x.dtype.is_floating_point:
        raise Unsupported(f"max pool of {x.dtype}")
    values = shape_of(node.meta["val"][0])
    if not is_static(values) or not is_static(x.size):
        raise Unsupported("max pool of a symbolic size")
    (kh, kw), (sh, sw) = _pair(kernel_size), _pair(stride, kernel_size)
    (ph, pw), (dh, dw) = _pair(padding), _pair(dilation)
    height, width = x.size[-2], x.size[-1]
    out_h, out_w = values[-2], values[-1]
    if 0 in values:
        raise Unsupported("an empty max pool")
    load, dtype = x.loader(), x.dtype
    cdt = compute_dtype(dtype)

    def edges(out, stride_, pad, dil, k, size):
        """Per window offset: whether some output's window reaches past an edge there (padding,
        ceil mode), so its loads need a bounds test."""
        return [(pad - j * dil > 0) or ((out - 1) * stride_ - pad + j * dil >= size) for j in range(k)]
    check_h = edges(out_h, sh, ph, dh, kh, height)
    check_w = edges(out_w, sw, pw, dw, kw, width)

    def body(ops, idx):
        lead, oh, ow = list(idx[:-2]), Expr.of(idx[-2]), Expr.of(idx[-1])
        best = None
        for i in range(kh):
            for j in range(kw):
                h = oh * sh + (i * dh - ph)
                w = ow * sw + (j * dw - pw)
                inside = None
                for pos, size, check in ((h, height, check_h[i]), (w, width, check_w[j])):
                    if check:
                        ok = in_bounds(ops, pos, size)
                        inside = ok if inside is None else ops.pointwise("logical_and", inside, ok, dtype=torch.bool)
                v = ops.to_dtype(load(ops, lead + [h.clamp(0, height - 1), w.clamp(0, width - 1)]), cdt)
                if inside is not None:
                    v = ops.pointwise("where", inside, v, ops.constant(float("-inf"), cdt), dtype=cdt)
                if best is None:
                    best = v
                    continue
                # eager's rule: a larger value or a NaN takes the place (NaN propagates)
                take = ops.pointwise("logical_or", ops.pointwise("gt", v, best, dtype=torch.bool),
                                     ops.pointwise("isnan", v, dtype=torch.bool), dtype=torch.bool)
                best = ops.pointwise("where", take, v, best, dtype=cdt)
        return best
    return [Lazy(dtype, x.device, values, body, [node.name]), None]
