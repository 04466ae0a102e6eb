"""Guards: recompile exactly when an input the graph depends on changes, never otherwise."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import minicompile
from minicompile.capture import compile
from tests.helpers import same

OFFSET = 1.0
UNUSED = 5


def uses_global(x):
    return x + OFFSET


def compiles(cf) -> int:
    return cf.capture_report.compile_count


def test_same_inputs_hit_the_cache():
    cf = compile(lambda x, y: x * y + 1)
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(5):
        assert same(cf(x, y), x * y + 1)
    # new values, same metadata: still one compile
    assert same(cf(torch.randn(3), torch.randn(3)).shape, torch.Size([3]))
    assert compiles(cf) == 1 and not cf.capture_report.recompiles


@pytest.mark.parametrize("change,reason", [
    (lambda x: x.double(), "dtype"),
    (lambda x: torch.randn(5), "shape"),
    (lambda x: x.t().contiguous().t(), "stride"),
    (lambda x: x.clone().requires_grad_(), "requires_grad"),
])
def test_tensor_metadata_recompiles(change, reason):
    def f(x):
        return x * 2 + 1
    cf = compile(f)
    x = torch.randn(4, 3) if reason == "stride" else torch.randn(3)
    cf(x)
    y = change(x)
    assert same(cf(y), f(y))
    assert compiles(cf) == 2
    assert reason in cf.capture_report.recompiles[0].guard
    cf(x)
    cf(y)
    assert compiles(cf) == 2  # both entries are cached now


def test_global_change_recompiles_and_is_not_stale():
    global OFFSET
    cf = compile(uses_global)
    x = torch.zeros(2)
    assert same(cf(x), x + 1.0)
    OFFSET = 2.0
    try:
        assert same(cf(x), x + 2.0)
        assert compiles(cf) == 2 and "OFFSET" in cf.capture_report.recompiles[0].guard
    finally:
        OFFSET = 1.0


def test_unrelated_global_change_does_not_recompile():
    global UNUSED
    cf = compile(uses_global)
    cf(torch.zeros(2))
    UNUSED = 6
    cf(torch.zeros(2))
    assert compiles(cf) == 1


def test_python_constant_argument_recompiles():
    cf = compile(lambda x, k: x * k)
    x = torch.ones(2)
    assert same(cf(x, 2), x * 2)
    assert same(cf(x, 3), x * 3)
    assert same(cf(x, 2.0), x * 2.0)   # same value, different type: own entry
    assert compiles(cf) == 3


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 2.0
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale


def test_module_attribute_change_recompiles():
    m = Scaled().eval()
    cm = compile(m)
    x = torch.randn(2, 3)
    cm(x)
    m.scale = 3.0
    assert same(cm(x), m(x))
    assert compiles(cm) == 2 and "scale" in cm.capture_report.recompiles[0].guard


def test_training_flag_recompiles():
    torch.manual_seed(0)
    m = Scaled().eval()
    cm = compile(m)
    x = torch.randn(64, 3)
    assert same(cm(x), m(x))
    m.train()
    out = cm(x)
    assert (out == 0).float().mean() > 0.2      # dropout active: not the stale eval graph
    assert compiles(cm) == 2 and "training" in cm.capture_report.recompiles[0].guard
    m.eval()
    assert same(cm(x), m(x))
    assert compiles(cm) == 2


def test_swapped_submodule_recompiles():
    m = Scaled().eval()
    cm = compile(m)
    x = torch.randn(2, 3)
    cm(x)
    m.lin = nn.Linear(3, 3)
    assert same(cm(x), m(x))
    assert compiles(cm) == 2


def test_grad_mode_recompiles():
    cf = compile(lambda x: x * 2)
    x = torch.randn(3, requires_grad=True)
    assert cf(x).requires_grad
    with torch.no_grad():
        out = cf(x)
    assert not out.requires_grad
    assert compiles(cf) == 2 and "_grad()" in cf.capture_report.recompiles[0].guard
    with torch.no_grad():
        cf(x)
    cf(x)
    assert compiles(cf) == 2


def test_function_identity_guard():
    def double(v):
        return v * 2

    def triple(v):
        return v * 3

    cf = compile(lambda x, fn: fn(x))
    x = torch.ones(2)
    assert same(cf(x, double), x * 2)
    assert same(cf(x, triple), x * 3)
    assert compiles(cf) == 2


def test_closure_cell_guard():
    def make(k):
        def f(x):
            return x * k
        return f

    ctx_fn = compile(make(2))
    assert same(ctx_fn(torch.ones(2)), torch.ones(2) * 2)


def test_list_argument_guards_length_and_elements():
    cf = compile(lambda xs: sum(xs))
    a, b = torch.ones(2), torch.ones(2) * 2
    assert same(cf([a, b]), a + b)
    assert same(cf([a, b, a]), a + b + a)
    assert same(cf([a, b]), a + b)
    assert compiles(cf) == 2


def test_aliased_inputs_guarded():
    def f(x, y):
        x.add_(1)
        return y * 1
    cf = compile(f)
    a, b = torch.zeros(2), torch.zeros(2)
    assert same(cf(a, b), torch.zeros(2))
    c = torch.zeros(2)
    assert same(cf(c, c), torch.ones(2))   # aliasing differs: new entry, in-place visible
    assert compiles(cf) == 2


def test_recompile_limit_runs_eagerly_with_one_warning():
    cf = compile(lambda x, k: x + k)
    x = torch.zeros(1)
    with minicompile.patch(recompile_limit=3), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for k in range(10):
            assert same(cf(x, k), x + k)
    msgs = [str(m.message) for m in w if "recompile limit" in str(m.message)]
    assert len(msgs) == 1 and "L[1] (k) == " in msgs[0] and "(3 entries at its start)" in msgs[0]
    assert compiles(cf) == 3
    assert cf.capture_report.recompiles[-1].limit_hit


def test_guard_check_is_one_compiled_function():
    from minicompile.capture import explain
    report = explain(lambda x: x + 1)(torch.ones(2))
    src = report.entries[0].check_source
    assert src.startswith("def check(L):") and src.count("return") == 2 and " and " in src
