"""Graph breaks: the construct runs in Python between graphs; fallbacks when no split exists."""
from __future__ import annotations

import os

import torch
from torch import nn

from minicompile.capture import compile, explain
from tests.helpers import check_capture, same


def t(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + 1))


def f_print(x):
    y = x * 2
    print("value", y.shape)
    return y + 1


def test_print_two_graphs_prints_once_per_call(capsys):
    report = check_capture(f_print, t(3), graphs=2, breaks=1, calls=3)
    assert "print" in report.breaks[0].reason
    assert report.breaks[0].where == f"{__file__}:{f_print.__code__.co_firstlineno + 2}"
    out = capsys.readouterr().out
    # eager once, explain once, compiled 3 times: one line per call
    assert out.count("value torch.Size([3])") == 5


def f_data_dependent_if(x):
    y = x * 3
    if y.sum() > 0:
        z = y + 100
    else:
        z = y - 100
    return z * 2


def test_data_dependent_if_both_branches_across_calls():
    cf = compile(f_data_dependent_if)
    pos, neg = torch.ones(4), -torch.ones(4)
    for x in (pos, neg, pos, neg, neg, pos):
        assert same(cf(x), f_data_dependent_if(x))
    report = cf.capture_report
    assert report.break_count == 1
    assert report.graph_count == 3        # before the if, then-branch, else-branch
    assert not report.recompiles          # each branch has its own resume entry
    check_capture(f_data_dependent_if, pos, graphs=2, breaks=1)


def f_item(x):
    s = x.sum().item()
    return x * s


def f_tolist(x):
    vals = x.tolist()
    return x + len(vals) + vals[0]


def f_unsupported_builtin(x):
    y = x + 1
    ident = os.getpid() > 0
    return y * ident


class Box:
    def __init__(self, v):
        self.v = v


def f_user_class(x):
    b = Box(x * 2)       # a user class made while tracing: __init__ inlined
    return b.v + 1


def f_int_of_tensor(x):
    n = int(x.max())
    return x[:n] * 2


def f_break_in_helper(x):
    def helper(y):
        print("in helper")
        return y * 2
    return helper(x + 1) - 1


def f_break_in_loop(x):
    for i in range(3):
        x = x + i
        print(i)
    return x


def f_two_breaks(x):
    x = x + 1
    print("a")
    x = x * 2
    print("b")
    return x - 1


def test_item_breaks():
    report = check_capture(f_item, t(4), graphs=2, breaks=1)
    assert "item" in report.breaks[0].reason


def test_tolist_breaks():
    # tolist() of an input: nothing to compute before it, so only the graph after it
    check_capture(f_tolist, t(4), graphs=1, breaks=1)


def test_unsupported_builtin_breaks():
    report = check_capture(f_unsupported_builtin, t(4), graphs=2, breaks=1)
    assert "getpid" in report.breaks[0].reason


def test_user_class_constructor_is_traced():
    # the instance is made while tracing (__init__ inlined) and rebuilt if it escapes
    check_capture(f_user_class, t(4), graphs=1, breaks=0)


def test_int_of_tensor_breaks():
    check_capture(f_int_of_tensor, torch.tensor([3.0, 1.0, 2.0, 5.0]), graphs=2, breaks=1)


def test_break_inside_inlined_helper_compiles_helper_separately(capsys):
    # outer: [x+1] break(call helper) [-1]; helper: [y?] break(print) [y*2]
    report = check_capture(f_break_in_helper, t(3), graphs=3, breaks=2)
    assert capsys.readouterr().out.count("in helper") == 4


def test_break_inside_loop():
    # each iteration resumes at the same offset with a different loop state: one entry each
    check_capture(f_break_in_loop, t(3), graphs=3, breaks=3, recompiles=2)


def test_two_breaks():
    check_capture(f_two_breaks, t(3), graphs=3, breaks=2)


def f_try_except(x):
    try:
        y = x * 2
    except RuntimeError:
        y = x
    return y + 1


def f_with_block(x):
    with open(__file__) as fh:
        n = len(fh.readline())
    return x * n


def f_generator(x):
    for i in range(2):
        yield x * i


def test_try_except_traced_when_nothing_raises():
    check_capture(f_try_except, t(3), graphs=1, breaks=0)


def test_break_in_try_block_is_split():
    def f(x):
        try:
            y = x * 2
            print(end="")
        except RuntimeError:
            y = x
        return y + 1

    check_capture(f, t(3), graphs=2, breaks=1, fallbacks=0)


def test_with_block_over_a_c_context_manager_is_split():
    # open()'s __enter__/__exit__ are C: Python enters and leaves the block, the rest is traced
    report = check_capture(f_with_block, t(3), graphs=1, breaks=4, fallbacks=0)
    assert "readline" in str(report)


def test_generator_function_runs_eagerly():
    cf = compile(f_generator)
    x = t(3)
    assert same(list(cf(x)), list(f_generator(x)))
    assert cf.capture_report.fallbacks[0].kind == "eager"


def test_try_except_in_helper_is_inlined():
    def helper(y):
        try:
            return y.sin()
        except Exception:
            return y

    def f(x):
        return helper(x * 2) + 1

    check_capture(f, t(3), graphs=1, breaks=0)


def test_list_mutation_side_effect_replayed():
    def f(x, out: list):
        out.append(x * 2)
        out[0] = "first"
        return x + 1

    out = ["zero"]
    x = t(3)
    report = explain(f)(x, out)
    assert report.graph_count == 1 and report.break_count == 0
    assert out[0] == "first" and same(out[1], x * 2) and len(out) == 2
    # the cache hit replays the mutation too
    cf = compile(f)
    out2 = ["zero"]
    cf(x, out2)
    out3 = ["zero"]
    cf(x, out3)
    assert out3[0] == "first" and same(out3[1], x * 2)


def test_dict_mutation_and_object_attribute_replayed():
    class State:
        pass

    def f(x, cache: dict, st):
        cache["y"] = x + 1
        st.count = st.count + 1
        st.out = x * 3
        return x

    cf = compile(f)
    st = State()
    st.count = 0
    cache = {}
    x = t(3)
    cf(x, cache, st)
    assert same(cache["y"], x + 1) and st.count == 1 and same(st.out, x * 3)


def test_global_write_replayed():
    def f(x):
        global LAST
        LAST = x * 2
        return x + 1

    cf = compile(f)
    x = t(3)
    cf(x)
    assert same(LAST, x * 2)


def test_side_effect_before_break_is_visible_after():
    log = []

    def f(x):
        log.append("before")
        y = x + 1
        print(len(log))
        log.append("after")
        return y

    cf = compile(f)
    cf(t(2))
    assert log == ["before", "after"]


def test_closure_cell_write_replayed():
    counter = 0

    def f(x):
        nonlocal counter
        counter += 1
        return x * counter

    cf = compile(f)
    x = t(2)
    assert same(cf(x), x * 1)
    assert counter == 1
    assert same(cf(x), x * 2)   # guard on the cell's value recompiles: result not stale
    assert counter == 2


def test_fx_fallback_is_guarded_on_constants():
    def f(x, k):
        try:
            return x * k
        except ValueError:
            return x

    cf = compile(f)
    x = t(3)
    assert same(cf(x, 2), x * 2)
    assert same(cf(x, 3), x * 3)


def test_raise_in_compiled_function_propagates():
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise ValueError("bad shape")
        return y

    cf = compile(f)
    import pytest
    with pytest.raises(ValueError, match="bad shape"):
        cf(t(3))
    assert same(cf(t(4)), t(4) + 1)


def test_nn_module_break_in_forward(capsys):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def forward(self, x):
            h = self.a(x)
            if h.mean() > 100:
                h = h * 0
            return self.b(h)

    m = M()
    x = t(2, 3)
    check_capture(m, x, graphs=2, breaks=1)


def f_no_grad_block(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
    return y + z, z.requires_grad


def f_no_grad_with_break(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
        print("inside no_grad")
    w = z + y
    return w, z.requires_grad, w.requires_grad, torch.is_grad_enabled()


def test_no_grad_block_is_modeled():
    x = torch.randn(3, requires_grad=True)
    check_capture(f_no_grad_block, x, graphs=1, breaks=0)
    assert torch.is_grad_enabled()


def test_break_inside_no_grad_block():
    x = torch.randn(3, requires_grad=True)
    check_capture(f_no_grad_with_break, x, graphs=2, breaks=1)
    assert torch.is_grad_enabled()


def f_item_then_loop(x):
    n = x.sum().item()
    for _ in range(2):
        x = x * n
    return x


def f_dynamic_shape(x):
    return x[x > 0].sum() + 1


def test_item_then_python_arithmetic_on_the_value():
    report = check_capture(f_item_then_loop, t(3), graphs=2, breaks=1)
    assert report.ops_per_graph == [1, 2]


def test_dynamic_output_shape_breaks():
    report = check_capture(f_dynamic_shape, t(6), graphs=2, breaks=1)
    assert "DynamicOutputShape" in report.breaks[0].reason
