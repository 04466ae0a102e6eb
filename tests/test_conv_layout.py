"""Channels-last convolution graphs on CPU (cpu/conv_layout.py) and loops in memory order (ir/nodes.py)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.aot.passes import constructed_by
from minicompile.config import patch
from minicompile.ir.nodes import Layout, memory_order
from minicompile.tools.models import MODELS
from tests.helpers import Recorder, assert_matches_eager, compile_with_dynamo

# a convolution, or one with its epilogue fused in (cpu/epilogues.py)
CONVOLUTIONS = (torch.ops.aten.convolution.default,) + ((torch.ops.mkldnn._convolution_pointwise.default,
                                                         torch.ops.mkldnn._convolution_pointwise.binary)
                                                        if hasattr(torch.ops.mkldnn, "_convolution_pointwise") else ())


def _clones_to_channels_last(graph) -> int:
    """In the graph, and in its preparation of the weights (cpu/prepare.py), which runs once."""
    prepared = graph.aten.prepared
    graphs = [graph.aten.gm.graph] + ([prepared.prepare.graph] if prepared else [])
    return sum(1 for g in graphs for n in g.nodes
               if n.target is torch.ops.aten.clone.default and n.kwargs.get("memory_format") is torch.channels_last)


class ConvChain(nn.Module):
    """conv -> BatchNorm -> ReLU -> conv (+ residual) -> returned as NCHW, as eager returns it."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        return self.c2(y) + y, y.mean((2, 3))


def _eval(model):
    model.eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model


def test_conv_chain_runs_channels_last_inside_and_returns_eager_layout(fresh_dynamo):
    torch.manual_seed(0)
    model, x = _eval(ConvChain()), torch.randn(2, 3, 12, 10)
    with torch.no_grad():
        ref = model(x)
    out, graphs = compile_with_dynamo(model, x)
    assert_matches_eager(out, ref, atol=1e-5, rtol=1e-5)  # values and eager's (contiguous) strides
    convs = [n for n in graphs[0].aten.gm.graph.nodes if n.target in CONVOLUTIONS]   # an epilogue may be fused
    # the input once (the second conv already gets NHWC), and each weight
    assert _clones_to_channels_last(graphs[0]) == 1 + len(convs) == 3
    assert all(n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs)


def test_bfloat16_conv_chain_runs_channels_last_too(fresh_dynamo):
    # bf16 inference took the NCHW path whatever the measurement said (the claim was float32's)
    torch.manual_seed(0)
    model, x = _eval(ConvChain()).to(torch.bfloat16), torch.randn(2, 3, 12, 10).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
    out, graphs = compile_with_dynamo(model, x)
    assert_matches_eager(out, ref, atol=3e-2, rtol=2e-2)
    convs = [n for n in graphs[0].aten.gm.graph.nodes if n.target in CONVOLUTIONS]
    assert _clones_to_channels_last(graphs[0]) == 3
    assert all(n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs)


def test_switched_off_keeps_nchw(fresh_dynamo):
    torch.manual_seed(0)
    model, x = _eval(ConvChain()), torch.randn(1, 3, 8, 8)
    with patch(conv_channels_last=False):
        out, graphs = compile_with_dynamo(model, x)
    assert _clones_to_channels_last(graphs[0]) == 0
    with torch.no_grad():
        assert_matches_eager(out, model(x))


def test_a_view_only_nchw_allows_falls_back_to_nchw_trace(fresh_dynamo):
    # conv output .view(n, -1) is impossible on channels-last strides: traced again as written
    conv = nn.Conv2d(3, 4, 3).eval()

    def fn(x):
        return conv(x).view(x.shape[0], -1) * 2

    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        ref = fn(x)
    out, graphs = compile_with_dynamo(fn, x)
    assert_matches_eager(out, ref)
    assert _clones_to_channels_last(graphs[0]) == 0


def test_channels_last_input_is_not_converted_again(fresh_dynamo):
    conv = nn.Conv2d(4, 4, 3, padding=1).eval()
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = F.gelu(conv(x))
    out, graphs = compile_with_dynamo(lambda t: F.gelu(conv(t)), x)
    assert_matches_eager(out, ref)   # eager's result is channels-last here, and so is ours
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert _clones_to_channels_last(graphs[0]) == 1   # the NCHW weight only


@pytest.mark.parametrize("name", ["resnet18", "convnext", "efficientnet", "vit", "swin",
                                  "resnext", "densenet", "deit", "mixer"])
def test_model_suite_tiny_matches_eager(name, fresh_dynamo):
    model, inputs = MODELS[name].build("tiny")
    with torch.no_grad():
        ref = model(*inputs)
    out, graphs = compile_with_dynamo(model, *inputs)
    assert_matches_eager(out, ref, atol=1e-4, rtol=1e-4)
    assert len(graphs) == 1 and hasattr(graphs[0], "aten")   # one compiled graph, no fallback


def test_memory_order_of_layouts():
    def lay(size, stride):
        return Layout(size, stride, 0, torch.float32, torch.device("cpu"))
    assert memory_order(lay((2, 3, 4, 5), (60, 20, 5, 1))) is None               # contiguous
    assert memory_order(lay((2, 3, 4, 5), (60, 1, 15, 3))) == (0, 2, 3, 1)       # channels-last
    assert memory_order(lay((3, 4), (1, 3))) == (1, 0)                           # transposed
    assert memory_order(lay((3, 1, 4), (1, 1, 3))) is not None                   # size-1 dims ignored
    assert memory_order(lay((3, 4), (1, 6))) is None                             # not dense


def test_transposed_output_is_written_in_memory_order():
    # eager gives a + b.t() (b transposed, a broadcast) the transposed layout; the kernel's
    # innermost loop should walk the output's contiguous dim, and values must match
    a, b = torch.randn(64, 1), torch.randn(48, 64)

    def fn(a, b):
        return (a + b.t()).exp()

    out, _ = compile_with_dynamo(fn, a, b)
    assert_matches_eager(out, fn(a, b))

@pytest.mark.parametrize("bias", [False, True])
def test_pointwise_conv_runs_as_onednn_linear(bias, fresh_dynamo):   # the GEMM library pinned: no timing
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise") or not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN linear")
    torch.manual_seed(0)
    expand, project = nn.Conv2d(6, 12, 1, bias=bias).eval(), nn.Conv2d(12, 5, 1, stride=2).eval()

    def fn(x):
        return project(F.silu(expand(x)))   # the strided 1x1: a product of every other pixel, gathered

    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        ref = fn(x)
    out, graphs = compile_with_dynamo(fn, x)
    assert_matches_eager(out, ref)
    targets = [n.target for n in graphs[0].aten.gm.graph.nodes]
    assert targets.count(torch.ops.mkldnn._linear_pointwise.default) == 2
    assert targets.count(torch.ops.aten.convolution.default) == 0
    with patch(cpu_gemm="mkl"):  # where MKL is the GEMM choice: mm (into the wrapper's buffer) and the bias
        torch._dynamo.reset()
        out, graphs = compile_with_dynamo(fn, x)
    assert_matches_eager(out, ref)
    targets = [n.target for n in graphs[0].aten.gm.graph.nodes]
    assert torch.ops.mkldnn._linear_pointwise.default not in targets and targets.count(torch.ops.aten.mm.default) == 2


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_conv_stays_a_convolution_where_that_measured_faster(stride, fresh_dynamo, monkeypatch):
    from minicompile.cpu import policy
    monkeypatch.setattr(policy, "pointwise_stays_convolution", lambda conv: True)
    torch.manual_seed(0)
    stem, pointwise = nn.Conv2d(3, 6, 3, padding=1).eval(), nn.Conv2d(6, 12, 1, stride=stride).eval()

    def fn(x):
        return pointwise(F.relu(stem(x)))

    x = torch.randn(2, 3, 7, 9)
    with torch.no_grad():
        ref = fn(x)
    with patch(conv_layout="channels_last", cpu_gemm="auto"):   # a pinned GEMM library runs every one as its product
        out, graphs = compile_with_dynamo(fn, x)
    assert_matches_eager(out, ref)
    targets = [n.target for n in graphs[0].aten.gm.graph.nodes]
    assert targets.count(torch.ops.aten.convolution.default) == 2 and torch.ops.aten.mm.default not in targets


def test_a_strided_1x1_convolution_stays_one_where_onednn_ran_it_faster_than_either_product(monkeypatch):
    # an unstrided one is always the product: oneDNN's convolution, faster alone, was slower in the graphs
    from minicompile.cpu import conv_layout, timing
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)
    monkeypatch.setattr(timing, "save_choice", lambda *args: None)
    table = {}
    monkeypatch.setattr(timing, "_interleaved_best", lambda candidates: {n: table[n] for n in candidates})

    def conv_node(stride):
        g = torch.fx.Graph()
        x, w = g.placeholder("x"), g.placeholder("w")
        x.meta["val"], w.meta["val"] = torch.empty(2, 8, 4, 4), torch.empty(16, 8, 1, 1)
        return g.call_function(torch.ops.aten.convolution.default, (x, w, None, [stride] * 2, [0, 0], [1, 1], False,
                                                                     [0, 0], 1))
    for stride, faster, stays in ((1, "nhwc_conv", False), (1, "nhwc_mm", False), (2, "nhwc", False), (2, "nhwc_conv", True)):
        timing._library_times.clear()
        table.update({"nchw": 3.0, "nhwc": 4.0, "nhwc_mm": 4.0, "nhwc_conv": 4.0, faster: 1.0})
        assert conv_layout.pointwise_stays_convolution(conv_node(stride)) == stays


def _compiled_with_layout_times(monkeypatch, model, x, times):
    """``model`` compiled under conv_layout "auto" with ``times(conv, convert_weight)`` as each
    convolution's measured times; checked against eager. The compiled graphs."""
    from minicompile.cpu import conv_layout
    monkeypatch.setattr(conv_layout, "conv_layout_times", times)
    with torch.no_grad():
        ref = model(x)
    with patch(conv_layout="auto"):
        out, graphs = compile_with_dynamo(model, x)
    assert_matches_eager(out, ref, atol=1e-5, rtol=1e-5)
    return graphs


@pytest.mark.parametrize("faster", ["nchw", "nhwc"])
def test_auto_layout_takes_the_layout_its_convolutions_measured_faster(fresh_dynamo, monkeypatch, faster):
    # conv_layout "auto" adds each convolution's two measured times: the graph takes the smaller sum
    seen = []

    def times(conv, convert_weight):
        seen.append((conv, convert_weight))
        return {"nchw": 1.0, "nhwc": 2.0} if faster == "nchw" else {"nchw": 2.0, "nhwc": 1.0}
    torch.manual_seed(0)
    graphs = _compiled_with_layout_times(monkeypatch, _eval(ConvChain()), torch.randn(2, 3, 12, 10), times)
    assert [c.weight for c, _ in seen] == [(8, 3, 3, 3), (8, 8, 3, 3)]
    assert all(convert for _, convert in seen)  # NCHW parameters: converted on every call
    assert (_clones_to_channels_last(graphs[0]) > 0) == (faster == "nhwc")


class StemThenBottleneck(nn.Module):
    """A 3x3 stem, then ResNeXt's 1x1 reduce, grouped 3x3, 1x1 expand: the 1x1 weights are the same
    bytes in either layout, so only the stem's and the grouped weights are converted."""

    def __init__(self):
        super().__init__()
        self.stem, self.reduce = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 8, 1)
        self.grouped, self.expand = nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.Conv2d(8, 32, 1)

    def forward(self, x):
        return self.expand(F.relu(self.grouped(F.relu(self.reduce(F.relu(self.stem(x)))))))


def test_auto_layout_counts_the_1x1_convolutions_the_conversion_puts_in_nhwc(fresh_dynamo, monkeypatch):
    # ResNeXt (quick, one thread) measured its stem and grouped convolutions about even both ways
    # and ran NCHW, where its twelve 1x1 convolutions took 1.5-4x their NHWC time: they needed no
    # conversion of their own and were left out of the sum. Each convolution is counted once.
    seen = []

    def times(conv, convert_weight):   # the converted ones a little faster NCHW, the 1x1 ones much slower
        seen.append(conv.weight)
        return {"nchw": 1.0, "nhwc": 1.1} if conv.weight[2:] != (1, 1) else {"nchw": 4.0, "nhwc": 1.0}
    torch.manual_seed(0)
    graphs = _compiled_with_layout_times(monkeypatch, StemThenBottleneck().eval(), torch.randn(2, 3, 8, 8), times)
    assert sorted(seen) == sorted([(16, 3, 3, 3), (8, 16, 1, 1), (8, 2, 3, 3), (32, 8, 1, 1)])
    assert _clones_to_channels_last(graphs[0]) > 0   # NHWC: 2 x 1.1 + 2 x 1.0 against 2 x 1.0 + 2 x 4.0
    header = [line for line in constructed_by(graphs[0].aten).splitlines() if "layout of" in line]
    assert header and header[0].startswith("# cpu: layout of 4 convolution(s) -> nhwc"), header


def test_a_1x1_convolution_on_nhwc_data_is_timed_as_the_faster_product(monkeypatch):
    # pointwise_convs_as_linear runs it as oneDNN's linear or MKL's mm (the GEMM choice): NHWC's
    # time is the faster of the two
    from minicompile.cpu import timing
    from minicompile.cpu.conv_layout import ConvShape, conv_layout_times
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)
    monkeypatch.setattr(timing, "save_choice", lambda *args: None)
    table = {"nchw": 3.0, "nhwc": 4.0, "nhwc_mm": 1.0, "nhwc_conv": 2.0}
    monkeypatch.setattr(timing, "_interleaved_best", lambda candidates: {n: table[n] for n in candidates})
    pointwise = ConvShape((2, 8, 4, 4), (16, 8, 1, 1), False, (1, 1), (0, 0), (1, 1), 1, True, True)
    dense = ConvShape((2, 8, 4, 4), (16, 8, 3, 3), False, (1, 1), (1, 1), (1, 1), 1, True, True)
    assert conv_layout_times(pointwise, convert_weight=False) == {"nchw": 3.0, "nhwc": 1.0}
    assert conv_layout_times(dense, convert_weight=False) == {"nchw": 3.0, "nhwc": 4.0}


def test_layout_times_count_the_weight_conversion_and_run_1x1_as_linear():
    from minicompile.cpu.conv_layout import ConvShape, conv_layout_times
    dense = ConvShape((1, 8, 6, 6), (8, 8, 3, 3), True, (1, 1), (1, 1), (1, 1), 1, False)
    pointwise = ConvShape((1, 8, 6, 6), (16, 8, 1, 1), False, (1, 1), (0, 0), (1, 1), 1, False)
    assert pointwise.pointwise and not dense.pointwise
    for conv in (dense, pointwise):
        times = conv_layout_times(conv, convert_weight=True)
        assert set(times) == {"nchw", "nhwc"} and all(t > 0 for t in times.values())


def test_a_layout_that_cannot_run_is_never_chosen(monkeypatch):
    from minicompile.cpu import conv_layout
    from minicompile.cpu.timing import NoCandidateRan
    conv = conv_layout.ConvShape((1, 8, 6, 6), (8, 8, 3, 3), True, (1, 1), (1, 1), (1, 1), 1, False)
    measured = {"nhwc": 1.0}   # NCHW raised: only NHWC's time
    monkeypatch.setattr(conv_layout, "conv_layout_times", lambda conv, convert_weight: measured)
    with patch(conv_layout="auto"):
        assert conv_layout.channels_last_pays([conv], weights_cached=False)
        measured.clear()
        measured["nchw"] = 1.0
        assert not conv_layout.channels_last_pays([conv], weights_cached=False)

        def neither(conv, convert_weight):
            raise NoCandidateRan("no candidate routine ran: ['nchw', 'nhwc']")
        monkeypatch.setattr(conv_layout, "conv_layout_times", neither)
        assert not conv_layout.channels_last_pays([conv], weights_cached=False)   # eager's layout


class PermutedNormThenConv(nn.Module):
    """ConvNeXt's downsampling: a LayerNorm over channels between permutes (its result is
    channels-last in eager), then a dense convolution, after an NCHW stem convolution."""

    def __init__(self):
        super().__init__()
        self.stem, self.norm, self.down = nn.Conv2d(3, 8, 2, 2), nn.LayerNorm(8), nn.Conv2d(8, 16, 2, 2)

    def forward(self, x):
        y = self.norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.down(y)


@pytest.mark.parametrize("faster", ["nchw", "nhwc"])
def test_convolution_of_an_eager_channels_last_input_is_left_out_and_gets_its_weight_converted(
        fresh_dynamo, monkeypatch, faster):
    # its input is channels-last in both traces: only the stem decides, and in the NCHW trace the
    # downsampling weight is still converted (not reordered by oneDNN inside every call)
    seen = []

    def times(conv, convert_weight):
        seen.append(conv.weight)
        return {"nchw": 1.0, "nhwc": 2.0} if faster == "nchw" else {"nchw": 2.0, "nhwc": 1.0}
    torch.manual_seed(0)
    graphs = _compiled_with_layout_times(monkeypatch, PermutedNormThenConv().eval(), torch.randn(2, 3, 8, 8), times)
    assert seen == [(8, 3, 2, 2)]
    convs = [n for n in graphs[0].aten.gm.graph.nodes if n.target in CONVOLUTIONS]
    down = convs[-1]
    assert down.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert down.args[1].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert convs[0].args[0].meta["val"].is_contiguous() == (faster == "nchw")
