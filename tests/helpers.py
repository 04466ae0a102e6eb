"""What the tests share: compile a function or an op sample, and compare it with eager.

Every comparison goes through ``minicompile.testing.compare.mismatch`` (structure, dtype,
device, shape, eager's strides where eager's output is dense, then values), the comparator
the OpInfo sweep and the fuzzer use too; tests only choose its tolerances.
"""
from __future__ import annotations

import copy
import functools
import os

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.aot.runtime import TrainingGraph
from minicompile.backend import minicompile_backend
from minicompile.capture import compile as capture_compile
from minicompile.capture import explain as capture_explain
from minicompile.config import config
from minicompile.pipeline import compile_graph
from minicompile.testing.compare import copy_preserving_strides, mismatch, same_tolerance

# How ``compile_fn`` turns a function into an FX graph: torch.fx's symbolic tracer (Python-level
# ops, as Dynamo hands them over), or make_fx over fake tensors (ATen ops, as the sweep does).
TRACERS = {
    "symbolic": lambda fn, inputs: torch.fx.symbolic_trace(fn),
    "fake": lambda fn, inputs: make_fx(fn, tracing_mode="fake")(*inputs),
}


def assert_matches_eager(out, ref, atol: float = 1e-5, rtol: float = 1e-5, tolerances: dict | None = None,
                         strides: bool = True):
    """``out`` is eager's ``ref``: one (rtol, atol) for every float dtype, or per-dtype ``tolerances``."""
    diff = mismatch(ref, out, strides=strides, tolerances=tolerances or same_tolerance(rtol, atol))
    assert diff is None, diff


def compile_fn(fn, *inputs, trace: str = "symbolic"):
    """``fn`` compiled through the whole pipeline for ``inputs``."""
    return compile_graph(TRACERS[trace](fn, inputs), list(inputs))


def check(fn, *inputs, atol: float = 1e-5, rtol: float = 1e-5, tolerances: dict | None = None,
          trace: str = "symbolic", backend: str | None = None):
    """Compile ``fn``, run it and eager on fresh copies of ``inputs`` (strides kept), compare.

    ``backend`` also checks which code generator compiled it. Returns the CompiledGraph."""
    compiled = compile_fn(fn, *inputs, trace=trace)
    if backend is not None:
        assert compiled.backend == backend, (compiled.backend, backend)
    expected = fn(*[copy_preserving_strides(x) for x in inputs])
    actual = compiled(*[copy_preserving_strides(x) for x in inputs])
    assert_matches_eager(actual, expected, atol, rtol, tolerances)
    return compiled


class Recorder:
    """A backend that keeps what minicompile_backend returned for each graph."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(minicompile_backend(gm, example_inputs))
        return self.graphs[-1]

    @property
    def training(self) -> list:
        return [g for g in self.graphs if isinstance(g, TrainingGraph)]


def compile_with_dynamo(fn, *inputs, grad: bool = False):
    """Run ``fn`` through torch.compile(backend="minicompile") (FX nodes carry the user's source
    lines), without autograd unless ``grad``; return its output and the graphs the backend made
    (CompiledGraphs, TrainingGraphs, or what runs instead)."""
    record = Recorder()
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        out = torch.compile(fn, backend=record)(*inputs)
    return out, record.graphs


def run_sample(sample, backend: str | None = None, device: str = "cpu") -> list:
    """An op-table sample compiled with torch.compile on ``device`` matches eager; with ``backend``,
    every graph compiled with that code generator. Returns the compiled graphs."""
    fn = functools.partial(sample.fn, **sample.kwargs) if sample.kwargs else sample.fn
    move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
    with torch.no_grad():
        ref = fn(*move(sample.inputs()))
    out, graphs = compile_with_dynamo(fn, *move(sample.inputs()))
    assert_matches_eager(out, ref, sample.atol, sample.rtol)
    if backend is not None:
        assert all(getattr(g, "backend", backend) == backend for g in graphs), [getattr(g, "backend", None)
                                                                               for g in graphs]
    return graphs


def size_maps(sample) -> list[dict]:
    """The sizes a dynamic-mode sample is called at, as maps over its input sizes (op_table.resized):
    as written, every size made odd, and its first input's first size made 1. Sizes 0 and 1 and
    the sizes the sample hard-codes (``Sample.fixed``) stay."""
    sizes = [s for t in sample.inputs() if isinstance(t, torch.Tensor) for s in t.shape]
    free = sorted({s for s in sizes if s >= 2 and s not in sample.fixed})
    first = [s for s in sample.inputs()[0].shape if s in free][:1]
    return [{}, {s: s + 1 + s % 2 for s in free}, {s: 1 for s in first}]


def run_sample_dynamic(sample, device: str = "cpu") -> list:
    """An op-table sample compiled once by torch.compile(dynamic=True) (every size symbolic), then
    called at each of ``size_maps``: every result matches eager. Returns what the backend built
    (one entry per Dynamo compile: a size 1 makes Dynamo recompile, as do guards on values)."""
    from tests.op_table import resized
    fn = functools.partial(sample.fn, **sample.kwargs) if sample.kwargs else sample.fn
    record = Recorder()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=record, dynamic=True)
    with torch.no_grad():
        for size_map in size_maps(sample):
            with resized(size_map):
                ref = fn(*[t.to(device) for t in sample.inputs()])
                out = compiled(*[t.to(device) for t in sample.inputs()])
            diff = mismatch(ref, out, tolerances=same_tolerance(sample.rtol, sample.atol))
            assert diff is None, f"at sizes {size_map or 'as written'}: {diff}"
    torch._dynamo.reset()
    return record.graphs


def subprocess_env(**overrides) -> dict:
    """The environment of a Python the tests start: the test run's knobs (no eager fallback, the
    test cache directory, the GEMM, layout and attention choices), MINICOMPILE_DEBUG unset, then
    ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k != "MINICOMPILE_DEBUG"}
    env.update(MINICOMPILE_FALLBACK="0", MINICOMPILE_CACHE_DIR=config.cache_dir, MINICOMPILE_CPU_GEMM=config.cpu_gemm,
               MINICOMPILE_CONV_LAYOUT=config.conv_layout, MINICOMPILE_CPU_ATTENTION=config.cpu_attention)
    env.update(overrides)
    return env


# -- minicompile's own front end -------------------------------------------------------------------

def same(a, b, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    """Same containers (tuple is not list, same dict keys) holding matching values."""
    if torch.utils._pytree.tree_structure(a) != torch.utils._pytree.tree_structure(b):
        return False
    return mismatch(b, a, tolerances=same_tolerance(rtol, atol)) is None


def check_capture(fn, *args, graphs: int, breaks: int, fallbacks: int = 0, calls: int = 2,
                  recompiles: int = 0, **kwargs):
    """Run ``fn`` eagerly and captured (explain, then ``calls`` cache-hit calls); compare, and
    check the graphs, breaks, fallbacks and recompiles capture reported."""
    expected = fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    report = capture_explain(fn)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert same(report.output, expected), f"explain output differs\n{report.output}\n{expected}"
    assert report.graph_count == graphs, f"expected {graphs} graphs\n{report}"
    assert report.break_count == breaks, f"expected {breaks} breaks\n{report}"
    assert len(report.fallbacks) == fallbacks, f"expected {fallbacks} fallbacks\n{report}"
    compiled = capture_compile(fn)
    for _ in range(calls):
        got = compiled(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert same(got, expected), f"compiled output differs\n{got}\n{expected}"
    assert len(compiled.capture_report.recompiles) == recompiles, compiled.capture_report
    return report
