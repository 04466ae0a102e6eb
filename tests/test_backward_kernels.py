"""Backward-shaped CPU kernels: column reductions (codegen/cpp_columns.py) and per-row loads
moved out of a loop (codegen/cpp.py, CppOps.before_loop). Each case is compared with eager and
the generated C++ is checked for the loop form that makes it fast."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from minicompile.config import patch
from tests.helpers import check

pytestmark = pytest.mark.two_threads   # parallel code under test: two threads on a test worker too (conftest.py)


def _cpp(fn, *inputs, **tol):
    with patch(cpu_backend="cpp"):
        return check(fn, *inputs, **tol).kernel_source


COLUMN_CASES = {   # name: (fn, input shapes) - sums over rows, one result per column
    "bias_grad": (lambda g: g.sum(0), [(256, 96)]),
    "ragged_block": (lambda g: g.sum(0), [(33, 100)]),      # 100 columns: a last block of 36
    "fused_pointwise": (lambda a, b: (a * b).sum(0), [(64, 128), (64, 128)]),
    "two_sums_3d": (lambda g, x: ((g * x).sum((0, 1)), g.sum((0, 1))), [(4, 16, 64), (4, 16, 64)]),
    "keepdim_prod": (lambda g: (g.sigmoid() + 0.5).prod(0, keepdim=True), [(24, 80)]),
    # LayerNorm's weight gradient: a per-row mean and scale, loaded once per row
    "per_row_values": (lambda g, x, m, s: (g * ((x - m) * s)).sum(0), [(64, 128), (64, 128), (64, 1), (64, 1)]),
}


@pytest.mark.parametrize("name", COLUMN_CASES)
def test_column_reductions_interchange_their_loops(name):
    fn, shapes = COLUMN_CASES[name]
    torch.manual_seed(0)
    source = _cpp(fn, *[torch.randn(s) for s in shapes], rtol=1e-4, atol=1e-4)
    assert "x0_block" in source, source   # rows outer, a block of columns in the SIMD loop


def test_spatial_mean_of_nhwc_data_runs_column_blocks_per_image():
    """Squeeze-excite's mean over H and W of channels-last data: the batch loops around the
    column blocks, and the mean's division runs per column after its sum."""
    x = torch.randn(3, 40, 32, 24).contiguous(memory_format=torch.channels_last)
    source = _cpp(lambda x: x.mean((2, 3), keepdim=True), x, rtol=1e-5, atol=1e-6)
    assert "x1_block" in source and "collapse(2)" in source, source


@pytest.mark.parametrize("fn", [lambda g: g.sum(1), lambda g: g.amax(0)], ids=["row_sum", "column_max"])
def test_row_reductions_and_max_keep_the_row_loop(fn):
    """A contiguous row is reduced as before; so is a max, whose NaN tracking the column form
    does not do."""
    assert "x0_block" not in _cpp(fn, torch.randn(48, 72))


def test_per_row_loads_leave_the_loop():
    """LayerNorm's var_mean subtracts x[row, 0] (a per-row shift); loaded inside the loop that
    also stores, it kept g++ from vectorising that loop (and its erf)."""
    w, b = torch.randn(256), torch.randn(256)
    source = _cpp(lambda x: F.gelu(F.layer_norm(x, (256,), w, b)), torch.randn(32, 256), rtol=1e-4, atol=1e-5)
    loops = re.findall(r"for \(int64_t r0 = 0;[^\n]*\n\s*\{(.*?)\n\s*\}", source, re.S)
    assert loops, source
    for body in loops:
        for ptr, index in re.findall(r"= (arg\d+|buf\d+)\[([^\]]*)\];", body):
            assert "r0" in index, f"{ptr}[{index}] is loaded in every iteration of:\n{body}"
