"""The CI slice of the OpInfo gradient sweep (the full sweep: docs/testing.md).

Each op below is compiled for training on its float32 CPU samples (joint trace, partitioner,
compiled forward and backward graphs) and its outputs and input gradients compared with eager,
exactly as ``python -m minicompile.testing.grad_sweep`` does.
"""
from __future__ import annotations

import functools

import pytest
import torch

from minicompile.decomp.registry import DECOMPOSITIONS
from minicompile.testing.grad_sweep import grad_ops, sweep_grad_op

# Forward and backward must compile to loop IR with no extern call.
NATIVE = [
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "maximum", "where", "clamp",
    "sin", "exp", "tanh", "sigmoid", "rsqrt", "log1p", "erf",
    "sum", "mean", "amax", "var_mean", "cat", "constant_pad_nd", "triu",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.relu",
]
# Must give eager's outputs and grads, compiled with some extern calls.
MATCH = ["matmul", "index_select", "gather", "cumsum", "nn.functional.embedding", "nn.functional.mse_loss",
         "abs", "nn.functional.softplus", "prod", "fft.irfft"]


@functools.lru_cache(maxsize=1)
def _ops():
    return grad_ops()


@pytest.mark.parametrize("name", NATIVE)
def test_grad_native(name):
    result = sweep_grad_op(_ops()[name])
    assert result.status == "native", f"{name}: {result.status}: {result.detail or result.externs}"


@pytest.mark.parametrize("name", MATCH)
def test_grad_matches_eager(name):
    result = sweep_grad_op(_ops()[name])
    assert result.status in ("native", "partial", "extern"), f"{name}: {result.status}: {result.detail}"


def test_eager_fallback_is_listed_with_its_reason():
    result = sweep_grad_op(_ops()["T"])   # its output is a view of its input: training runs it eagerly
    assert result.status == "eager-fallback" and "runs eagerly" in result.detail


def test_a_wrong_backward_is_a_mismatch(monkeypatch):
    """The sweep can fail: a tanh backward off by 1% is reported as a gradient mismatch."""
    aten = torch.ops.aten
    right = DECOMPOSITIONS[aten.tanh_backward.default]
    monkeypatch.setitem(DECOMPOSITIONS, aten.tanh_backward.default, lambda g, y: aten.mul.Scalar(right(g, y), 1.01))
    result = sweep_grad_op(_ops()["tanh"])
    assert result.status == "mismatch" and "grad of input" in result.detail, result
