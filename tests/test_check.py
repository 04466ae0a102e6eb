"""MINICOMPILE_CHECK=1 (testing/check.py): a wrong kernel is named with its FX nodes and source
line, and a reproducer is written; a right graph passes silently and leaves the caller's tensors
and random stream as they would be without the check. MINICOMPILE_CPU_LIBRARIES=eager pins
eager's libraries, and the choices show where numerics may differ."""
import logging
import re
import runpy

import torch
import torch.nn.functional as F

from minicompile.config import patch
from minicompile.lowering.registry import LOWERINGS
from minicompile.aot.passes import compile_passes, trace_inference
from minicompile.cpu import CPU
from minicompile.report.artifacts import library_choices

aten = torch.ops.aten


def softsign_of_sin(x, s):
    y = x * s
    z = y.sin()  # the line the check must name
    return z / (1 + z.abs().sum(-1, keepdim=True))


def _line_of(text: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(k + 1 for k, ln in enumerate(lines) if ln.strip().startswith(text))


def test_check_names_the_kernel_of_a_wrong_lowering(monkeypatch, caplog, fresh_dynamo):
    monkeypatch.setitem(LOWERINGS, aten.sin.default, LOWERINGS[aten.cos.default])  # sin now computes cos
    x, s = torch.randn(4, 8), torch.randn(8)
    with patch(check=True), caplog.at_level(logging.WARNING, logger="minicompile"):
        out = torch.compile(softsign_of_sin, backend="minicompile")(x, s)
    assert not torch.allclose(out, softsign_of_sin(x, s))  # the check reports; the result is the compiled one
    reports = [r.getMessage() for r in caplog.records if "minicompile check" in r.getMessage()]
    assert len(reports) == 1, reports
    report = reports[0]
    assert re.search(r"first diverging step, fed eager's values of its inputs: kernel kernel\d+_\w+", report), report
    assert re.search(r"FX nodes: .*\bsin\b", report), report
    assert f"test_check.py:{_line_of('z = y.sin()')}: z = y.sin()" in report, report
    path = re.search(r"reproducer: (\S+repro\.py)", report).group(1)
    script = runpy.run_path(path, run_name="repro")  # the lowering is still wrong in this process:
    assert script["main"]() == 1                      # the reproducer reproduces it


def dropout_into_input(x, y):
    x.mul_(2)
    return F.dropout(x + y.t(), 0.5, training=True)


def test_a_right_graph_passes_silently_and_leaves_inputs_and_random_stream_as_without_the_check(caplog, fresh_dynamo):
    def run(check: bool):
        torch.manual_seed(7)
        x, y = torch.randn(6, 5), torch.randn(5, 6)
        with patch(check=check), caplog.at_level(logging.WARNING, logger="minicompile"):
            out = torch.compile(dropout_into_input, backend="minicompile")(x, y)
        return x, y, out, torch.rand(3)
    checked, plain = run(True), run(False)
    assert not [r for r in caplog.records if "minicompile" in r.getMessage()]
    for a, b in zip(checked, plain):
        assert torch.equal(a, b)


def test_library_choices_show_and_eager_pins_eagers_libraries():
    def f(q, k, v, w):
        return F.scaled_dot_product_attention(q, k, v) @ w
    qkv = [torch.randn(1, 2, 8, 4) for _ in range(3)] + [torch.randn(4, 4)]
    gm = torch.fx.symbolic_trace(f)
    with patch(cpu_gemm="onednn", cpu_attention="math"):
        measured = library_choices(trace_inference(gm, qkv, compile_passes(CPU), CPU).gm)
        with patch(cpu_libraries="eager"):
            eager = library_choices(trace_inference(gm, qkv, compile_passes(CPU), CPU).gm)
    assert "0 as eager's" in measured[0] and "1 in oneDNN" in measured[0], measured
    assert "0 in eager's fused flash kernel, 1 decomposed" in measured[1], measured
    assert "1 as eager's" in eager[0] and "0 in oneDNN" in eager[0], eager
    assert "1 in eager's fused flash kernel, 0 decomposed" in eager[1], eager


def sin_tanh(x, w):
    return (x.sin() * w).tanh()


def test_check_covers_the_backward_half_of_a_training_graph(monkeypatch, caplog, fresh_dynamo):
    monkeypatch.setitem(LOWERINGS, aten.cos.default, LOWERINGS[aten.sin.default])  # sin's gradient is now wrong
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    with patch(check=True), caplog.at_level(logging.WARNING, logger="minicompile"):
        torch.compile(sin_tanh, backend="minicompile")(x, w).sum().backward()
    reports = [r.getMessage() for r in caplog.records if "minicompile check" in r.getMessage()]
    assert len(reports) == 1, reports  # the forward matched; the backward did not
    assert re.search(r"first diverging step, fed eager's values of its inputs: kernel kernel\d+_\w+", reports[0])
    assert re.search(r"FX nodes: .*\bcos\b", reports[0]), reports[0]
