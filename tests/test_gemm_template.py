"""The packed-weight product template (cpu/gemm_template.py, runtime/packed_gemm.py): nn.Linear with and
without bias, 2-d and 3-d inputs, odd sizes, A in other layouts, against eager; the packed weight
is a prepared value, recomputed when a parameter changes; the measured choice in the header;
training graphs and graphs without prepared weights never take it."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from minicompile.config import patch
from minicompile.cpu.timing import cpu_flags
from minicompile.runtime import packed_gemm
from tests.helpers import Recorder, assert_matches_eager

pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the template needs AVX2 and FMA")

PACKED, PACK = torch.ops.minicompile.packed_mm.default, torch.ops.minicompile.pack_weight.default
# a different order of the sum than MKL's: float rounding apart, growing with K
TOL = dict(atol=1e-4, rtol=1e-4)


def check(model, x, **knobs):
    """``model(x)`` through torch.compile (parameters are the graph's static inputs) against eager; the graph."""
    record = Recorder()
    torch._dynamo.reset()
    with torch.no_grad(), patch(**knobs):
        assert_matches_eager(torch.compile(model, backend=record)(x), model(x), **TOL)
    assert len(record.graphs) == 1
    return record.graphs[0]


def targets(compiled) -> list:
    return [n.target for n in compiled.aten.gm.graph.nodes if n.op == "call_function"]


def prepared_targets(compiled) -> list:
    return [n.target for n in compiled.aten.prepared.prepare.graph.nodes] if compiled.aten.prepared else []


class Project(nn.Module):
    def __init__(self, k, n, bias=True, view=lambda x: x):
        super().__init__()
        self.fc, self.view = nn.Linear(k, n, bias=bias), view

    def forward(self, x):
        return self.fc(self.view(x))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mkn", [(1, 7, 17), (7, 33, 100), (17, 1, 33), (33, 100, 7), (100, 17, 1), (13, 300, 48)])
@pytest.mark.parametrize("rows", ["2d", "3d"])
def test_linear_matches_eager(rows, mkn, bias):
    torch.manual_seed(0)
    m, k, n = mkn
    x = torch.randn(m, k) if rows == "2d" else torch.randn(2, m, k)
    c = check(Project(k, n, bias).eval(), x, cpu_gemm="template", prepare_weights=True)
    assert targets(c).count(PACKED) == 1 and torch.ops.aten.mm.default not in targets(c), c.aten.gm.graph
    assert PACK in prepared_targets(c)          # packed once, outside the per-call graph
    assert "the packed-weight template" in c.wrapper_source and "pinned by MINICOMPILE_CPU_GEMM=template" in c.wrapper_source


@pytest.mark.parametrize("view", ["column", "strided"])
def test_other_layouts_of_a(view):
    """A column-major A is read in place; one with neither unit stride keeps the library's call."""
    torch.manual_seed(0)
    take = (lambda x: x.t()) if view == "column" else (lambda x: x[:, ::2])
    x = torch.randn(24, 19) if view == "column" else torch.randn(19, 48)
    c = check(Project(24, 40, view=take).eval(), x, cpu_gemm="template", prepare_weights=True)
    assert (PACKED in targets(c)) == (view == "column"), c.aten.gm.graph


@pytest.mark.two_threads
def test_threads_share_the_panels():
    torch.manual_seed(0)
    c = check(Project(130, 250).eval(), torch.randn(3, 50, 130), cpu_gemm="template", prepare_weights=True)
    assert PACKED in targets(c)


def test_packed_product_directly():
    """The ops themselves (the prepare graph and an eager fallback call them): odd sizes, K over one block."""
    torch.manual_seed(0)
    for m, k, n in [(1, 1, 1), (6, 257, 16), (7, 513, 31), (12, 5, 33)]:
        a, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        packed = packed_gemm.pack_weight(w.t())
        assert packed.shape == (-(-n // 16), k, 16)
        assert_matches_eager(packed_gemm.packed_mm(a, packed, b, n), torch.addmm(b, a, w.t()), **TOL)
        assert_matches_eager(packed_gemm.packed_mm(a, packed, None, n), a @ w.t(), **TOL)


@pytest.mark.parametrize("change", [
    lambda m: m.fc.weight.add_(1),
    lambda m: m.fc.bias.mul_(-2),
    lambda m: m.fc.weight.copy_(torch.randn_like(m.fc.weight)),
    lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn_like(m.fc.weight))),
], ids=["weight_add_", "bias_mul_", "weight_copy_", "new_parameter"])
def test_packed_weight_follows_a_changed_parameter(change, fresh_dynamo):
    torch.manual_seed(0)
    model, x = Project(40, 36).eval(), torch.randn(5, 40)
    record = Recorder()
    compiled = torch.compile(model, backend=record)
    with torch.no_grad(), patch(cpu_gemm="template", prepare_weights=True):
        assert_matches_eager(compiled(x), model(x), **TOL)
        assert PACKED in targets(record.graphs[0])
        change(model)
        assert_matches_eager(compiled(x), model(x), **TOL)


def test_optimizer_steps_between_inference_calls(fresh_dynamo):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 8)), torch.randn(6, 24)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    record = Recorder()
    compiled = torch.compile(model, backend=record)
    with patch(cpu_gemm="template", prepare_weights=True):
        for _ in range(3):
            with torch.no_grad():
                assert_matches_eager(compiled(x), model(x), **TOL)
            loss = model(x).square().mean()      # an eager training step between compiled evaluations
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            assert_matches_eager(compiled(x), model(x), **TOL)
    assert targets(record.graphs[0]).count(PACKED) == 2


def test_measured_choice_is_in_the_header():
    torch.manual_seed(0)
    c = check(Project(64, 96).eval(), torch.randn(48, 64), cpu_gemm="auto", prepare_weights=True)
    lines = [line for line in c.aten.choices if "packed mm 48x64x96" in line]
    assert len(lines) == 1 and "template " in lines[0] and "mkl " in lines[0] and "+ bias" in lines[0], c.aten.choices
    chosen = lines[0].split(" -> ")[1].split(" ")[0]
    assert (PACKED in targets(c)) == (chosen == "template"), (lines, c.aten.gm.graph)


@pytest.mark.parametrize("knobs", [dict(cpu_gemm="mkl", prepare_weights=True), dict(cpu_gemm="onednn", prepare_weights=True),
                                   dict(cpu_gemm="template", prepare_weights=False)],
                         ids=["mkl", "onednn", "not_prepared"])
def test_library_kept(knobs):
    """Pinned to a library, or without prepared weights (the packing would run on every call)."""
    torch.manual_seed(0)
    c = check(Project(16, 24).eval(), torch.randn(4, 16), **knobs)
    assert PACKED not in targets(c) and PACK not in prepared_targets(c)


def test_training_graphs_never_take_it(fresh_dynamo):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8)), torch.randn(6, 24)
    ref = model(x)
    ref.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rec = Recorder()
    with patch(cpu_gemm="template", prepare_weights=True):
        out = torch.compile(model, backend=rec)(x)
        out.sum().backward()
    assert_matches_eager(out, ref, **TOL)
    for p, g in zip(model.parameters(), grads):
        assert_matches_eager(p.grad, g, **TOL)
    assert len(rec.training) == 1
    for half in (rec.training[0].forward, rec.training[0].backward):
        assert PACKED not in targets(half) and PACK not in prepared_targets(half)
