"""The loop IR is a frozen value that prints every buffer, and a DEBUG / inspect stage shows it."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from minicompile.config import patch
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import ComputedBuffer, ExternKernel
from minicompile.pipeline import compile_graph
from minicompile.report.artifacts import aten_graph_text
from minicompile.scheduler.caps import BackendCaps
from minicompile.scheduler.fusion import ExternStep, schedule

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _compile(fn, *inputs):
    torch._dynamo.reset()
    got = []

    def backend(gm, example_inputs):
        got.append(compile_graph(gm, example_inputs))
        return got[-1]

    expected = fn(*[x.clone() for x in inputs])    # fn may mutate its inputs
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    torch.testing.assert_close(out, expected)
    return got[0]


def norm_softmax(x, w):
    return torch.softmax(F.layer_norm(x, (x.shape[-1],), w) * 2.0, dim=-1)


def cumsum_then_mutate(x, y):
    y.mul_(2.0)
    return torch.cumsum(x, dim=1) + y


@pytest.fixture(scope="module")
def softmax_graph():
    return _compile(norm_softmax, torch.randn(8, 32), torch.randn(32))


def test_loop_graph_is_frozen(softmax_graph):
    graph = softmax_graph.loop_graph
    assert isinstance(graph, LoopGraph)
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.buffers = ()
    with pytest.raises(TypeError):
        graph.sources["x"] = "y"


def test_printed_ir_names_every_buffer_with_its_body_and_source(softmax_graph):
    graph = softmax_graph.loop_graph
    text = str(graph)
    assert "arg0: f32[8, 32]  input 0" in text
    for buf in graph.buffers:
        assert f"\n{buf.name}: f32[" in text, buf.name
        assert f"ops.store({buf.name!r}," in text, buf.name
    assert "ops.load('arg0', 32*i0 + " in text
    assert "ops.exp(" in text and "ops.rsqrt(" in text
    assert "reduction max over r0 < 32" in text and "ops.reduction('max', " in text
    assert "def body(i0, i1):  # i0 < 8, i1 < 32" in text
    # FX nodes grouped under the user's source line they came from
    assert "test_loop_ir.py:" in text and "return torch.softmax(F.layer_norm" in text and "<- FX " in text
    assert text.rstrip().endswith(f"return ({graph.outputs[0].buffer.name},)")


def test_printed_ir_shows_externs_and_mutations():
    compiled = _compile(cumsum_then_mutate, torch.randn(4, 16), torch.randn(4, 16))
    graph = compiled.loop_graph
    text = str(graph)
    ext = next(b for b in graph.buffers if isinstance(b, ExternKernel))
    assert f"{ext.name}: f32[4, 16]  extern aten.cumsum.default(arg" in text and ", 1)\n" in text
    assert "# runs eagerly: no lowering for aten::cumsum" in text
    writer = next(b for b in graph.buffers if isinstance(b, ComputedBuffer) and b.mutates)
    assert f"pointwise, writes input {writer.mutates}" in text


def test_schedule_keeps_reads_and_the_caps_it_was_made_for():
    compiled = _compile(cumsum_then_mutate, torch.randn(4, 16), torch.randn(4, 16))
    caps = BackendCaps(row_scratch=False, pass_pointers=False)
    plan = schedule(compiled.loop_graph, caps)
    assert plan.caps is caps
    extern = next(s for s in plan.steps if isinstance(s, ExternStep))
    assert extern.reads == {extern.buffer.args[0].buffer.name} and extern.reads <= {"arg0", "arg1"}


def test_non_contiguous_buffers_print_their_strides():
    compiled = _compile(lambda x: x * 2, torch.randn(4, 6).t())   # eager keeps the input's layout
    text = str(compiled.loop_graph)
    assert "arg0: f32[6, 4] strides (1, 6)  input 0" in text
    assert "buf0: f32[6, 4] strides (1, 6)  pointwise" in text


def test_aten_graph_is_stamped_with_its_passes(softmax_graph):
    head = aten_graph_text(softmax_graph).splitlines()[0]
    assert head.startswith("# Constructed by trace_inference: lift ")
    for name in ("functionalize", "dce", "epilogues", "restride", "alias_outputs"):
        assert f" {name} " in head, name


LAYERNORM_SOFTMAX = os.path.join(ROOT, "examples", "layernorm_softmax.py")


def test_debug_level_3_prints_the_loop_ir():
    env = dict(os.environ, MINICOMPILE_DEBUG="3", PYTHONPATH=os.path.abspath(ROOT))
    proc = subprocess.run([sys.executable, LAYERNORM_SOFTMAX], cwd=os.path.dirname(LAYERNORM_SOFTMAX),
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "loop IR (one body per buffer)" in out
    ir = out.split("loop IR (one body per buffer)", 1)[1]
    assert "def body(" in ir and "ops.load(" in ir and "ops.store(" in ir
    assert "layernorm_softmax.py:9:" in ir
    assert out.index("ATen graph") < out.index("loop IR") < out.index("fusion groups")


def test_inspect_shows_the_loop_ir(tmp_path):
    script = tmp_path / "target.py"
    script.write_text(textwrap.dedent("""
        import torch

        def model(x):
            return torch.exp(x) * 2.0

        example_inputs = (torch.randn(4, 8),)
    """))
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    env.pop("MINICOMPILE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "minicompile.cli", "inspect", str(script), "--stages", "ir",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "graph 0: loop IR" in proc.stdout and "ops.exp(" in proc.stdout
    assert "ops.exp(" in (tmp_path / "out" / "graph0" / "loop_ir.txt").read_text()


def test_cpu_policy_claims_onednn_linear_and_the_ir_says_why():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32).eval()
    with patch(cpu_gemm="onednn", cpu_epilogue="fused"):
        compiled = _compile(lambda x: F.gelu(layer(x)) * 2, torch.randn(8, 64))
    text = str(compiled.loop_graph)
    assert "extern mkldnn._linear_pointwise.default(" in text and "'gelu', [], 'none')" in text
    assert "# runs eagerly: oneDNN's linear with gelu as its post-op: pinned by MINICOMPILE_CPU_EPILOGUE=fused" in text
    with patch(cpu_gemm="onednn", cpu_epilogue="separate"):
        compiled = _compile(lambda x: F.gelu(layer(x)) * 2, torch.randn(8, 64))
    assert "# runs eagerly: oneDNN's linear: pinned by MINICOMPILE_CPU_GEMM=onednn" in str(compiled.loop_graph)
    with patch(cpu_gemm="mkl"):   # the claim declines: the neutral decomposition runs
        compiled = _compile(lambda x: layer(x) * 2, torch.randn(8, 64))
    assert "mkldnn" not in str(compiled.loop_graph) and "extern aten.mm.default(" in str(compiled.loop_graph)


@pytest.mark.parametrize("faster", ["onednn", "mkl"])
def test_a_measured_gemm_choice_prints_its_timings_in_the_aten_header_and_the_reason(monkeypatch, faster):
    # cpu/claims.py gemm_decision: the ATen graph's header names the choice with both timings, and
    # the extern's reason says it was measured (not "measured or pinned")
    from minicompile.aot.passes import constructed_by
    from minicompile.cpu import timing
    times = {faster: 1e-3, ({"onednn", "mkl"} - {faster}).pop(): 2e-3}
    monkeypatch.setattr(timing, "_library_choices", {})
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)
    monkeypatch.setattr(timing, "save_choice", lambda *args: None)     # keep the made-up timing off disk
    monkeypatch.setattr(timing, "_interleaved_best", lambda candidates: dict(times))
    layer = torch.nn.Linear(64, 32).eval()
    with patch(cpu_gemm="auto"):
        compiled = _compile(lambda x: layer(x) * 2, torch.randn(8, 64))
    header = constructed_by(compiled.aten)
    other = "mkl" if faster == "onednn" else "onednn"
    assert (f"# cpu: mm 8x64x32 (row @ column) -> {faster} ({faster} 1.000 ms, {other} 2.000 ms; "
            "mkl kept unless onednn is 10% faster)") in header
    text = str(compiled.loop_graph)
    if faster == "onednn":
        assert ("# runs eagerly: oneDNN's linear: measured faster than MKL's mm for this shape on this machine "
                "(onednn 1.000 ms, mkl 2.000 ms;") in text
    else:
        assert "mkldnn" not in text
