"""Gathers whose indices are read from memory (lowering/gathers.py, expr.Indirect): fused into the C++
kernel that reads them, each index checked where it is read, the wrapper raising eager's error.

The bug class: an index from an input or computed at run time (token ids, T5's position buckets) in
embedding / index_select / index.Tensor, with 1-d and multi-d advanced indices, None dims, broadcast
index tensors, int32 and int64 indices. In range: eager's values and no extern call for the gather.
Negative: wrapped (index.Tensor) or refused (index_select, embedding) as eager. Out of range: eager's
exception and message, the inputs unchanged where eager leaves them so. In a training step, grads as
eager's; with symbolic sizes, one build for every size."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from minicompile.testing.compare import TOLERANCES
from tests import helpers
from tests.helpers import Recorder, assert_matches_eager

check = functools.partial(helpers.check, trace="fake", tolerances=TOLERANCES)
W = torch.randn(10, 6)
X3 = torch.randn(4, 10, 8)


def _fused(fn, *inputs):
    """Compiled ``fn`` matches eager, and no gather of it is an extern call."""
    c = check(fn, *inputs)
    assert not [e for e in c.externs if "index" in e.op], c.explain()
    return c


def _raises_as_eager(fn, *inputs):
    """Eager and compiled raise the same exception, message included; every input as eager left it."""
    eager_inputs = [x.clone() for x in inputs]
    with pytest.raises((IndexError, RuntimeError)) as eager:
        fn(*eager_inputs)
    c = helpers.compile_fn(fn, *[x.clone() for x in inputs], trace="fake")
    assert not c.externs, c.explain()
    ours = [x.clone() for x in inputs]
    with pytest.raises(eager.type) as found:
        c(*ours)
    assert str(found.value) == str(eager.value)
    for a, b in zip(ours, eager_inputs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_in_range_gathers_are_fused(dtype):
    ids = torch.tensor([[1, 2, 9], [0, 3, 4]], dtype=dtype)
    _fused(lambda i, w: F.embedding(i, w).sum(-1) * 2, ids, W)                   # a reduction reads it
    _fused(lambda i, w: F.embedding(i, w) + 1, ids, W)
    _fused(lambda i, x: x.index_select(1, i) * 2, ids[0], X3)                     # along a middle dim
    _fused(lambda i, x: x.index_select(-1, i).relu(), ids[1], X3)
    _fused(lambda i, x: x[i % 4] - 1, ids, X3)                                    # a 2-d index tensor
    _fused(lambda i, x: x[:, i].exp(), ids, X3)                                   # after a None dim
    _fused(lambda i, j, x: x[i, :, j] * 3, ids[0] % 4, ids[1] % 8, X3)                # apart: to the front
    _fused(lambda i, j, x: x[:, i[:, None], j[None, :]] + 1, ids[0], ids[1] % 8, X3)   # broadcast
    _fused(lambda i, x: x[i[:, :1], 1:3, i[:1, :] % 8] * 2, ids % 4, X3)                # a slice between
    _fused(lambda i, x: x[i, torch.arange(3)].sum(-1), ids[0] % 4, X3)            # one computed, one read
    _fused(lambda i, w: w[torch.sort(i).values] * 2, ids.flatten(), W)            # an index computed from data
    _fused(lambda i, w: (w[i.t()] * 2).sum(), ids, W)                             # a strided index tensor


def test_negative_indices_as_eager():
    neg = torch.tensor([1, -1, -10])
    _fused(lambda i, w: w[i] * 2, neg, W)                 # x[idx] wraps
    _fused(lambda i, x: x[:, i, :2] + 1, neg, X3)
    _raises_as_eager(lambda i, w: F.embedding(i, w) * 2, neg, W)          # index_select, embedding refuse
    _raises_as_eager(lambda i, x: x.index_select(1, i) * 2, neg, X3)      # dim 1: eager's RuntimeError
    _raises_as_eager(lambda i, x: x.index_select(2, i) * 2, torch.tensor([-1]), X3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_out_of_range_raises_as_eager(dtype):
    bad = torch.tensor([1, 10, 2], dtype=dtype)
    _raises_as_eager(lambda i, w: F.embedding(i, w).sum(-1), bad, W)
    _raises_as_eager(lambda i, w: w[i] + 1, bad, W)
    _raises_as_eager(lambda i, w: w[i] + 1, torch.tensor([-11], dtype=dtype), W)
    _raises_as_eager(lambda i, j, x: x[i, :, j] * 3, bad % 4, bad - 2, X3)   # the second index tensor's message
    _raises_as_eager(lambda i, x: x.index_select(1, i) * 2, bad + 1, X3)
    # a graph that writes into an input: the write waits for every check, eager raises before it too
    _raises_as_eager(lambda x, i, w: x.add_(w[i]).sum(), torch.zeros(3, 6), bad, W)
    x = torch.ones(3, 6)   # eager doubles x before it raises; the compiled graph writes after its checks
    with pytest.raises(IndexError):
        torch.compile(lambda x, i, w: (x.mul_(2), w[i].sum()), backend="minicompile")(x, bad, W)
    assert torch.equal(x, torch.ones(3, 6))
    c = check(lambda x, i, w: x.add_(w[i]).sum(), torch.zeros(3, 6), bad % 10, W)   # in range: written
    assert not c.externs


def test_every_index_is_checked_where_the_gather_is_read_in_part():
    # the index tensor is checked whole, before the gather reads it: eager checks every index even
    # where only a slice of the result is used, or the indexed dim has one element (its index math
    # reads element 0 whatever the index); found by the gather fuzz class
    bad = torch.tensor([1, 10, 2])
    _raises_as_eager(lambda i, w: w[i][:1] * 2, bad, W)
    _raises_as_eager(lambda i, w: F.embedding(i, w)[0].sum(), bad, W)
    _raises_as_eager(lambda i, x: x[:, :1][:, i] + 1, torch.tensor([0, -4]), X3)
    _fused(lambda i, x: x[:, :1][:, i] + 1, torch.tensor([0, -1]), X3)


def test_a_kernel_that_raised_is_called_again():
    f = torch.compile(lambda i, w: F.embedding(i, w) * 2, backend="minicompile")
    with pytest.raises(IndexError, match="index out of range in self"):
        f(torch.tensor([3, 12]), W)
    good = torch.tensor([3, 2])
    assert torch.equal(f(good, W), F.embedding(good, W) * 2)


def test_training_step_grads_match_eager():
    torch.manual_seed(0)
    emb, proj = torch.nn.Embedding(12, 8), torch.nn.Linear(8, 3)
    model = torch.nn.Sequential(emb, torch.nn.LayerNorm(8), proj)
    ids = torch.randint(0, 12, (4, 5))

    def step(m, ids):
        out = m(ids)
        table = m[0].weight[ids[:, 0]]     # index.Tensor on a parameter
        loss = out.square().mean() + table.sum()
        loss.backward()
        return loss

    eager_model = __import__("copy").deepcopy(model)
    ref = step(eager_model, ids)
    rec = Recorder()
    got = torch.compile(step, backend=rec)(model, ids)
    assert_matches_eager(got, ref, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert_matches_eager(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    assert rec.training and not [e for e in rec.training[0].forward.externs if "index" in e.op]


def test_symbolic_sizes_one_build():
    rec = Recorder()
    f = torch.compile(lambda i, w: F.embedding(i, w).sum(-1) + w[i[:, :1]].mean(-1), backend=rec, dynamic=True)
    for n in (3, 5, 7):
        ids = torch.randint(0, 10, (2, n))
        assert_matches_eager(f(ids, W), F.embedding(ids, W).sum(-1) + W[ids[:, :1]].mean(-1))
    assert len(rec.graphs) == 1 and not rec.graphs[0].externs, rec.graphs[0].explain()
    with pytest.raises(IndexError, match="index out of range in self"):
        f(torch.tensor([[1, 10, 2, 3]]), W)


def test_triton_keeps_the_extern_call():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    w, ids = W.cuda(), torch.tensor([1, 2, 3], device="cuda")
    c = helpers.check(lambda i, w: F.embedding(i, w) * 2, ids, w, trace="fake")
    assert [e.op for e in c.externs] == ["aten::index_select"], c.explain()
