"""Never crash, never wrong: constructs the tracer once got wrong, or crashed on, each run
eagerly and through ``minicompile.compile`` with the same result (and no exception eager
would not raise). A construct the tracer cannot model is a graph break or a recorded fallback.
"""
from __future__ import annotations

import collections
import typing

import numpy as np
import torch
from torch import nn

from minicompile.capture import compile, explain
from tests.helpers import check_capture, same


def t(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + 7))


def run_both(fn, *args):
    """Eager result, explain() report and two compiled calls: all agree. Returns the report."""
    expected = fn(*args)
    report = explain(fn)(*args)
    assert same(report.output, expected), f"explain output differs\n{report.output}\n{expected}\n{report}"
    compiled = compile(fn)
    for _ in range(2):
        got = compiled(*args)
        assert same(got, expected), f"compiled output differs\n{got}\n{expected}"
    return report


# ---------------------------------------------------------------------- wrong results
def f_keys_view(x):
    d = {"a": x}
    keys, values = d.keys(), d.values()
    d["b"] = x + 1
    return len(keys), list(keys), [v * 2 for v in values]


def f_items_view(x):
    d = {"a": x}
    items = d.items()
    d["b"] = x * 3
    return [(k, v + 1) for k, v in items]


def f_view_across_break(x):
    d = {"a": x}
    keys = d.keys()
    print("break")
    d["b"] = x * 2
    return list(keys), sum(d.values())


def test_dict_views_see_later_writes():
    check_capture(f_keys_view, t(3), graphs=1, breaks=0)
    check_capture(f_items_view, t(3), graphs=1, breaks=0)


def test_dict_view_stays_live_across_a_break():
    report = check_capture(f_view_across_break, t(3), graphs=1, breaks=1)
    assert "print" in report.breaks[0].reason


def f_fstring_contains(x):
    return x + 1 if "10" in f"{x.shape[0]} bar" else x - 1


def test_substring_test_on_formatted_string():
    check_capture(f_fstring_contains, t(10), graphs=1, breaks=0)
    check_capture(f_fstring_contains, t(4), graphs=1, breaks=0)


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


def f_module_name_after_break(x, m):
    y = m(x)
    print("break")
    if "test_never_crash" in m.__module__:
        return y + 1
    return y - 1


def test_membership_on_module_name_after_break():
    m = Doubler()
    report = run_both(f_module_name_after_break, t(3), m)
    assert report.graph_count == 2 and report.break_count == 1, report
    assert same(report.output, m(t(3)) + 1)


# ---------------------------------------------------------------------- crashes at a resume
class Output(collections.OrderedDict):
    """An HF ``ModelOutput``-like result: a dict subclass whose fields are also attributes."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.__dict__.update(fields)


def make_output(x):
    return Output(hidden=x * 3, extra=None)


def f_subscript_output_after_break(x, producer):
    out = producer(x)
    print("break")
    h = out["hidden"]
    return h[:, slice(0, None)] * 2


def f_attribute_of_output_after_break(x, producer):
    out = producer(x)
    print("break")
    h = out.hidden
    return h[:, slice(-1, None)] + 1


def test_tensor_read_from_dict_subclass_after_break_is_an_input():
    for fn in (f_subscript_output_after_break, f_attribute_of_output_after_break):
        report = run_both(fn, t(2, 3), make_output)
        assert not report.fallbacks, report
        assert report.graphs[-1].ops == 2, report   # the slice and the arithmetic: one graph


def f_ordered_dict(x):
    d = collections.OrderedDict()
    d["a"] = x
    d["b"] = x + 1
    return d["a"] * d["b"]


def f_ordered_dict_views(x, d):
    keys = d.keys()
    d["c"] = x * 2
    return list(keys), [v + 1 for v in d.values()], d


def test_ordered_dict_holding_tensors():
    check_capture(f_ordered_dict, t(3), graphs=1, breaks=0)
    d = collections.OrderedDict(a=t(3), b=t(3) * 2)
    report = check_capture(f_ordered_dict_views, t(3), d, graphs=1, breaks=0)
    assert type(report.output[2]) is collections.OrderedDict and list(report.output[2]) == ["a", "b", "c"]
