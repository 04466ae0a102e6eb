"""The shipped CPU defaults ("auto" for the GEMM, attention, convolution-layout and epilogue choices), run
on a deterministic replay of recorded timings instead of a stopwatch.

tests/conftest.py pins the three choices so that kernel counts do not depend on a timing. Here
they are "auto" again, and every timing the CPU policy asks for is answered from a table
(cpu/timing's ``_interleaved_best``; nothing is written to disk): once with the libraries that
won on the machines measured so far, once with the others, so both outcomes of each choice run
through the policy's whole path (measured outside make_fx, printed in the ATen header, stamped
for lowering) and match eager."""
import importlib.util

import pytest
import torch

from minicompile.aot.passes import constructed_by
from minicompile.config import patch
from minicompile.cpu import timing
from minicompile.tools.models import MODELS
from minicompile.tools.workloads import build_train
from tests.helpers import assert_matches_eager, compile_with_dynamo

REPLAYS = {  # milliseconds per call, by candidate
    "as measured here": {"onednn": 1.0, "mkl": 2.0, "flash": 1.0, "math": 2.0, "nhwc": 1.0, "nhwc_mm": 1.0, "nchw": 2.0,
                         "nhwc_conv": 2.0, "separate": 1.0, "fused": 2.0},
    "the other way": {"onednn": 2.0, "mkl": 1.0, "flash": 2.0, "math": 1.0, "nhwc": 2.0, "nhwc_mm": 2.0, "nchw": 1.0,
                      "nhwc_conv": 2.0, "separate": 2.0, "fused": 1.0},
}


@pytest.fixture(params=list(REPLAYS))
def replayed(request, monkeypatch):
    table = REPLAYS[request.param]
    monkeypatch.setattr(timing, "_library_choices", {})
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)
    monkeypatch.setattr(timing, "save_choice", lambda *args: None)
    monkeypatch.setattr(timing, "_interleaved_best", lambda candidates: {n: table[n] * 1e-3 for n in candidates})
    with patch(cpu_gemm="auto", cpu_attention="auto", conv_layout="auto", cpu_epilogue="auto"):
        yield request.param


@pytest.mark.parametrize("name", ["resnet18", "convnext", "vit", "swin", "gpt2", "llama", "t5"])
def test_models_match_eager_under_the_shipped_defaults(name, replayed, fresh_dynamo):
    if MODELS[name].needs and importlib.util.find_spec(MODELS[name].needs) is None:
        pytest.skip(f"needs {MODELS[name].needs}")
    model, inputs = MODELS[name].build("tiny")
    with torch.no_grad():
        ref = model(*inputs)
    out, graphs = compile_with_dynamo(model, *inputs)
    assert_matches_eager(out, ref, atol=1e-4, rtol=1e-4)
    choices = [line for line in constructed_by(graphs[0].aten).splitlines() if line.startswith("# cpu: ")]
    assert len(graphs) == 1 and choices                     # the choices made, printed with their timings
    winners = {name for name, ms in REPLAYS[replayed].items() if ms == 1.0}
    # a strided 1x1 convolution's choice names its forms: the product (nhwc, nhwc_mm) or the convolution
    winners |= {form for form, names in (("product", ("nhwc", "nhwc_mm")), ("convolution", ("nhwc_conv",)))
                if winners & set(names)}
    assert all(line.split(" -> ")[1].split(" ")[0] in winners for line in choices), choices


def test_training_matches_eager_under_the_shipped_defaults(replayed, fresh_dynamo):
    torch.manual_seed(0)
    model, shape = build_train("gpt2_block", "tiny")
    x = torch.randn(shape)
    expected = model(x).sum()
    expected.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out, _ = compile_with_dynamo(model, x, grad=True)
    out.sum().backward()
    assert_matches_eager(out.sum(), expected.detach(), atol=1e-4, rtol=1e-4)
    for p, g in zip(model.parameters(), ref):
        assert_matches_eager(p.grad, g, atol=1e-4, rtol=1e-4)


def test_cnn_training_layout_is_measured_under_the_shipped_defaults(replayed, fresh_dynamo):
    """A training graph's convolutions run channels-last only where that measured faster, forward
    and backward with the weights' conversions (cpu/train_layout.py); either way the gradients are
    eager's, and each parameter's gradient keeps the parameter's layout."""
    torch.manual_seed(0)
    model, shape = build_train("cnn", "tiny")
    x = torch.randn(shape)
    model(x).sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out, graphs = compile_with_dynamo(model, x, grad=True)
    out.sum().backward()
    (graph,) = graphs
    header = constructed_by(graph.joint)
    (line,) = [line for line in header.splitlines() if "training layout of" in line]
    expected = "nhwc" if REPLAYS[replayed]["nhwc"] < REPLAYS[replayed]["nchw"] else "nchw"
    assert line.split(" -> ")[1].startswith(expected), line
    converts = any(n.target == torch.ops.aten.clone.default and n.kwargs.get("memory_format") == torch.channels_last
                   for n in graph.joint.graph.graph.nodes)
    assert converts == (expected == "nhwc")
    for p, g in zip(model.parameters(), ref):
        assert p.grad.stride() == p.stride()
        assert_matches_eager(p.grad, g, atol=1e-4, rtol=1e-4)
