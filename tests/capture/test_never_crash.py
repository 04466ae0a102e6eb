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


# ---------------------------------------------------------------------- resume impossible: Python
def f_set_of_tensors(x):
    y = x * 2
    s = {y}
    z = y + len(s)
    return z * 3


def f_set_of_tensors_then_loops(x):
    y = x * 2
    s = {y}
    out = []
    for i, v in enumerate([y, y + 1]):
        out.append(v * len(s) if i % 2 == 0 else v - 1)
    scale = lambda a, b=2: a * b  # noqa: E731
    return out, {k: k * 2 for k in range(3)}, scale(y, b=3), [z for z in s][0] is y


def test_untraceable_resume_runs_in_python_and_is_reported():
    report = run_both(f_set_of_tensors_then_loops, t(3))
    assert [f.kind for f in report.fallbacks] == ["python"] and report.output[3] is True, report
    report = run_both(f_set_of_tensors, t(3))
    assert [f.kind for f in report.fallbacks] == ["python"], report
    assert "set" in report.fallbacks[0].reason


# ---------------------------------------------------------------------- crashes become breaks
def f_set_local(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    return x + len(s), 2 in s, sorted(s)


def f_set_across_break(x, s):
    s.add(5)
    print("break")
    s.add(6)
    return x + len(s), 5 in s


def test_sets_of_constants():
    check_capture(f_set_local, t(3), graphs=1, breaks=0)
    s = {1, 2}
    report = check_capture(f_set_across_break, t(3), s, graphs=1, breaks=1)
    assert report.output[1] is True
    compiled = compile(f_set_across_break)
    compiled(t(3), s)
    assert s == {1, 2, 5, 6}   # the caller's set got both writes


def f_fromkeys(x):
    d = dict.fromkeys(["a", "b"], x)
    return d["a"] + d["b"], list(d)


def f_module_keys(x, m):
    d = {m: x}
    return d[m] + 1


def f_module_keyed_arg(x, d):
    return sum(d.values()) + x


def test_fromkeys_and_non_constant_keys():
    check_capture(f_fromkeys, t(3), graphs=1, breaks=0)
    m = Doubler()
    report = run_both(f_module_keys, t(3), m)
    assert report.graph_count == 1 and not report.fallbacks, report
    report = run_both(f_module_keyed_arg, t(3), {m: t(3), "k": t(3) * 2})
    assert report.graph_count == 1 and not report.fallbacks, report
    report = run_both(f_module_keyed_arg, t(3), {(1, 2): t(3), 3.5: t(3) * 2})   # keys compared by value
    assert [f.kind for f in report.fallbacks] == ["eager"] and "keys" in report.fallbacks[0].reason, report


def f_numpy_scalar(x):
    return x * np.float32(2.0) + np.float64(1.5), np.int64(3) + 1


def f_numpy_array(x):
    a = np.arange(3, dtype=np.float32)
    return x + torch.as_tensor(a) * float(a.sum())


def test_numpy_values_never_reach_generated_code():
    check_capture(f_numpy_scalar, t(3), graphs=1, breaks=0)
    report = run_both(f_numpy_array, t(3))
    assert not report.fallbacks, report


def f_typing(x):
    def inner(y: typing.Optional[torch.Tensor], n: typing.List[int] = [1]) -> typing.Tuple[torch.Tensor]:
        return (y + n[0],)
    z: typing.Dict[str, torch.Tensor] = {"a": inner(x)[0]}
    return z["a"] * 2, inner.__annotations__["n"], typing.cast(int, 3)


def test_typing_annotations():
    report = run_both(f_typing, t(3))
    assert report.output[1] == "typing.List[int]"   # (this file's annotations are strings)


def f_tensor_type_checks(x):
    if isinstance(x, torch.Tensor) and type(x) is torch.Tensor and torch.is_tensor(x):
        return x + 1, torch.Tensor, x.__class__ is torch.Tensor
    return x - 1, None, False


def test_tensor_type_checks():
    check_capture(f_tensor_type_checks, t(3), graphs=1, breaks=0)


def f_dict_update(x):
    d = {"a": x}
    d.update({"b": x + 1}, c=[x])
    update = d.update
    update(e=x * 2)
    keys = list(d.keys())
    values = list(d.values())
    return keys, values[0] + values[1] + values[3], len(values[2])


def test_dict_update_then_views():
    check_capture(f_dict_update, t(3), graphs=1, breaks=0)


def f_no_grad_decorator(x):
    @torch.no_grad()
    def inner(y):
        return y * 2

    z = inner(x)
    return z + 1, z.requires_grad, torch.is_grad_enabled()


def test_no_grad_as_decorator_on_inner_function():
    x = t(3).requires_grad_()
    report = check_capture(f_no_grad_decorator, x, graphs=1, breaks=0)
    assert report.output[1] is False and report.output[2] is True


class Config:
    def __init__(self):
        self.a = 1


def f_instance_dict_update(x, c):
    c.__dict__.update({"a": 2, "b": 3})
    return x + c.a + c.b


def f_bound_container_method_across_break(x):
    d = {"a": x}
    update = d.update
    print("break")
    update(b=x + 1)
    return sum(d.values()), list(d)


def test_writes_through_dict_and_bound_methods_are_seen():
    c = Config()
    expected = f_instance_dict_update(t(3), Config())
    report = explain(f_instance_dict_update)(t(3), c)
    assert same(report.output, expected), report
    assert c.b == 3 and c.a == 2
    check_capture(f_bound_container_method_across_break, t(3), graphs=1, breaks=1)


# ---------------------------------------------------------------------- shape assertions
def f_shape_asserts(x):
    torch._assert(x.shape[-1] == 3, "last dim must be 3")
    assert x.dim() == 2, f"expected 2-d input, got {x.dim()}-d"
    torch._assert(x.size(0) % 2 == 0, "even batch")
    return torch.relu(x) + 1


def test_shape_asserts_are_guarded_and_removed():
    report = check_capture(f_shape_asserts, t(4, 3), graphs=1, breaks=0)
    assert report.graphs[0].ops == 2, report


def test_failing_shape_assert_raises_eagers_error():
    compiled = compile(f_shape_asserts)
    compiled(t(4, 3))
    for bad, message in ((t(4, 5), "last dim must be 3"), (t(3, 3), "even batch")):
        try:
            compiled(bad)
        except AssertionError as e:
            assert message in str(e)
        else:
            raise AssertionError("the failing assert did not raise")


def f_defaultdict_get(x, d):
    return x + d.get("a", 0) + d["b"]


def test_method_of_an_argument_object_does_not_recompile():
    d = collections.defaultdict(int, a=2, b=3)
    compiled = compile(f_defaultdict_get)
    for _ in range(3):
        assert same(compiled(t(3), d), f_defaultdict_get(t(3), d))
    assert not compiled.capture_report.recompiles, compiled.capture_report


def f_as_subclass(x):
    return x.as_subclass(torch.Tensor) * 2, type(x.as_subclass(torch.Tensor)) is torch.Tensor


def test_class_arguments_never_reach_graph_code():
    report = run_both(f_as_subclass, nn.Parameter(t(3)))   # a class cannot be spelled in the graph
    assert report.output[1] is True and not report.fallbacks, report


class Pair(collections.namedtuple("Pair", ["a", "b"])):
    """A namedtuple subclass without __slots__: its instances have a __dict__."""

    def total(self):
        return self.a + self.b


def f_namedtuple_subclass(x, p):
    q = Pair(x, x * 2)
    return p.a * q.b, q.total()


def test_namedtuple_subclass_fields():
    check_capture(f_namedtuple_subclass, t(3), Pair(t(3), t(3) + 1), graphs=1, breaks=0)
