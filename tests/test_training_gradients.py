"""Training-graph bugs the OpInfo gradient sweep and the training fuzzer found, each compiled for
training (joint trace, partition, compiled forward and backward) and compared with eager.

The CI slices of both differential runs are tests/opinfo/test_opinfo_grad_subset.py and
tests/test_fuzz_train.py; the full runs: docs/testing.md.
"""
from __future__ import annotations

import torch
import torch.fx

from minicompile.aot import trace
from minicompile.aot.runtime import TrainingGraph
from minicompile.pipeline import compile_graph
from minicompile.testing.compare import mismatch
from minicompile.testing.grad_sweep import compare_training, compile_for_training, graph_of, run_with_grads

aten = torch.ops.aten


def check_compiled_training(fn, *inputs):
    """``fn`` compiled for training (not an eager fallback) gives eager's outputs and grads."""
    compiled, status, detail = compile_for_training(graph_of(fn, len(inputs)), list(inputs))
    assert isinstance(compiled, TrainingGraph), detail
    expected, actual = run_with_grads(fn, list(inputs), 0), run_with_grads(compiled, list(inputs), 0)
    assert expected[2] > 0 and any(g is not None for g in expected[1])
    assert compare_training(expected, actual, random=False) is None, compare_training(expected, actual, False)
    return compiled


def test_inplace_on_a_view_in_a_backward_formula_reaches_its_base():
    """irfft's backward doubles a narrow of its result in place (fft_c2r_backward: ``mul_``):
    rewriting that ``mul_`` out of place dropped the doubling from the gradient (half of it
    was wrong); the joint graph is functionalized instead."""
    def fn(x):
        return (torch.fft.irfft(x, n=10, dim=1),)
    check_compiled_training(fn, torch.randn(5, 6, 7, requires_grad=True))


def test_leftover_inplace_keeps_a_mutation_of_a_view():
    def fn(x):
        y = x * 2
        y.narrow(0, 1, 2).mul_(3)
        return y
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(4))
    assert trace._functionalize_leftover_inplace(gm) == []
    assert torch.equal(gm(torch.ones(4)), fn(torch.ones(4)))


def test_inplace_pow_becomes_the_tensor_scalar_overload():
    """``pow_.Scalar`` is (Tensor, Scalar exponent): its out-of-place twin is ``pow.Tensor_Scalar``,
    not ``pow.Scalar`` (a Scalar base), which crashed the retrace of dist's backward."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(aten.pow_.Scalar, (x, 2.0))
    assert trace.out_of_place_overload(node) is aten.pow.Tensor_Scalar


def test_dist_backward():
    def fn(a, b):
        return (torch.dist(a, b, 4),)
    check_compiled_training(fn, torch.randn(5, 5, 5, requires_grad=True), torch.randn(5, 5, 5, requires_grad=True))


def test_data_dependent_backward_runs_eagerly_with_eager_grads():
    """index_put with a boolean mask: the backward indexes by the mask's nonzero positions, a
    data-dependent size the static compiler cannot take (it crashed in code generation). The
    graph runs eagerly, with the reason, and its grads are eager's."""
    mask = torch.tensor([True, True, False, True, False])

    def fn(x, v):
        return (torch.index_put(x, (mask,), v),)
    inputs = [torch.randn(5, 5, requires_grad=True), torch.randn(5, requires_grad=True)]
    compiled, status, detail = compile_for_training(graph_of(fn, 2), inputs)
    assert status == "eager-fallback" and "data-dependent shape" in detail
    assert compare_training(run_with_grads(fn, inputs, 0), run_with_grads(compiled, inputs, 0), random=False) is None


def test_hoisted_value_reading_a_temporary_of_literals():
    """quantile's backward: ``where(flag, 0, expand(0.5 * 0))`` in a kernel whose 0-d load is
    hoisted. The select was hoisted before the loop body that declares ``0.5 * 0``'s
    temporary (a C++ compile error); only literals and hoisted values may feed a hoisted one."""
    def fn(flag):
        half = aten.scalar_tensor.default(0.5, dtype=torch.float32)
        w = aten.where.self(flag, aten.scalar_tensor.default(0.0, dtype=torch.float32), (half * 0).expand(1))
        return w, w.to(torch.int64)
    flag = torch.tensor([False])
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(flag)
    assert mismatch(fn(flag), compile_graph(gm, [flag])(flag)) is None


def test_quantile_backward():
    def fn(x):
        return (torch.quantile(x, 0.5),)
    check_compiled_training(fn, torch.randn((), requires_grad=True))
