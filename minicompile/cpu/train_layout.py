"""Whether a training graph's convolutions run channels-last, measured forward and backward.

aot/conv_layout_train.py can run every CPU float32 convolution of a training graph channels-last,
forward and backward. oneDNN's NHWC kernels are faster where channels are few (a 3-channel stem,
depthwise convolutions), but a training step also converts each NCHW weight to channels-last and
its gradient back, every step: weights that change cannot be prepared once. Where the
convolutions gain little, the conversions cost more than they save: ResNet-18 at 2 x 3 x 128 x 128
(one thread, profiled) spent 66 ms of a 600 ms step converting its 45 MB of weights there and
back, for convolutions 4% faster than NCHW ones.

So each convolution of the captured graph is timed both ways, its forward and its backward
(``convolution_backward``), the NHWC one with its weight converted and the weight's gradient
converted back, and the graph takes the layout whose sum is smaller. Pooling, BatchNorm and the
elementwise ops are not timed (they follow the layout either way). Timings are kept as the other
measured choices are (cpu/timing.py); ``MINICOMPILE_CONV_LAYOUT=channels_last`` pins the
channels-last form, and the choice prints in the joint graph's header.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from minicompile.config import config
from minicompile.cpu.conv_layout import ConvShape, example_value
from minicompile.cpu.timing import Decision, NoCandidateRan, cpu_name, library_times, real_tensors, record
from minicompile.runtime import cache

aten = torch.ops.aten
CONV2D = (torch.conv2d, torch.nn.functional.conv2d)


def channels_last_pays_in_training(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm``'s convolutions, forward and backward with the conversions they add, run
    faster channels-last on this machine (True where a convolution's shape is unknown: symbolic)."""
    convs = training_convs(gm)
    what = f"training layout of {len(convs)} convolution(s)"
    if not convs:
        return True     # nothing to measure: the mode claims nothing either
    if config.conv_layout == "channels_last":
        record(Decision("nhwc", "MINICOMPILE_CONV_LAYOUT=channels_last").line(what))
        return True
    if any(c is None for c in convs):
        record(Decision("nhwc", note="a symbolic shape: not measured").line(what))
        return True
    total = {"nchw": 0.0, "nhwc": 0.0}
    for conv in convs:
        try:
            times = train_conv_times(conv)
        except NoCandidateRan:
            record(Decision("nchw", note="neither layout runs alone: eager's").line(what))
            return False
        for layout in total:
            total[layout] += times.get(layout, math.inf)
    record(Decision("nhwc" if total["nhwc"] < total["nchw"] else "nchw", times=total, note="summed").line(what))
    return total["nhwc"] < total["nchw"]


def training_convs(gm: torch.fx.GraphModule) -> list:
    """A ``TrainConv`` per CPU float32 2-d convolution of the captured graph ``gm`` that the
    channels-last mode would claim (None where its shape or arguments are not plain numbers)."""
    convs = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in CONV2D and len(node.args) >= 2:
            x, w = (example_value(a) for a in node.args[:2])
            if (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.device.type == "cpu"
                    and x.dtype == w.dtype == torch.float32 and x.dim() == w.dim() == 4):
                convs.append(_train_conv(node, x, w))
    return convs


def _pair(v) -> tuple:
    return tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (v, v)


def _train_conv(node, x, w):
    given = dict(zip(("bias", "stride", "padding", "dilation", "groups"), node.args[2:]), **node.kwargs)
    stride, padding, dilation = (_pair(given.get(k, d)) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1)))
    groups = given.get("groups", 1)
    if not all(type(s) is int for s in (*x.shape, *w.shape, *stride, *padding, *dilation, groups)):
        return None     # symbolic, or padding="same"
    return TrainConv(tuple(x.shape), tuple(w.shape), given.get("bias") is not None, stride, padding, dilation, groups,
                     w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous(), input_grad=x.requires_grad)


@dataclass(frozen=True)
class TrainConv(ConvShape):
    """One convolution of a training graph: the inference layout choice's shape, and whether its
    input needs a gradient (not the image's)."""
    input_grad: bool = False


def train_conv_times(conv: TrainConv) -> dict:
    """Seconds per training step of one convolution: forward and backward on NCHW data, and on
    NHWC data with its NCHW weight converted and the weight's gradient converted back."""
    cl = torch.channels_last
    args = (conv.stride, conv.padding, conv.dilation, False, [0, 0], conv.groups)
    mask = [conv.input_grad, True, conv.bias]

    @functools.cache
    def operands():
        x, w = torch.randn(conv.input), torch.randn(conv.weight)
        b = torch.randn(conv.weight[0]) if conv.bias else None
        gy = torch.randn(torch.convolution(x, w, b, *args).shape)
        return x, w, b, gy, x.contiguous(memory_format=cl), gy.contiguous(memory_format=cl)

    def step(x, w, b, gy):
        torch.convolution(x, w, b, *args)
        return aten.convolution_backward(gy, x, w, [conv.weight[0]] if conv.bias else None, *args, mask)

    def nchw():
        x, w, b, gy, _, _ = operands()
        step(x, w, b, gy)

    def nhwc():
        _, w, b, _, x, gy = operands()
        grad_w = step(x, w if conv.weight_ready else w.contiguous(memory_format=cl), b, gy)[1]
        if not conv.weight_ready:
            grad_w.contiguous()

    key = cache.digest("conv-layout-train", torch.__version__, cpu_name(), str(torch.get_num_threads()), repr(conv))
    with real_tensors():
        return library_times(key, {"nchw": nchw, "nhwc": nhwc},
                             f"training convolution {conv.input} * {conv.weight}, NCHW or NHWC")
