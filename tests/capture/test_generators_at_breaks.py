"""Generators and generator expressions that meet a graph break: a generator live across a
break is the program's own generator object, stepped in Python when its consumer asks (its
side effects interleave with the consumer's as in CPython); a generator expression the tracer
inlines and consumes inside the graph is still captured. Each case runs in CPython and compiled,
several calls, new data each call."""
from __future__ import annotations

import itertools

import torch
from torch import nn

from minicompile.capture import compile as capture_compile
from minicompile.capture import explain
from tests.helpers import same

LOG: list = []


def data(call: int, *shape):
    return torch.randn(*shape or (3, 4), generator=torch.Generator().manual_seed(500 + call))


def check(fn, make_args, calls: int = 3):
    """``fn`` compiled gives CPython's results and leaves the same LOG, call after call."""
    compiled = capture_compile(fn)
    for call in range(calls):
        LOG.clear()
        expected, expected_log = fn(*make_args(call)), list(LOG)
        LOG.clear()
        got = compiled(*make_args(call))
        assert LOG == expected_log, (call, LOG, expected_log)
        assert same(got, expected), (call, got, expected)
    return compiled


MLP = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def f_sum_over_parameters(x):
    return x + sum(p.sum() for p in MLP.parameters()), len(list(MLP.parameters()))


def test_sum_of_a_genexpr_over_module_parameters():
    # Module.parameters() runs in Python (a break) and its generator is handed over lazily;
    # the generator expression over it was compiled through its own cache as a frame that
    # collected its items, and lost those yielded before its breaks: the sum came out 0
    with torch.no_grad():
        check(f_sum_over_parameters, lambda call: (data(call, 4),))
        report = explain(f_sum_over_parameters)(data(0, 4))
    assert not report.fallbacks and report.graph_count == 1, report


def f_genexpr_with_a_break_inside(x):
    return sum(print(end="") or x * i for i in range(4)), list(print(end="") or x + i for i in range(3))


def test_a_genexpr_whose_body_breaks_yields_every_item():
    check(f_genexpr_with_a_break_inside, lambda call: (data(call),))


def f_genexpr_inlined(x):
    return sum(x * i for i in range(4)), tuple(t + 1 for t in x.unbind(0))


def test_a_genexpr_inlined_and_consumed_in_the_graph_is_one_graph():
    check(f_genexpr_inlined, lambda call: (data(call),))
    report = explain(f_genexpr_inlined)(data(0))
    assert report.graph_count == 1 and report.break_count == 0 and not report.fallbacks, report


def produce(x, m):
    for i in range(m):
        LOG.append(("gen", i))
        print(end="")   # a break in its body: the generator runs in Python
        yield x * i


def f_generator_partly_before_and_after_a_break(x):
    g = produce(x, 4)
    first = next(g)
    LOG.append(("first", 0))
    print(end="")    # a break with the generator half-way
    same = iter(g) is g
    rest = []
    for v in g:
        LOG.append(("body", len(rest)))
        rest.append(v + 1)
    return first, torch.stack(rest), same, next(g, "done")


def test_a_generator_consumed_partly_before_and_partly_after_a_break():
    check(f_generator_partly_before_and_after_a_break, lambda call: (data(call),))


def f_generator_after_a_handled_error(x, n):
    try:
        [][n]
    except IndexError:   # from here the frame runs in Python
        LOG.append("handled")

    def numbers(m):
        for i in range(m):
            LOG.append(("gen", i))
            yield i
    g = numbers(n + 3)
    a = next(g)
    for v in g:
        LOG.append(("body", v))
        if v == n + 1:
            break
    return x * a, list(g)


def test_a_generator_in_a_frame_running_in_python_is_stepped_lazily():
    check(f_generator_after_a_handled_error, lambda call: (data(call), call))


def f_genexpr_in_a_for_loop(x):
    out = []
    for v in (LOG.append(("gen", i)) or x * i for i in range(3)):
        LOG.append(("body", len(out)))
        out.append(v)
    return torch.stack(out), any(LOG.append(("any", i)) or i > 1 for i in range(5))


def test_a_genexpr_runs_its_items_when_its_consumer_asks():
    # the tracer ran an inlined generator expression to its end when it was called: all its
    # ("gen", i) came before the loop body's, and any() ran it past its first true item
    check(f_genexpr_in_a_for_loop, lambda call: (data(call),))
    report = explain(f_genexpr_in_a_for_loop)(data(0))
    assert report.graph_count == 1 and report.break_count == 0 and not report.fallbacks, report


def f_genexpr_live_across_a_break(x):
    pending = (LOG.append(("gen", i)) or x * i for i in range(3))
    first = next(pending)
    print(end="")   # a break with the generator expression half-way
    out = [first]
    for v in pending:
        print(end="")
        LOG.append(("body", len(out)))
        out.append(v)
    return torch.stack(out)


def f_returns_a_genexpr(x):
    return (x + i for i in range(2))


def test_a_genexpr_live_across_a_break_is_called_in_python():
    # it existed only in the tracer: the graph could not be split there (the whole function
    # fell back); now the segment is traced again with the generator expression called natively
    check(f_genexpr_live_across_a_break, lambda call: (data(call),))
    assert not explain(f_genexpr_live_across_a_break)(data(0)).fallbacks
    got = capture_compile(f_returns_a_genexpr)(data(0))   # was a ResumeIter of its items
    assert type(got).__name__ == "generator" and torch.equal(list(got)[1], data(0) + 1)


class Countdown:
    """An iterator class in Python, logging each step."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        LOG.append(("countdown", self.n))
        return self.n


def numbers(m):
    for i in range(m):
        LOG.append(("gen", i))
        yield i


def f_iterators_over_program_code_after_a_handled_error(x):
    try:
        [][1]
    except IndexError:   # from here the frame runs in Python: each for's GET_ITER is a native step
        pass
    for a, b in zip("abc", numbers(3)):
        LOG.append(("zip", a, b))
    for v in map(lambda i: LOG.append(("map", i)) or i, [1, 2]):
        LOG.append(("body", v))
    for v in Countdown(2):
        LOG.append(("body", v))
    return x + 1, [p for p in itertools.pairwise([1, 2, 3])], list(itertools.accumulate([1, 2, 3]))


def test_an_iterator_that_runs_program_code_is_not_read_ahead_at_a_break():
    # zip over a generator, map over a lambda and an iterator class were read to their end at
    # the for's GET_ITER, running their code before the loop bodies'
    check(f_iterators_over_program_code_after_a_handled_error, lambda call: (data(call),))
