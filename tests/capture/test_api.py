"""compile()/explain() forms, custom backends, reports, and the unsupported-Python fallback."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minicompile.capture import CaptureReport, CompiledModule, api, compile, explain
from tests.helpers import same


def test_decorator_forms():
    @compile
    def f(x):
        return x + 1

    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, [tuple(t.shape) for t in example_inputs]))
        return gm.forward

    @compile(backend=backend)
    def g(x, y):
        return x @ y

    x, y = torch.randn(2, 2), torch.randn(2, 2)
    assert same(f(x), x + 1)
    assert same(g(x, y), x @ y)
    assert len(seen) == 1 and isinstance(seen[0][0], torch.fx.GraphModule)
    assert seen[0][1] == [(2, 2), (2, 2)]
    assert f.__name__ == "f"


def test_backend_result_is_what_runs():
    def negate_backend(gm, example_inputs):
        def run(*args):
            return tuple(-o for o in gm.forward(*args))
        return run

    cf = compile(lambda x: x * 2, backend=negate_backend)
    assert same(cf(torch.ones(2)), -2 * torch.ones(2))


def test_keyword_and_default_calls():
    def f(x, y=None, *, scale=1.0):
        return x * scale if y is None else (x + y) * scale

    cf = compile(f)
    x = torch.ones(2)
    assert same(cf(x), f(x))
    assert same(cf(x, scale=3.0), f(x, scale=3.0))
    assert same(cf(x, y=x), f(x, y=x))
    assert same(cf(y=x, x=x, scale=2.0), f(x, x, scale=2.0))


def test_compiled_module_is_module_like():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    cm = compile(m)
    assert isinstance(cm, CompiledModule)
    assert len(list(cm.parameters())) == 2
    cm.eval()
    assert not m.training
    x = torch.randn(2, 3)
    assert same(cm(x), m(x))
    assert cm.capture_report.graph_count == 1


def test_explain_of_a_compiled_function_or_module_explains_the_original():
    """docs/capture.md: `@compile def f`, then `explain(f)(x, y)` (it crashed inside the wrapper)."""
    @compile
    def f(x, y):
        return torch.relu(x @ y) * 2

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    report = explain(f)(x, y)
    assert report.graph_count == 1 and report.break_count == 0 and same(report.output, f(x, y))
    module = compile(nn.Sequential(nn.Linear(4, 4)))
    assert explain(module)(x).graph_count == 1


def test_explain_report_is_printable():
    def f(x):
        y = x.relu()
        print("between")
        return y.sum()

    report = explain(f)(torch.randn(3))
    assert isinstance(report, CaptureReport)
    text = str(report)
    assert "Graphs: 2" in text and "Graph breaks: 1" in text
    assert "print" in text and "test_api.py:" in text
    assert "guards of entry" in text and "relu" in text
    assert report.ops_per_graph == [1, 1]


def test_rejects_non_callables_with_a_clear_message():
    with pytest.raises(TypeError, match="expects a Python function or an nn.Module"):
        compile(42)


@pytest.mark.parametrize("fake_version", [(3, 10), (3, 14)])
def test_unsupported_python_version_falls_back(monkeypatch, fake_version):
    monkeypatch.setattr(api, "_python_version", lambda: fake_version)

    def f(x):
        return torch.sin(x) * 2

    with pytest.warns(UserWarning, match=r"3\.11-3\.13 bytecode.*falling back"):
        cf = compile(f)
    x = torch.randn(3)
    assert same(cf(x), f(x))
    report = cf.capture_report
    assert report.graph_count == 0 and report.fallbacks[0].kind == "fx"

    def g(x):
        print("side effect")
        return x + 1

    with pytest.warns(UserWarning):
        cg = compile(g)
    assert same(cg(x), x + 1)
    assert cg.capture_report.fallbacks[0].kind == "eager"


def test_unsupported_version_module_falls_back_to_fx(monkeypatch):
    monkeypatch.setattr(api, "_python_version", lambda: (3, 14))
    m = nn.Linear(3, 2)
    with pytest.warns(UserWarning):
        cm = compile(m)
    x = torch.randn(4, 3)
    assert same(cm(x), m(x))
    assert cm.capture_report.fallbacks[0].kind == "fx"


def test_compiled_callee_is_inlined_into_compiled_caller():
    inner = compile(lambda x: x * 2)
    block = compile(nn.Linear(2, 2))

    def outer(x):
        return block(inner(x) + 1)

    x = torch.randn(3, 2)
    report = explain(outer)(x)
    assert same(report.output, outer(x))
    assert report.graph_count == 1 and report.break_count == 0
