"""The CPython-differential fuzzer (``minicompile.testing.fuzz_py``): a bounded slice of its
programs, its own checks, and one regression test per front-end bug it found. Each regression
runs the function in CPython and compiled, several calls, and compares everything."""
from __future__ import annotations

import collections
import itertools

import torch

from minicompile.capture import compile as capture_compile
from minicompile.testing import fuzz_py
from minicompile.testing.fuzz_py import Program, Raised, diff, generate


def outcome(result):
    """What a call shows the user: its result, or the exception's type and message."""
    try:
        return result()
    except Exception as e:
        return Raised(type(e).__name__, str(e))


def run_both(fn, make_args, calls: int = 3):
    compiled = capture_compile(fn)
    for call in range(calls):
        eager_args, compiled_args = make_args(call), make_args(call)
        expected = outcome(lambda: fn(*eager_args))
        got = outcome(lambda: compiled(*compiled_args))
        assert diff(expected, got) is None and diff(eager_args, compiled_args, "args") is None, \
            (call, diff(expected, got), expected, got)
    return compiled


def tensor(call, shape=(3, 4)):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(call)),)


# ---------------------------------------------------------------------- the fuzzer itself
def test_ci_slice_of_programs_agrees_with_cpython():
    # 12 programs through the eager-graph backend (~1 s each on a quiet core); the 5,000-program
    # run is in docs/testing.md
    failures = [(k, fuzz_py.check(generate(k, pipeline_every=0))) for k in range(900_000, 900_012)]
    assert not [f for f in failures if f[1]], failures


def test_diff_notices_what_it_compares():
    assert diff([1, torch.ones(2)], [1, torch.ones(2)]) is None
    assert "values differ" in diff(torch.ones(2), torch.zeros(2))
    assert "raised" in diff(Raised("KeyError", "'a'"), Raised("KeyError", "'b'"))
    assert "keys" in diff({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert "type" in diff((1,), [1])


def test_a_failing_program_is_shrunk_to_the_failing_block(monkeypatch):
    program = Program(7, [["n = n + 1"], ["out.append(n)", "marker = 1"], ["acc = acc * 2"]],
                      [(70, (3, 4), 0), (71, (3, 4), 0)])
    # a stand-in front-end bug: any program whose source holds "marker" fails
    monkeypatch.setattr(fuzz_py, "check", lambda p, source=None: "bug" if "marker" in p.source() else None)
    small = fuzz_py.shrink(program)
    assert small.blocks == [["marker = 1"]] and len(small.calls) == 1, small
    assert "marker = 1" in small.reproducer("bug") and "CALLS = " in small.reproducer("bug")


# ---------------------------------------------------------------------- bugs it found
def f_groupby(x):
    return x + 1, [(k, len(list(g))) for k, g in itertools.groupby("aabbb")]


def test_groupby_groups_are_read_lazily_after_a_break():
    # the break handed the groupby to the trace as all its items read up front: every group empty
    run_both(f_groupby, tensor)


def f_list_count(x, k):
    lst = [x, 3, "s"]
    return x + 1, lst.count("s"), lst.index("s"), "s" in lst, None in lst, x in lst, lst.count(k)


def test_list_count_compares_tensors_as_python_does():
    # lst.count(7) with a tensor in the list raises in Python (the tensor's truth is ambiguous)
    run_both(f_list_count, lambda call: (*tensor(call), [7, "s", None][call]))


G_SEEN: list = []


def f_two_lists_written(x, lst, d):
    lst.append(len(lst))
    G_SEEN.append(("seen", len(G_SEEN)))
    d["k"] = len(d)
    return x + 1, lst


def test_two_written_containers_keep_their_own_contents():
    # each container's new contents were built from a temporary copy whose id a later temporary
    # reused: the global list was replayed with the argument's items
    G_SEEN.clear()
    run_both(f_two_lists_written, lambda call: (*tensor(call), [call, "s"], {"a": call}))
    assert G_SEEN == [("seen", i) for i in range(6)], G_SEEN   # CPython's and the compiled calls


class Positive:
    """A data descriptor: reads return abs(stored), writes store the value."""
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, inst, owner=None):
        return self if inst is None else abs(getattr(inst, self.name))

    def __set__(self, inst, value):
        setattr(inst, self.name, value)


class Leveled:
    level = Positive()

    def __init__(self, k):
        self.level = k


def f_descriptor_write_then_read(x, obj, n):
    obj.level = -n
    return x + obj.level, obj.level, obj._level


def test_a_write_through_a_data_descriptor_runs_its_set_and_get():
    # the write was recorded as an instance attribute and the read ran __get__ on the old object
    run_both(f_descriptor_write_then_read, lambda call: (*tensor(call), Leveled(call), call + 2))


def f_constant_tuple_identity(x):
    a = (1, 2)
    print(end="")   # a break: ``a`` is handed over to Python
    return x + 1, id(a) == id((1, 2)), a is (1, 2)


def test_a_constant_tuple_is_the_same_object_after_a_break():
    run_both(f_constant_tuple_identity, tensor)


P12 = collections.namedtuple("P", "a b")(1, 2)


def f_global_namedtuple_identity(x):
    return x + 1, id(P12) == id(P12), P12 is P12


def test_a_global_namedtuple_of_constants_keeps_its_identity():
    # id() is a break, and the namedtuple was rebuilt for it: a new object each time
    run_both(f_global_namedtuple_identity, tensor)


Point = collections.namedtuple("Point", "a b")


def f_replace_after_a_handled_error(x, lst):
    try:
        lst[len(lst)]
    except IndexError:   # the rest of the frame runs in Python: _replace is compiled on its own
        pass
    p = Point(len(lst), x * 2)
    return p._replace(b=p.b + 1), p


def f_pop_a_tensor(x, d, lst):
    return d.pop("b"), lst.pop(), d, lst, x + 1


class Holder:
    def __init__(self, t):
        self.y = t


def f_read_then_overwrite(x, obj, lst):
    a, b = obj.y, lst[0]
    obj.y = x + 1
    obj.z = a
    lst[0] = 5
    return a, b


def test_an_input_read_before_its_container_is_written_keeps_its_value():
    # seed 100670: the entry read ``kwds['b']`` from its source after replaying ``kwds``'s
    # emptied contents (KeyError 'b'); ``obj.z = obj.y`` got the new ``obj.y``
    run_both(f_replace_after_a_handled_error, lambda call: (*tensor(call), [call, 2]))
    run_both(f_pop_a_tensor, lambda call: (*tensor(call), {"a": 1, "b": tensor(call + 9)[0]}, [tensor(call + 5)[0]]))
    compiled = capture_compile(f_read_then_overwrite)
    for call in range(3):
        x, y0, l0 = tensor(call)[0], tensor(call + 1)[0], tensor(call + 2)[0]
        obj, lst = Holder(y0), [l0]
        a, b = compiled(x, obj, lst)
        assert a is y0 and b is l0 and obj.z is y0 and lst == [5] and torch.equal(obj.y, x + 1)
