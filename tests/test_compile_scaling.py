"""Compile time grows linearly with the graph: a chain of 2N identical blocks costs every stage
twice the work of N blocks, not four times (issue 15: no stage superlinear in the nodes).

Work is counted, not timed: the Python calls each stage makes (cProfile's call counts, exact
and the same on a busy machine). Linear work doubles, give or take the blocks at the ends;
work that walks the whole graph per node quadruples. Two things this caught: the fusion
scheduler scanned every kernel so far for each buffer, and lowering inlined a residual stream
``x + f(x)`` into each next block, so block k reloaded every f(x) before it.
"""
import cProfile
import pstats

import pytest
import torch
import torch.nn as nn

from minicompile import pipeline
from minicompile.codegen import BACKENDS
from minicompile.lowering import lower
from minicompile.scheduler.fusion import schedule

N = 4


class ResidualBlock(nn.Module):
    """LayerNorm, Linear (an extern GEMM), GELU, softmax (two reductions), residual add."""

    def __init__(self, d=32):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.ln(x))).softmax(-1)


def _aten_graph(blocks: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[ResidualBlock() for _ in range(blocks)]).eval()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(torch.randn(4, 32))
    (gm, example_inputs), = graphs
    return pipeline._trace(gm, list(example_inputs)).gm


def _counted(fn, *args, **kwargs):
    """(fn's result, {function: calls}) over minicompile's own functions, and the total calls."""
    prof = cProfile.Profile()
    result = prof.runcall(fn, *args, **kwargs)
    stats = pstats.Stats(prof).stats
    ours = {f"{file.rsplit('minicompile/', 1)[-1]}:{line}:{name}": calls
            for (file, line, name), (calls, *_) in stats.items() if "/minicompile/" in file}
    return result, ours, sum(calls for calls, *_ in stats.values())


def stage_calls(blocks: int) -> dict:
    be = BACKENDS["cpp"]
    aten = _aten_graph(blocks)
    loops, *lowered = _counted(lower, aten, compute_expensive_once=be.caps.row_scratch)
    plan, *scheduled = _counted(schedule, loops, be.caps)
    _, *generated = _counted(pipeline._generate, be, loops, plan)
    return {"lower": lowered, "schedule": scheduled, "codegen": generated}


@pytest.fixture(scope="module")
def calls():
    return stage_calls(N), stage_calls(2 * N)


@pytest.mark.parametrize("stage", ["lower", "schedule", "codegen"])
def test_stage_work_doubles_with_the_graph(calls, stage):
    (_, small), (_, large) = calls[0][stage], calls[1][stage]
    assert large / small < 2.3, f"{stage}: {small} calls for {N} blocks, {large} for {2 * N}"


@pytest.mark.parametrize("stage", ["lower", "schedule", "codegen"])
def test_no_function_called_superlinearly_often(calls, stage):
    (small, _), (large, _) = calls[0][stage], calls[1][stage]
    grew = {fn: (small[fn], n) for fn, n in large.items() if small.get(fn, 0) >= 30 and n / small[fn] > 2.5}
    assert not grew, f"{stage}: calls for {N} -> {2 * N} blocks: {grew}"
