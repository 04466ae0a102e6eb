"""The C++ kernel plan (codegen/cpp_plan.py): each value's level is decided before C++ is
spelled, kept on the kernel and printed with the schedule; the emitter follows it."""
import pytest
import torch

from minicompile.codegen.cpp_plan import KernelPlan
from minicompile.config import patch
from tests.helpers import check
from tests.test_cpp_channels import _channels, batch_norm_silu

pytestmark = pytest.mark.two_threads   # parallel code under test: two threads on a test worker too (conftest.py)


def _compiled(fn, *inputs):
    with patch(cpu_backend="cpp"), torch.no_grad():
        return check(fn, *inputs)


def test_kernel_row_and_reciprocal_levels_are_planned_and_printed():
    def f(x, s):   # s is 0-d: a kernel-level load; softmax divides by a per-row sum; x[:, :1] per row
        return torch.softmax(x, -1) / s, (x - x[:, :1]).sum(-1)
    c = _compiled(f, torch.randn(8, 32), torch.tensor(2.0))
    plans = [k.values for k in c.schedule.kernels]
    assert all(isinstance(p, KernelPlan) for p in plans)
    text = str(c.schedule)
    assert "plan: loops" in text
    assert "at kernel" in text and "truediv as reciprocal" in text and "at row" in text, text
    src = c.kernel_source
    assert "(1 / " in src   # the reciprocal, spelled where the plan put it


def test_inline_sin_is_planned_with_its_row_redo():
    c = _compiled(lambda x: torch.sin(x) * 2, torch.randn(16, 40))
    text = str(c.schedule)
    assert "inline sin/cos with a row redo" in text and "sin as inline trig" in text, text
    src = c.kernel_source
    assert "mc_sin_fast(" in src and "std::sin(" in src   # the redo spells the library's sin


def test_per_channel_values_are_planned_at_their_loop_variable():
    c = _compiled(batch_norm_silu, torch.randn(2, 6, 5, 24), *_channels(24))
    text = str(c.schedule)
    assert "at channel x" in text and "sqrt at channel" in text, text


def test_every_planned_call_is_spelled():
    # the plan keeps one entry per ops call of each body, in call order: CppKernel.evaluate checks
    # the body used them all, so a plan made for another walk would fail loudly here
    c = _compiled(lambda x, y: (x * y).sum(0) + 1, torch.randn(64, 48), torch.randn(64, 48))
    assert "plan: columns over x0" in str(c.schedule)   # the column form (cpp_columns.py)
    for k in c.schedule.kernels:
        assert set(k.values.calls) == {n.name for n in k.nodes}
