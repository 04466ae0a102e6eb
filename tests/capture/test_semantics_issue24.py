"""Python semantics the tracer must keep exactly: builtins on constants, NumPy values read from
tensors, scalars from ``.item()``, container methods, and ``compile``'s arguments. Every case
runs the same function in plain CPython and compiled, several calls, new input data each call."""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import torch
from torch import nn

import minicompile
from minicompile.capture import compile as capture_compile


def data(call: int, *shape):
    return torch.randn(*shape or (3, 4), generator=torch.Generator().manual_seed(1000 + call))


def same(a, b) -> bool:
    if isinstance(a, (torch.Tensor, np.ndarray, np.generic)):
        return type(a) is type(b) and a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (list, tuple, collections.deque)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def run_both(fn, make_args, calls: int = 4, compiler=capture_compile):
    """``fn`` eagerly and compiled, ``calls`` times with new data; returns the compiled function."""
    compiled = compiler(fn)
    for call in range(calls):
        expected = fn(*make_args(call))
        got = compiled(*make_args(call))
        assert same(expected, got), (call, expected, got)
    return compiled


def one_tensor(call):
    return (data(call),)


# ---------------------------------------------------------------------- builtins on constants
def test_hasattr_on_none_default_is_one_graph_through_the_pipeline():
    fn = minicompile.compile(lambda x, c=None: x + (2 if hasattr(c, "m") else 3))
    for call in range(3):
        x = data(call)
        torch.testing.assert_close(fn(x), x + 3, rtol=0, atol=0)
    report = fn.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0 and not report.fallbacks, report


class _Cfg:
    scale = 2


@pytest.mark.parametrize("name, fn", [
    ("getattr None default", lambda x, c=None: x + getattr(c, "attr", 5)),
    ("getattr int/str default", lambda x: x + getattr(3, "nope", 1) + len(getattr("s", "nope", "ab"))),
    ("hasattr constants", lambda x: x + hasattr(None, "m") + hasattr(3, "real") + hasattr("s", "upper")
     + 10 * hasattr(_Cfg, "scale") + 100 * hasattr(_Cfg, "nope") + 1000 * hasattr(torch, "nope_xyz")),
    ("getattr class default", lambda x: x * getattr(_Cfg, "scale", 7) + getattr(_Cfg, "nope", 7)),
    ("isinstance/type/len/id", lambda x, c=None: x + isinstance(c, int) + (type(c) is type(None))
     + len("abc") + (id(None) == id(c)) + (id(_Cfg) == id(_Cfg)) + isinstance(3, (str, int))),
])
def test_builtins_on_constants_are_exact_and_one_graph(name, fn):
    compiled = run_both(fn, one_tensor)
    report = compiled.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0, report


class _Holder:
    pass


def f_hasattr_object(x, obj):
    return x + (1 if hasattr(obj, "m") else 2) + getattr(obj, "k", 10)


def test_missing_attribute_is_guarded_absent():
    # the same class, later with the attribute set: Python's answer changes, so must ours
    compiled = capture_compile(f_hasattr_object)
    plain, with_m = _Holder(), _Holder()
    with_m.m, with_m.k = 1, 20
    for call, obj in enumerate([plain, plain, with_m, plain, with_m]):
        x = data(call)
        assert same(f_hasattr_object(x, obj), compiled(x, obj))
    assert compiled.capture_report.break_count == 0


def f_hasattr_tensor(x, y):
    return x + hasattr(y, "tag")


def test_hasattr_of_a_tensor_attribute_set_by_the_user():
    compiled = capture_compile(f_hasattr_tensor)
    x, y = data(0), data(1)
    assert same(f_hasattr_tensor(x, y), compiled(x, y))
    y.tag = "set"
    assert same(f_hasattr_tensor(x, y), compiled(x, y))


class _Guarded:
    @property
    def value(self):
        try:
            return self.missing
        except AttributeError:   # Python catches this one: hasattr(obj, "value") is True
            return 5


def f_hasattr_property(x, obj):
    return x + hasattr(obj, "value")


def test_attribute_error_caught_inside_a_property_is_not_hasattr_false():
    run_both(f_hasattr_property, lambda call: (data(call), _Guarded()))


def test_hasattr_on_a_module_class_attribute():
    class Sub(nn.Module):
        def forward(self, x):
            return x * 2

    class Outer(nn.Module):
        sub_cls = Sub

        def forward(self, x):
            return x + hasattr(self, "sub_cls") + hasattr(self.sub_cls, "forward") + hasattr(self.sub_cls, "zz")

    model = Outer()
    compiled = run_both(lambda x: model(x), one_tensor)
    assert compiled.capture_report.break_count == 0


def test_hf_gpt2_through_the_pipeline_one_graph():
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                  bos_token_id=0, eos_token_id=1)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    compiled = minicompile.compile(model)
    with torch.no_grad():
        for call in range(3):
            ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(call))
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
    report = compiled.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0 and not report.fallbacks, report


# ---------------------------------------------------------------------- NumPy values of tensors
def _numpy_fn(body: str):
    ns: dict = {"np": np}
    exec(f"def f(x):\n    a = x.numpy()\n    return {body}\n", ns)
    return ns["f"]


@pytest.mark.parametrize("body", ["a.copy()", "a.transpose(0, 1)", "a.reshape([1, a.size])", "a.max(axis=0)",
                                  "a.all(axis=0)", "a.sum()", "a", "(a.sum() * 2, a is a, type(a), isinstance(a, np.ndarray))"])
def test_numpy_of_a_tensor_is_never_stale(body):
    fn = _numpy_fn(body)
    make = (lambda call: (data(call) > 0,)) if "all" in body else one_tensor
    compiled = run_both(fn, make)
    assert not compiled.capture_report.recompiles, compiled.capture_report


def f_numpy_scalar_math(x):
    s = x.sum().numpy()
    b = x.numpy()
    c = b
    return s * 2 + 1, -s, x * 3, (b is c), b[0]


def test_numpy_scalar_from_a_tensor_is_not_a_constant():
    compiled = run_both(f_numpy_scalar_math, one_tensor)
    assert not compiled.capture_report.recompiles, compiled.capture_report


# ---------------------------------------------------------------------- scalars from .item()
def f_item(x):
    v = x.sum().item()
    return x * v, v, x > v, x.int() - v, v / x


def test_item_scalar_is_an_input_not_a_guard():
    compiled = run_both(f_item, lambda call: (data(call, 3),), calls=100)
    report = compiled.capture_report
    assert len(report.entries) <= 3 and len(report.recompiles) == 0, report
    assert "float" in str(report), report   # the resume entry guards its type, not its value


def f_item_needs_value(x):
    v = x.sum().item()
    return x * round(v, 2) if v > 0 else x - v


def test_item_scalar_whose_value_is_needed_is_specialised_and_right():
    run_both(f_item_needs_value, lambda call: (data(call, 3),), calls=6)


def f_loop_break(x):
    for i in range(20):
        x = x + 1
        print(end="")
    return x


def test_recompile_limit_message_says_the_limit_it_applied():
    # a break outside a loop holds recompile_limit entries; inside a loop 8 times that
    with minicompile.patch(recompile_limit=2), pytest.warns(UserWarning) as w:
        run_both(f_item_needs_value, lambda call: (data(call, 3),), calls=6)
        compiled = capture_compile(f_loop_break)
        for _ in range(2):
            assert torch.equal(compiled(torch.zeros(2)), torch.full((2,), 20.0))
    msgs = [str(m.message) for m in w if "recompile limit" in str(m.message)]
    assert len(msgs) == 2, msgs
    assert "(2 entries at the resume point" in msgs[0] and "L[2] (a value on the stack) ==" in msgs[0], msgs[0]
    assert "(16 entries at the resume point" in msgs[1] and "x 8: it is inside a loop" in msgs[1], msgs[1]
    # the loop counter is an int input after its first change; the iterator's length tells the iterations apart
    assert "len(L[2] (a value on the stack).items) == " in msgs[1], msgs[1]


# ---------------------------------------------------------------------- containers
def f_deque(x):
    d = collections.deque([x, "a"])
    d.append(x + 1)
    d.extend([x * 2, "b"])
    d.insert(0, "foo")
    d.pop()
    d.extendleft(["c", x])
    d[2] = x - 1
    d.rotate(1)
    out = list(d)
    first = d.popleft()
    d.clear()
    return out, first, len(d), d


def f_deque_input(x, d):
    d.appendleft(x * 2)
    d[1] = "mid"
    d.append(len(d))
    return x + 1


def test_deque_keeps_pythons_order():
    compiled = run_both(f_deque, one_tensor)
    assert compiled.capture_report.break_count == 0, compiled.capture_report
    # a deque from the caller is traced on a copy and its final contents written back
    compiled = capture_compile(f_deque_input)
    for call in range(3):
        x = data(call)
        mine, theirs = collections.deque([x, "a", 3], maxlen=5), collections.deque([x, "a", 3], maxlen=5)
        assert same(f_deque_input(x, mine), compiled(x, theirs)) and same(mine, theirs), (mine, theirs)


def f_dicts(x):
    d = collections.defaultdict(list)
    d.setdefault("k", []).append(x)
    e = {}
    e.update([("a", x), ("b", 2)])
    e.update({"c": x * 2}, d=4)
    e.update(f=5)
    missing = e.pop("zz", 7)
    got = e.setdefault("a", None)
    return d["k"][0] + 1, e, missing, got, sorted(d)


def test_dict_methods_in_every_argument_form():
    run_both(f_dicts, one_tensor)


def f_dict_input(x, e):
    e.update([("new", x)], other=1)
    e.setdefault("s", 3)
    return e.pop("a") + x


def test_dict_from_the_caller_updated_with_pairs():
    compiled = capture_compile(f_dict_input)
    for call in range(3):
        x = data(call)
        mine, theirs = {"a": x * 2}, {"a": x * 2}
        assert same(f_dict_input(x, mine), compiled(x, theirs)) and same(mine, theirs)
