"""The kernels of training graphs: how many passes over memory they make, compared with eager.

Each case compiles a forward and backward through torch.compile(backend="minicompile"),
checks every gradient against eager's, then checks the schedule for a pass the step does not
need: a value stored twice, a row-reduced value stored only to be read back by the next
kernel, a column sum sharing a loop with a row map.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from minicompile.config import patch
from minicompile.ir.nodes import Reduction, prod
from minicompile.tools.workloads import Block
from tests.helpers import Recorder, assert_matches_eager, check

TOL = dict(rtol=1e-4, atol=1e-5)


def _train_step(model, x):
    """One forward and backward compiled (cpp) and eagerly; the gradients match; the TrainingGraph."""
    torch.manual_seed(0)
    reference = copy.deepcopy(model)
    rec = Recorder()
    torch._dynamo.reset()
    with patch(cpu_backend="cpp"):
        xc = x.clone().requires_grad_(True)
        torch.compile(model, backend=rec)(xc).backward(torch.ones(model(x).shape))
    xr = x.clone().requires_grad_(True)
    reference(xr).backward(torch.ones(model(x).shape))
    assert_matches_eager([xc.grad] + [p.grad for p in model.parameters()],
                         [xr.grad] + [p.grad for p in reference.parameters()], **TOL)
    (graph,) = rec.training
    return graph


def _stored(kernel) -> list:
    return [n for n in kernel.nodes if n.name not in kernel.local | kernel.scratch]


def test_a_softmax_read_by_a_bmm_and_saved_for_backward_is_stored_once(fresh_dynamo):
    """The attention's probabilities reach the bmm through a view and are saved for backward;
    the extern used to realize the view and the output the softmax itself: two buffers."""
    graph = _train_step(Block(16, heads=2, seq=8), torch.randn(2, 8, 16))
    (softmax,) = [k for k in graph.forward.schedule.kernels
                  if any(isinstance(n.data, Reduction) and n.data.reduction_type == "max" for n in k.nodes)]
    assert len(_stored(softmax)) == 1, [n.name for n in _stored(softmax)]


def test_a_value_read_by_an_extern_through_a_view_is_one_buffer():
    """Inference too: ``s`` is an output and the bmm reads ``s`` viewed as 3-d."""
    def fn(a, v):
        s = torch.softmax(a, -1)
        return s, s @ v
    compiled = check(fn, torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 4), trace="fake", rtol=1e-4)
    stored = [n for k in compiled.schedule.kernels for n in _stored(k)]
    assert len(stored) == 1, [n.name for n in stored]


def test_an_output_saved_for_backward_is_stored_once(fresh_dynamo):
    """A softmax at the end of the model is the user's output and saved for backward: the forward
    graph returns the node twice, and each return used to realize its own copy."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Softmax(dim=-1))
    graph = _train_step(model, torch.randn(8, 16))
    (softmax,) = graph.forward.schedule.kernels
    assert len(_stored(softmax)) == 1, [n.name for n in _stored(softmax)]


def test_layer_norm_backward_keeps_row_sums_in_registers_and_column_sums_apart(fresh_dynamo):
    """LayerNorm backward: the input gradient needs two sums along each row, the weight and bias
    gradients are sums down the columns. The row sums and the input gradient are one kernel
    (the sums never stored); the column sums have their own blocked loop."""
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())
    graph = _train_step(model, torch.randn(32, 64))
    kernels = graph.backward.schedule.kernels
    row_sums = {n.name: k for k in kernels for n in k.nodes
                if isinstance(n.data, Reduction) and prod(n.data.ranges) == 32}
    assert row_sums and all(name in k.local for name, k in row_sums.items()), row_sums
    columns = [k for k in kernels if k.outer_ranges == (64,) and k.is_reduction]
    assert columns and all(set(k.level.values()) == {"reduction"} for k in columns), \
        [(k.name, k.level) for k in columns]
    assert graph.backward.kernel_source.count("x0_block") >= 3 * len(columns)


def test_a_column_sum_and_a_row_map_of_one_input_are_two_kernels():
    """They read the same array in transposed orders: one loop nest would stride one of them."""
    with patch(cpu_backend="cpp"):
        compiled = check(lambda g: (g.sum(0), g * 2.0 + 1.0), torch.randn(48, 96), rtol=1e-4, atol=1e-5)
    assert len(compiled.schedule.kernels) == 2
    assert "x0_block" in compiled.kernel_source


def test_sibling_reductions_of_one_input_still_share_a_kernel():
    """Joining only for a shared load stays: both sums read x[row, col] in the same iteration."""
    with patch(cpu_backend="cpp"):
        compiled = check(lambda x: (x.sum(1), (x * x).sum(1)), torch.randn(16, 32), rtol=1e-4, atol=1e-5)
    assert len(compiled.schedule.kernels) == 1


def test_slices_of_one_matmul_stay_one_pointwise_kernel():
    """q, k and v cut from one projection read disjoint columns: no shared load, but a pointwise
    kernel loses nothing by looping over all three (the rule above is for reduction kernels)."""
    def fn(x):
        q, k, v = x.split(8, dim=-1)
        return q.transpose(0, 1) + 1.0, k.transpose(0, 1) * 2.0, v.transpose(0, 1) - 1.0
    with patch(cpu_backend="cpp"):
        compiled = check(fn, torch.randn(6, 4, 24), trace="fake")
    assert len(compiled.schedule.kernels) == 1
