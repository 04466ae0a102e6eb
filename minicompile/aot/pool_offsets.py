"""Max pooling's indices kept for backward as one byte each: the position inside the window.

``max_pool2d_with_indices`` returns, per output, the flat index (``h * W + w``, int64) of the
input it took; its backward scatters the gradient there. Saved as they are, the indices cost
8 bytes per output: SmallCNN's 2 x 2 pool over 32 x 32 x 32 x 32 saved 2 MiB of them, more
than the activation it pools. Which element of a window won fits in one byte (``kh * kw <=
127``), so this pass, the joint graph's last (aot/joint.py), rewrites it before the partitioner runs:

    d      = idx - base             base[oh, ow] = (oh * sh - ph) * W + (ow * sw - pw), the window's
    offset = d + (d // W) * (kw - W)                 first element (d = dh * W + dw, 0 <= dw < kw)
    -> int8                                          (forward)
    idx'   = base + offset + (offset // kw) * (W - kw)   (backward, read by the pooling's backward)

Both halves are cheap pointwise chains, so the minimum cut saves the int8 offsets (a quarter
of a MiB there) and backward rebuilds the indices, as Inductor's offsets do. Pools with
dilation, windows wider than the input, or indices that anything else reads are left alone.
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten
MAX_WINDOW = 127   # int8


def compress_pool_indices(gm: torch.fx.GraphModule, ctx=None) -> torch.fx.GraphModule:
    """Rewrite each eligible pool's index chain in place (see the module docstring); a joint pass
    (aot/joint.py JOINT_PASSES)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.max_pool2d_with_indices.default:
            _rewrite(gm.graph, node)
    gm.recompile()
    return gm


def _window(node):
    """(kh, kw, sh, sw, ph, pw) for a pool without dilation, else None."""
    args = list(node.args) + [None] * (6 - len(node.args))
    kernel, stride, padding, dilation = (args[1], args[2] or node.kwargs.get("stride") or args[1],
                                         args[3] or node.kwargs.get("padding", 0), args[4] or node.kwargs.get("dilation", 1))
    pair = lambda v: [v, v] if isinstance(v, int) else list(v) * (2 // len(v))  # noqa: E731
    if pair(dilation) != [1, 1]:
        return None
    return (*pair(kernel), *pair(stride), *pair(padding))


def _rewrite(graph: torch.fx.Graph, pool: torch.fx.Node) -> None:
    idx = next((u for u in pool.users if u.target is operator.getitem and u.args[1] == 1), None)
    window = _window(pool)
    if idx is None or window is None or not idx.users:
        return
    if any(u.target is not aten.max_pool2d_with_indices_backward.default for u in idx.users):
        return
    kh, kw, sh, sw, ph, pw = window
    val = pool.args[0].meta["val"]
    h_out, w_out = idx.meta["val"].shape[-2:]
    width = val.shape[-1]
    if kh * kw > MAX_WINDOW or kw > width or not all(isinstance(s, int) for s in val.shape):
        return
    emit = _Emitter(graph, detect_fake_mode([val]))
    # the first reader of the indices as the graph stands (before `d` below reads them too: the
    # rebuild placed before `d` read the offsets before they were computed, a KeyError where
    # one graph holds both, OpInfo max_pool2d_with_indices_backward)
    first_reader = min(idx.users, key=_position(graph))
    with graph.inserting_before(idx.next):
        rows = emit(aten.mul.Tensor, emit(aten.sub.Tensor, emit(aten.mul.Tensor, _arange(emit, h_out, val), sh), ph), width)
        cols = emit(aten.sub.Tensor, emit(aten.mul.Tensor, _arange(emit, w_out, val), sw), pw)
        base = emit(aten.add.Tensor, emit(aten.view.default, rows, [h_out, 1]), cols)
        d = emit(aten.sub.Tensor, idx, base)
        wide = emit(aten.add.Tensor, d, emit(aten.mul.Tensor, emit(aten.div.Tensor_mode, d, width, rounding_mode="floor"),
                                            kw - width))
        offsets = emit(aten._to_copy.default, wide, dtype=torch.int8)
    with graph.inserting_before(first_reader):
        o = emit(aten._to_copy.default, offsets, dtype=torch.int64)
        back = emit(aten.mul.Tensor, emit(aten.div.Tensor_mode, o, kw, rounding_mode="floor"), width - kw)
        rebuilt = emit(aten.add.Tensor, emit(aten.add.Tensor, base, o), back)
    for user in list(idx.users):
        if user is not d:
            user.replace_input_with(idx, rebuilt)


def _arange(emit, n: int, like: torch.Tensor):
    return emit(aten.arange.start_step, 0, n, 1, dtype=torch.int64, device=like.device)


def _position(graph: torch.fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


class _Emitter:
    """Appends ``op(*args, **kwargs)`` at the graph's insertion point, with its fake value."""

    def __init__(self, graph: torch.fx.Graph, fake_mode):
        self.graph, self.fake_mode = graph, fake_mode

    def __call__(self, op, *args, **kwargs) -> torch.fx.Node:
        node = self.graph.call_function(op, args, kwargs)
        fake = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = op(*fake[0], **fake[1])
        return node
