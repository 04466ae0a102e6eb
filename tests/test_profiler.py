"""Compiled graphs in a torch profiler trace: the graph call, each kernel call (by kernel name)
and each extern call (by op name) are named events; without a profiler the wrapper pays one
flag check per call (docs/modes.md)."""
import pytest
import torch

from minicompile.codegen import BACKENDS
from minicompile.config import patch
from minicompile.pipeline import compile_graph
from tests.helpers import assert_matches_eager


@pytest.fixture(autouse=True)
def mkl_products():
    """The events below name the product aten.mm: MKL's, not the oneDNN linear that
    cpu/claims.py may measure as faster on this machine."""
    with patch(cpu_gemm="mkl"):
        yield


def mlp_step(x, w):
    h = torch.mm(x, w)                     # an extern call (aten.mm)
    return (h.relu() * 2).sum(-1), h.exp()  # kernels


def compiled(fn, *inputs):
    return compile_graph(torch.fx.symbolic_trace(fn), list(inputs))


def profiled_events(fn, *args, profiler=torch.profiler.profile):
    with profiler() as prof:
        out = fn(*args)
    return out, list(prof.events() if hasattr(prof, "events") else prof.function_events)


PROFILERS = {
    "torch.profiler": torch.profiler.profile,
    "autograd.profiler": torch.autograd.profiler.profile,
}


@pytest.mark.parametrize("profiler", PROFILERS.values(), ids=PROFILERS.keys())
def test_kernels_externs_and_the_graph_are_named_events(profiler):
    x, w = torch.randn(16, 8), torch.randn(8, 32)
    c = compiled(mlp_step, x, w)
    assert c.num_kernels >= 1 and [e.op for e in c.externs] == ["aten::mm"]  # its event: aten.mm.default
    out, events = profiled_events(c, x, w, profiler=profiler)
    assert_matches_eager(out, mlp_step(x, w))
    names = [e.name for e in events]
    graph = [e for e in events if e.name.startswith("minicompile_graph_")]
    assert len(graph) == 1, names
    for k in c.schedule.kernels:
        assert names.count(k.name) == 1, (k.name, names)
    assert names.count("aten.mm.default") == 1, names
    inner = [e for e in events if e.name in {k.name for k in c.schedule.kernels} | {"aten.mm.default"}]
    start, end = graph[0].time_range.start, graph[0].time_range.end
    assert all(start <= e.time_range.start and e.time_range.end <= end for e in inner)


def test_each_compiled_graph_has_its_own_event_name():
    x = torch.randn(8)
    a, b = compiled(lambda t: t + 1, x), compiled(lambda t: t * 3, x)
    _, events = profiled_events(lambda: (a(x), b(x)))
    graphs = [e.name for e in events if e.name.startswith("minicompile_graph_")]
    assert len(graphs) == 2 and len(set(graphs)) == 2


def test_without_a_profiler_the_plain_call_checks_one_flag():
    c = compiled(mlp_step, torch.randn(4, 8), torch.randn(8, 4))
    plain = c.wrapper_source.split("def call_profiled")[0].split("def call(args):")[1]
    assert plain.count("_is_profiler_enabled") == 1 and "record_function" not in plain
    x, w = torch.randn(4, 8), torch.randn(8, 4)
    assert_matches_eager(c(x, w), mlp_step(x, w))


def test_torch_compile_graph_shows_its_kernels_in_the_profiler(fresh_dynamo):
    x, w = torch.randn(16, 8), torch.randn(8, 32)
    fn = torch.compile(mlp_step, backend="minicompile")
    assert_matches_eager(fn(x, w), mlp_step(x, w))  # compiled outside the profiled region
    out, events = profiled_events(fn, x, w)
    assert_matches_eager(out, mlp_step(x, w))
    names = [e.name for e in events]
    assert any(n.startswith("minicompile_graph_") for n in names), names
    assert any(n.startswith("kernel") and n.endswith(("_sum", "_pointwise")) for n in names), names
    assert "aten.mm.default" in names


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
def test_triton_kernels_are_named_events_too():
    x = torch.randn(8, 16)
    with patch(cpu_backend="triton"):
        c = compiled(lambda t: (t.sin() + 1).sum(-1), x)
    assert c.backend == "triton"
    out, events = profiled_events(c, x)
    assert_matches_eager(out, (x.sin() + 1).sum(-1))
    assert {k.name for k in c.schedule.kernels} <= {e.name for e in events}
