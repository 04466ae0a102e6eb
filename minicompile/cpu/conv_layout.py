"""Channels-last for convolution graphs on CPU (inference): convert once, keep eager's outputs.

oneDNN's CPU convolutions are often much faster on NHWC data than on NCHW (docs/models.md has
the numbers). Eager only takes that path when the user converts the
input. Here a CPU float32 or bfloat16 convolution whose 4-d input is NCHW-contiguous gets that input as
``clone(memory_format=channels_last)``; its result is then channels-last, every elementwise
op after it keeps that order (TensorIterator's rule, which the fake tensors follow), so the
next convolution's input already is channels-last and only the graph's first convolution
pays a conversion. ConvNeXt's ``permute(0, 2, 3, 1)`` around its LayerNorm becomes a free
view of a contiguous NHWC tensor.

What the user sees is unchanged: every output of the ATen graph whose strides differ from
the ones Dynamo recorded for eager (``meta["example_value"]``) is cloned back into eager's
layout (contiguous or channels-last). If an output's eager strides are neither, or the
channels-last trace fails (a ``view`` that only NCHW allows), the graph is traced again
without the conversion; so is a graph in which an op that reads a layout (``as_strided``,
dropout's draws) would read one the conversion changed (aot/layout_readers.py). A 1x1
convolution (stride 1, no padding, one group) of an NHWC input is then a matrix product of
the (N*H*W, C) pixels with the (C_out, C) weight: it runs as oneDNN's linear or MKL's mm, by
the GEMM choice (``pointwise_convs_as_linear``): faster than ATen's convolution at small batches,
where it picks a slow non-oneDNN kernel for 1x1, and as fast at large ones.
Training graphs never see it: the claim only acts inside ``functionalize_channels_last``, and
the training backend compiles both halves with it off (aot/conv_layout_train.py chooses their
layout). ``MINICOMPILE_CONV_CHANNELS_LAST=0`` turns it off; ``MINICOMPILE_CONV_LAYOUT`` measures
the layout ("auto", ``channels_last_pays``) or pins it, and the ATen graph's header prints which.
"""
from __future__ import annotations

import contextvars
import functools
import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from minicompile.cpu.prepare import Emitter, prepares_weights
from minicompile.config import config
from minicompile.runtime import cache
from minicompile.cpu.timing import Decision, NoCandidateRan, cpu_name, library_times, real_tensors, record

aten = torch.ops.aten
# inside functionalize_channels_last: the trace's Claims
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("minicompile_conv_channels_last", default=None)
LAYOUTS = (torch.contiguous_format, torch.channels_last)
# oneDNN has NHWC kernels for both (bfloat16: AVX-512 BF16 or AMX where the CPU has them, else
# converts); float16 convolutions on CPU stay as eager runs them
CLAIMED_DTYPES = (torch.float32, torch.bfloat16)


def claim_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """convolution with its NCHW input and weight cloned channels-last (float32 or bfloat16, CPU),
    else None.

    Both, not only the input: with a channels-last input and an NCHW weight, oneDNN reorders
    the weight inside every call, slowly (over ten times the convolution's own time, measured);
    our clone is a plain
    transposing kernel. In the NCHW trace (``Claims.convert_inputs`` False) only that weight
    is cloned, for an input that is channels-last already (ConvNeXt's, after its permuted
    LayerNorm)."""
    claims = _ACTIVE.get()
    if not (claims is not None and input.device.type == "cpu" and input.dtype in CLAIMED_DTYPES and input.dim() == 4
            and weight.dim() == 4 and not transposed
            and all(isinstance(s, int) for s in (*input.shape, *weight.shape))):
        return None
    cl = torch.channels_last
    x_ready, w_ready = input.is_contiguous(memory_format=cl), weight.is_contiguous(memory_format=cl)
    shape = ConvShape(tuple(input.shape), tuple(weight.shape), bias is not None, tuple(stride), tuple(padding),
                      tuple(dilation), groups, w_ready, x_ready, input.dtype)
    if x_ready and w_ready:   # nothing to convert; channels-last here if an earlier conversion made it so
        if claims.convert_inputs and not input.is_contiguous() and not claims.converting:
            claims.followed.append(shape)
        return None
    if not (x_ready or input.is_contiguous()) or not (w_ready or weight.is_contiguous()):
        return None
    if not claims.convert_inputs and not x_ready:
        return None
    claims.convs.append(shape)
    x = input if x_ready else aten.clone.default(input, memory_format=cl)
    w = weight if w_ready else aten.clone.default(weight, memory_format=cl)
    claims.converting = True   # the call below comes back here, its operands ready: not another convolution
    y = aten.convolution.default(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    claims.converting = False
    return y


@dataclass
class Claims:
    """What the claim does inside one trace, and the convolutions it converted there."""
    convert_inputs: bool                  # the channels-last trace; else only weights, as above
    convs: list = field(default_factory=list)
    # convolutions of a channels-last input and a weight of either layout (1x1: the same bytes), which
    # run as they are: NHWC only because a conversion before them made it so, NCHW in the other trace
    followed: list = field(default_factory=list)
    converting: bool = False


@dataclass(frozen=True)
class ConvShape:
    """One convolution the claim converted: what measuring its two layouts needs."""
    input: tuple
    weight: tuple
    bias: bool
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    weight_ready: bool      # the weight already is channels-last: nothing to convert
    input_ready: bool = False   # the input already was channels-last in this trace
    dtype: torch.dtype = field(default=torch.float32, repr=False)   # (float32's cache keys predate it)

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution that ``pointwise_convs_as_linear`` may run as a matrix product (float32)."""
        return (self.dtype == torch.float32 and self.weight[2:] == (1, 1) and self.groups == 1
                and self.dilation == (1, 1) and self.padding == (0, 0))


def channels_last_pays(convs: list, weights_cached: bool, eager_channels_last: Counter | None = None) -> bool:
    """Whether ``convs`` together run faster channels-last than as NCHW, measured on this machine.

    NHWC convolutions are faster in oneDNN where the channels are few per group (depthwise:
    2.4x at 96 channels, 32x32) and about even for dense 3x3 ones; but each call also converts
    every NCHW weight, unless prepared weights keep the converted copy (ResNet-18 at batch 2
    converts 45 MB of weights per call for convolutions that gain little; docs/models.md). Each
    convolution shape is
    timed both ways once per machine and thread count (cpu/timing.library_times), and the
    graph takes the layout whose sum is smaller.

    A convolution whose input eager already holds channels-last (``eager_channels_last``: counts
    of (input shape, weight shape), from ``eager_channels_last_convs``) runs the same way in both
    traces, its weight converted, so it is left out of the sum: counted as NCHW, ConvNeXt's three
    downsampling convolutions (fed by its permuted LayerNorm) tipped it to the NCHW trace, where
    its stem's LayerNorm then read NCHW rows with a stride (0.5 ms).
    """
    what = f"layout of {len(convs)} convolution(s)"
    if config.conv_layout == "channels_last":
        record(Decision("nhwc", "MINICOMPILE_CONV_LAYOUT=channels_last").line(what))
        return True
    same_both_ways = Counter(eager_channels_last or {})
    total = {"nchw": 0.0, "nhwc": 0.0}
    for conv in convs:
        if conv.input_ready and same_both_ways[(conv.input, conv.weight)] > 0:
            same_both_ways[(conv.input, conv.weight)] -= 1
            continue
        try:
            times = conv_layout_times(conv, convert_weight=not (conv.weight_ready or weights_cached))
        except NoCandidateRan:   # neither layout runs alone: keep eager's
            record(Decision("nchw", note="neither layout runs alone: eager's").line(what))
            return False
        for layout in total:      # a layout that did not run is never chosen
            total[layout] += times.get(layout, math.inf)
    record(Decision("nhwc" if total["nhwc"] < total["nchw"] else "nchw", times=total, note="summed").line(what))
    return total["nhwc"] < total["nchw"]


def eager_channels_last_convs(gm: torch.fx.GraphModule) -> Counter:
    """(input shape, weight shape) of each 2-d convolution in the captured graph ``gm`` whose input
    eager holds channels-last (from the traced example values), counted."""
    found = Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.conv2d, torch.nn.functional.conv2d) \
                or len(node.args) < 2:
            continue
        x, w = (example_value(a) for a in node.args[:2])
        if (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4
                and all(isinstance(s, int) for s in (*x.shape, *x.stride(), *w.shape))
                and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()):
            found[(tuple(x.shape), tuple(w.shape))] += 1
    return found


def example_value(arg):
    return arg.meta.get("example_value", arg.meta.get("val")) if isinstance(arg, torch.fx.Node) else None


def conv_layout_times(conv: ConvShape, convert_weight: bool) -> dict:
    """Seconds per call of ``conv`` on NCHW data and on NHWC data (its weight converted in the
    call when ``convert_weight``); a 1x1 one's NHWC time is its fastest form: oneDNN's linear,
    MKL's mm (``pointwise_convs_as_linear``) or, strided, the convolution."""
    times = _candidate_times(conv, convert_weight)
    best_nhwc = min((t for name, t in times.items() if name != "nchw"), default=None)
    return {name: t for name, t in (("nchw", times.get("nchw")), ("nhwc", best_nhwc)) if t is not None}


def pointwise_stays_convolution(conv_node: torch.fx.Node) -> bool:
    """Whether a strided 1x1 convolution of NHWC pixels (``_pointwise_conv``) measured faster as
    oneDNN's convolution than as the product of its gathered pixels; an unstrided one is the product
    (oneDNN's convolution, 10-40% faster alone at DenseNet's and EfficientNet's shapes, made their graphs 3-7% slower)."""
    x, w, b, stride = (a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in conv_node.args[:4])
    if tuple(stride) == (1, 1):
        return False
    conv = ConvShape(tuple(x.shape), tuple(w.shape), b is not None, tuple(stride), (0, 0), (1, 1), 1, True, True, x.dtype)
    try:
        times = _candidate_times(conv, convert_weight=False)
    except NoCandidateRan:
        return True
    forms = {"convolution": times.get("nhwc_conv", math.inf), "product": min(times.get(k, math.inf) for k in ("nhwc", "nhwc_mm"))}
    choice = min(forms, key=forms.get)
    record(Decision(choice, times=forms).line(f"1x1 convolution {conv.input} * {conv.weight} stride {conv.stride}"))
    return choice == "convolution"


def _candidate_times(conv: ConvShape, convert_weight: bool) -> dict:
    cl = torch.channels_last

    @functools.cache
    def operands():
        x, w = torch.randn(conv.input, dtype=conv.dtype), torch.randn(conv.weight, dtype=conv.dtype)
        b = torch.randn(conv.weight[0], dtype=conv.dtype) if conv.bias else None
        return x, w, b, x.contiguous(memory_format=cl)

    def nchw():
        x, w, b, _ = operands()
        return torch.convolution(x, w, b, conv.stride, conv.padding, conv.dilation, False, [0, 0], conv.groups)

    def nhwc():
        _, w, b, x = operands()
        w = w.contiguous(memory_format=cl) if convert_weight else w
        return torch.convolution(x, w, b, conv.stride, conv.padding, conv.dilation, False, [0, 0], conv.groups)

    def product(mm: bool):
        (_, w, b, x), c = operands(), conv.input[1]
        x, w = x[:, :, ::conv.stride[0], ::conv.stride[1]].permute(0, 2, 3, 1).reshape(-1, c), w.view(conv.weight[0], c)
        if not mm:
            return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())

    dtype = [] if conv.dtype == torch.float32 else [str(conv.dtype)]
    key = cache.digest("conv-layout", torch.__version__, cpu_name(), str(torch.get_num_threads()), repr(conv),
                       str(convert_weight and not conv.pointwise), *dtype)
    candidates = {"nchw": nchw, "nhwc": nhwc} if not conv.pointwise else \
        {"nchw": nchw, "nhwc": functools.partial(product, False), "nhwc_mm": functools.partial(product, True),
         **({"nhwc_conv": nhwc} if conv.stride != (1, 1) else {})}   # an unstrided one is the product
    with real_tensors():
        return library_times(key, candidates, f"convolution {conv.input} * {conv.weight}"
                             f"{' ' + str(conv.dtype)[6:] if dtype else ''}, NCHW or NHWC")


def eager_output_strides(gm: torch.fx.GraphModule) -> list | None:
    """Per output of ``gm``: eager's strides (None for a non-tensor); None if any is unknown."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    strides = []
    for arg in _flat(out.args[0]):
        val = example_value(arg) if isinstance(arg, torch.fx.Node) else arg
        if isinstance(val, torch.Tensor):
            if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
                return None  # symbolic sizes: the claim declines them anyway
            strides.append(tuple(val.stride()))
        elif isinstance(arg, torch.fx.Node) and val is None:
            return None
        else:
            strides.append(None)
    return strides


def _flat(args) -> list:
    return torch.utils._pytree.tree_leaves(args)


def restore_outputs(gm: torch.fx.GraphModule, expected: list) -> bool:
    """Clone each output whose strides differ from eager's into eager's layout; False if one cannot be."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = _flat(out.args[0])
    if len(leaves) != len(expected):
        return False
    replace = {}
    for node, want in zip(leaves, expected):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if want is None or not isinstance(val, torch.Tensor) or tuple(val.stride()) == want:
            continue
        layout = next((f for f in LAYOUTS if _strides_of(val, f) == want), None)
        if layout is None:
            return False
        with gm.graph.inserting_before(out):
            clone = gm.graph.call_function(aten.clone.default, (node,), {"memory_format": layout})
        clone.meta["val"] = val.clone(memory_format=layout)
        replace[node] = clone
    if replace:
        out.args = torch.fx.node.map_arg(out.args, lambda n: replace.get(n, n))
        gm.recompile()
    return True


def _strides_of(val, layout) -> tuple | None:
    if layout is torch.channels_last and val.dim() != 4:
        return None
    return tuple(torch.empty(val.shape, device="meta", memory_format=layout).stride())


def functionalize_channels_last(functionalize, gm, ctx):
    """``functionalize(gm, ctx)`` with convolution inputs in channels-last and eager's output layouts."""
    expected = eager_output_strides(gm) if config.conv_channels_last else None
    if expected is None:
        return functionalize(gm, ctx)
    claims = Claims(convert_inputs=True)
    try:
        traced = _with_claims(claims, functionalize, gm, ctx)
    except Exception:  # a view only NCHW allows: trace as the user wrote it
        if not claims.convs:
            raise
        traced = None
    if traced is not None and claims.convs and not channels_last_pays(
            claims.convs + claims.followed, prepares_weights(ctx), eager_channels_last_convs(gm)):
        traced = None  # NCHW measured faster here: trace as the user wrote it
    if traced is not None and (not claims.convs or restore_outputs(traced, expected)):
        return traced
    return _with_claims(Claims(convert_inputs=False), functionalize, gm, ctx)


def relayout_active() -> bool:
    """Inside the channels-last trace, once a convolution was converted: layouts may differ from eager's."""
    claims = _ACTIVE.get()
    return claims is not None and claims.convert_inputs and bool(claims.convs)


def _with_claims(claims: Claims, functionalize, gm, ctx):
    token = _ACTIVE.set(claims)
    try:
        return functionalize(gm, ctx)
    finally:
        _ACTIVE.reset(token)


def pointwise_convs_as_linear(gm: torch.fx.GraphModule, fake_mode, use_onednn=lambda pixels, weight_t: True,
                              stays_convolution=lambda conv: False) -> int:
    """Each 1x1 convolution of an NHWC input -> a matrix product over its (a strided one's: gathered)
    pixels unless ``stays_convolution(conv)`` (``pointwise_stays_convolution``); returns how many.

    The product is oneDNN's linear where ``use_onednn(pixels, weight_t)`` (the CPU policy's GEMM
    choice), else ``mm`` plus the bias, which the wrapper runs into its own buffer."""
    if not (config.conv_channels_last and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return 0
    rewritten = 0
    for conv in [n for n in gm.graph.nodes if n.target is aten.convolution.default and _pointwise_conv(n)]:
        if stays_convolution(conv):
            continue
        x, w, b, (sh, sw) = *conv.args[:3], conv.args[3]
        (n, cin, h, wd), cout = x.meta["val"].shape, w.meta["val"].shape[0]
        emit = Emitter(gm.graph, fake_mode)
        with gm.graph.inserting_before(conv):
            nhwc = emit(aten.permute.default, x, [0, 2, 3, 1])
            if (sh, sw) != (1, 1):   # the pixels the convolution reads, copied into rows
                nhwc = emit(aten.clone.default, emit(aten.slice.Tensor, emit(aten.slice.Tensor, nhwc, 1, 0, h, sh), 2, 0, wd, sw))
                h, wd = nhwc.meta["val"].shape[1:3]
            pixels = emit(aten.view.default, nhwc, [n * h * wd, cin])
            weight = emit(aten.view.default, w, [cout, cin])
            weight_t = emit(aten.t.default, weight)
            if use_onednn(pixels.meta["val"], weight_t.meta["val"]):
                y = emit(torch.ops.mkldnn._linear_pointwise.default, pixels, weight, b, "none", [], "")
                gm.graph.erase_node(weight_t)
            else:
                y = emit(aten.mm.default, pixels, weight_t)
                y = emit(aten.add.Tensor, y, b) if b is not None else y
            nchw = emit(aten.permute.default, emit(aten.view.default, y, [n, h, wd, cout]), [0, 3, 1, 2])
        nchw.meta = {**conv.meta, "val": nchw.meta["val"]}
        conv.replace_all_uses_with(nchw)
        gm.graph.erase_node(conv)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _pointwise_conv(conv: torch.fx.Node) -> bool:
    x, w, b, stride, padding, dilation, transposed, _, groups = conv.args
    vals = [a.meta.get("val") for a in (x, w) if isinstance(a, torch.fx.Node)]
    if len(vals) != 2 or transposed or groups != 1 or list(dilation) != [1, 1] or list(padding) != [0, 0] \
            or not all(isinstance(s, int) for s in stride):
        return False
    xv, wv = vals
    return (xv.dim() == 4 and tuple(wv.shape[2:]) == (1, 1) and xv.device.type == "cpu"
            and xv.dtype == wv.dtype == torch.float32 and xv.is_contiguous(memory_format=torch.channels_last)
            and all(isinstance(s, int) for s in xv.shape)
            and (b is None or b.meta["val"].dtype == torch.float32))
