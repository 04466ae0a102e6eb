"""The CI slice of the OpInfo sweep (the full sweep: docs/testing.md).

Each op below is compiled on its float32 CPU samples and compared with eager, exactly as the
full sweep does. Ops built only from core ops (pointwise, reductions, views, softmax,
layer_norm) must lower natively; the rest must at least match eager (extern or partial).
"""
from __future__ import annotations

import functools

import pytest

from minicompile.testing.opinfo_sweep import float32_ops, sweep_op

# Must compile to loop IR with no extern call.
NATIVE = [
    "abs", "neg", "exp", "log1p", "sin", "tanh", "sigmoid", "sqrt", "rsqrt", "erf", "floor", "round",
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "remainder", "fmod", "pow",
    "maximum", "minimum", "atan2", "eq", "lt", "logical_and", "where", "clamp", "nn.functional.relu",
    "sum", "mean", "amax", "amin", "prod", "var", "var_mean", "argmax", "any", "all",
    "permute", "transpose", "t", "unsqueeze", "squeeze", "view", "reshape", "expand", "flatten",
    "select", "split", "unbind", "cat", "constant_pad_nd", "full_like", "zeros_like",
    "softmax", "log_softmax", "nn.functional.layer_norm",
]
# Must match eager, natively or through extern calls.
MATCH = ["matmul", "nn.functional.linear", "nn.functional.gelu", "as_strided.partial_views", "cumsum", "sort",
         "index_select", "gather", "nn.functional.embedding", "var.unbiased", "exp2", "empty_like", "stack"]


@functools.lru_cache(maxsize=1)
def _ops():
    return float32_ops()


@pytest.mark.parametrize("name", NATIVE)
def test_opinfo_native(name):
    result = sweep_op(_ops()[name])
    assert result.status == "native", f"{name}: {result.status}: {result.detail or result.externs}"


@pytest.mark.parametrize("name", MATCH)
def test_opinfo_matches_eager(name):
    result = sweep_op(_ops()[name])
    assert result.status in ("native", "partial", "extern"), f"{name}: {result.status}: {result.detail}"
