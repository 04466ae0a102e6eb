"""Generator functions and ``@contextlib.contextmanager`` in traced code: what is inlined (one
graph, Python's order of side effects) and what must stay a break or fallback (a generator that
outlives the graph, cleanup on close, exceptions), each with eager's result."""
from __future__ import annotations

import contextlib
import copy
import types

import pytest
import torch

from minicompile.capture import compile, explain
from tests.helpers import same

X = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))


def _both(fn, *args):
    """Eager and compiled (twice) agree, arguments (logs) included; returns the explain report."""
    expected = fn(*copy.deepcopy(args))
    compiled = compile(fn)
    for _ in range(2):
        got = compiled(*copy.deepcopy(args))
        assert same(got, expected), f"{got}\n!=\n{expected}"
    return explain(fn)(*copy.deepcopy(args))


def _gen(x, log):
    for i in range(3):
        log.append(i)
        yield x * i


def test_generator_lazy_with_state_is_one_graph():
    def f(x, log):
        out = [v + len(log) for v in _gen(x, log)]   # reads the log the generator writes
        return out, log
    report = _both(f, X, [])
    assert report.graph_count == 1 and report.break_count == 0 and not report.fallbacks, report


def test_generator_returned_is_called_in_python_with_reason():
    # it outlives the graph unfinished: the call is a break (no fallback of the whole function)
    def f(x, log):
        return _gen(x, log)
    report = explain(f)(X, [])
    assert isinstance(report.output, types.GeneratorType)
    assert not report.fallbacks and "outlives the graph" in report.breaks[0].reason, report
    assert same(list(compile(f)(X, [])), list(f(X, [])))


def test_generator_with_finally_left_early_is_not_inlined():
    # Python runs the finally when the suspended generator is closed; the tracer does not model it
    def g(x, log):
        try:
            yield x
            yield x * 2
        finally:
            log.append("closed")

    def f(x, log):
        for v in g(x, log):
            return v + 1, log
    report = _both(f, X, [])
    assert report.break_count or report.fallbacks


def test_graph_break_inside_generator_keeps_eager_result():
    def g(x, log):
        yield x + 1
        log.append(float(x.sum()))   # needs data: a break inside the generator
        yield x * 2

    def f(x, log):
        return [v - 1 for v in g(x, log)], log
    _both(f, X, [])


def test_send_is_a_break():
    def g(x):
        y = yield x
        yield y

    def f(x):
        it = g(x)
        next(it)
        return it.send(x * 3)
    report = _both(f, X)
    assert report.break_count or report.fallbacks


@contextlib.contextmanager
def _logged(log):
    log.append("enter")
    try:
        yield len(log)
    finally:
        log.append("exit")


def test_contextmanager_body_raises_like_eager():
    def f(x, log):
        with _logged(log):
            raise ValueError("inside")
    log_eager, log_ours = [], []
    with pytest.raises(ValueError):
        f(X, log_eager)
    with pytest.raises(ValueError):
        compile(f)(X, log_ours)
    assert log_ours == log_eager == ["enter", "exit"]


def test_contextmanager_without_yield_raises_runtime_error():
    @contextlib.contextmanager
    def empty():
        if False:
            yield

    def f(x):
        with empty():
            return x + 1
    with pytest.raises(RuntimeError, match="didn't yield"):
        compile(f)(X)


def test_contextmanager_yielding_twice_raises_runtime_error():
    @contextlib.contextmanager
    def twice():
        yield
        yield

    def f(x):
        with twice():
            y = x + 1
        return y
    with pytest.raises(RuntimeError, match="didn't stop"):
        compile(f)(X)


def test_contextmanager_on_a_module_method_is_one_graph():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @contextlib.contextmanager
        def scaled(self, k):
            yield self.lin.weight * k

        def forward(self, x):
            with self.scaled(2) as w:
                return x @ w.t()
    m = M()
    with torch.no_grad():
        expected = m(X)
        report = explain(m)(X)
        assert same(compile(m)(X), expected)
    assert same(report.output, expected)
    assert report.graph_count == 1 and not report.fallbacks, report
