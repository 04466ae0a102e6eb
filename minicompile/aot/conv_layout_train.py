"""Channels-last convolutions for training (CPU float32): one layout through forward and backward.

oneDNN's CPU convolutions, their backward and ATen's max pooling are much faster on NHWC
data than on NCHW (one thread, SmallCNN's shapes, 32 x 32 channels: the 3-channel stem
convolution 4.1 -> 0.35 ms, a 16 x 16 convolution 1.39 -> 0.63 ms, 2 x 2 max pooling 4.5 ->
0.28 ms). The inference pass (cpu/conv_layout.py) converts at the ATen level, below autograd:
in a joint trace autograd would still save the NCHW input and weight, and the backward's
``convolution_backward`` would mix layouts, slower than both. So the conversion here happens
above autograd, while the joint function runs the captured forward: a TorchFunctionMode gives
each ``conv2d`` its input and weight as ``contiguous(memory_format=channels_last)``. Autograd
then saves the channels-last values, the backward's convolutions see channels-last
gradients (every elementwise op and BatchNorm keeps the layout, as TensorIterator does), and
only the graph's first convolution converts its input.

What the caller sees is eager's: a forward output whose strides differ from eager's (the
fake forward's) is cloned into eager's layout, and a gradient that came out in the other of
the two layouts is cloned into its input's (so a weight's gradient is stored as the weight is,
and the optimizer and eager agree). If an output's eager layout is neither, or a view only NCHW
allows fails, the joint is traced as the user wrote it (``trace_joint`` retries without the
mode); so is a graph in which an op that reads a layout (``as_strided``, dropout's draws) would
read one the mode changed (aot/joint.py runs the forward through layout_readers.py's check).
``MINICOMPILE_CONV_CHANNELS_LAST=0`` turns this off with the inference pass.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from minicompile.config import config

LAYOUTS = (torch.contiguous_format, torch.channels_last)
CONVOLUTIONS = frozenset({torch.conv2d})


class LayoutMismatch(Exception):
    """An output's eager layout cannot be restored by a clone: trace without channels-last."""


class ChannelsLastConvolutions(TorchFunctionMode):
    """Feeds every CPU float32 ``conv2d`` a channels-last input and weight; counts them."""

    def __init__(self):
        super().__init__()
        self.claimed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CONVOLUTIONS and len(args) >= 2 and _claims(args[0], args[1]):
            self.claimed += 1
            cl = torch.channels_last
            args = (args[0].contiguous(memory_format=cl), args[1].contiguous(memory_format=cl), *args[2:])
        return func(*args, **kwargs)


def _claims(x, w) -> bool:
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.device.type == "cpu"
            and x.dtype == w.dtype == torch.float32 and x.dim() == w.dim() == 4
            and all(t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last) for t in (x, w)))


def layout_mode() -> ChannelsLastConvolutions | None:
    return ChannelsLastConvolutions() if config.conv_channels_last else None


def strides_of(t: torch.Tensor, layout) -> tuple | None:
    if layout is torch.channels_last and t.dim() != 4:
        return None
    return tuple(torch.empty(t.shape, device="meta", memory_format=layout).stride())


def restore_outputs(outputs: list, expected: list) -> list:
    """Each output with eager's strides (``expected``: eager's outputs, fake); raises LayoutMismatch."""
    restored = []
    for out, want in zip(outputs, expected):
        if isinstance(out, torch.Tensor) and out.stride() != want.stride():
            layout = _layout_of(want)
            if layout is None:
                raise LayoutMismatch(f"output strides {tuple(want.stride())} are neither layout")
            out = out.clone(memory_format=layout)
        restored.append(out)
    return restored


def _layout_of(t: torch.Tensor):
    """The one of LAYOUTS ``t`` is dense in, exactly (size-1 dims' strides included), or None."""
    return next((f for f in LAYOUTS if strides_of(t, f) == tuple(t.stride())), None)


def tangents_like(tangents: list, outputs: list) -> list:
    """Each tangent (contiguous, as the runtime passes it) in its output's layout as traced under the
    mode, before ``restore_outputs``: the backward's convolutions then get channels-last gradients."""
    return [t.contiguous(memory_format=_layout_of(o) or torch.contiguous_format) for t, o in zip(tangents, outputs)]


def restore_grads(grads: tuple, primals: list) -> list:
    """A gradient dense in one layout while its input is dense in the other: cloned into the input's
    exact strides (a 1 x 1 convolution's weight gradient too, whose layouts differ only in the
    strides of size-1 dims; eager is not consistent there, and no reader depends on them)."""
    restored = []
    for g, p in zip(grads, primals):
        if isinstance(g, torch.Tensor) and g.stride() != p.stride():
            theirs = _layout_of(p)
            if _layout_of(g) is not None and theirs is not None:
                g = g.clone(memory_format=theirs)
        restored.append(g)
    return restored
