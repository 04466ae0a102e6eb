"""Selective activation checkpointing: ``checkpoint(fn, x, use_reentrant=False,
context_fn=partial(create_selective_checkpoint_contexts, policy))`` in compiled training.

Dynamo hands the region over as ``tag_activation_checkpoint`` with the user's ``context_fn`` in
its body's meta; the joint trace runs torch's checkpoint with it, so the policy is asked about
the ops eager's dispatch sees (``aten.addmm``, ``aten.bmm``, ``aten.gelu``, before our
decompositions) and every ATen node an op's decomposition made carries the op's answer. The
partitioner computes what the policy saves once, in the forward (aot/checkpoint.py ``kept``), and
recomputes the rest as for a plain checkpoint. Every test compares 3 SGD steps (or one step per
size) with eager's selective checkpoint, with the eager fallback off.
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from minicompile.aot.runtime import TrainingGraph
from minicompile.config import patch
from tests.helpers import Recorder
from tests.test_autocast_training import BF16
from tests.test_checkpoint_training import (CheckpointedBlock, _assert_same, _compiled_vs_eager, _one_training_graph,
                                            _saved_bytes)
from tests.test_training import TOL, train

aten = torch.ops.aten
LINEAR_PRODUCTS = [aten.mm.default, aten.addmm.default]     # nn.Linear's product, as eager dispatches it
PRODUCTS = LINEAR_PRODUCTS + [aten.bmm.default]              # and attention's


def saving(ops, save=CheckpointPolicy.MUST_SAVE, otherwise=CheckpointPolicy.PREFER_RECOMPUTE, seen=None):
    """A policy function: ``save`` for ``ops``, ``otherwise`` for the rest (the ops it is asked
    about are appended to ``seen``)."""
    def policy(ctx, op, *args, **kwargs):
        if seen is not None:
            seen.append(op)
        return save if op in ops else otherwise
    return functools.partial(create_selective_checkpoint_contexts, policy)


class SelectiveBlock(CheckpointedBlock):
    """CheckpointedBlock whose two checkpoints pass ``context_fn``."""

    def __init__(self, context_fn, **kwargs):
        super().__init__(**kwargs)
        self.context_fn = context_fn

    def run(self, fn, x):
        return checkpoint(fn, x, use_reentrant=False, context_fn=self.context_fn)


def _kept(report) -> list:
    """The shapes of the saved values the policy kept, sorted."""
    shapes = {s.name: list(s.shape) for s in report.saved}
    return sorted(shapes[n] for n in report.kept)


def _recomputed_ops(report) -> set:
    return {r.split(" = ")[1] for r in report.recomputed if r.split(" = ")[0] in report.checkpointed}


def test_save_linear_products_policy_trains_as_eager_and_saves_them(fresh_dynamo):
    """The common "save the matrix products, recompute the pointwise" policy, as a list of ops:
    the linear layers' products are computed once and the three the backward needs are saved (qkv's
    and the MLP's first, which the backward reads, and the attention projection's, from which the
    residual sum the second LayerNorm's backward reads is recomputed: the same bytes as saving
    that sum); nothing else of the regions is. Attention's bmm, softmax and GELU are recomputed.
    Saved bytes lie between the plain checkpoint's and no checkpoint's."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, LINEAR_PRODUCTS)
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(context_fn))
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert _kept(report) == [[16, 32], [16, 96], [16, 128]], report
    ops = _recomputed_ops(report)
    assert {"aten.bmm.default", "aten.amax.default", "aten.exp.default", "aten.erf.default"} <= ops, ops
    assert not {"aten.mm.default", "aten.addmm.default"} & ops, ops
    assert "the policy keeps" in report.checkpoint and "3 saved for the backward" in report.checkpoint
    assert "(checkpoint policy)" in str(report)
    plain = _saved_bytes(lambda: CheckpointedBlock(ckpt=False))
    recompute = _saved_bytes(CheckpointedBlock)
    assert recompute.saved_bytes < report.saved_bytes < plain.saved_bytes, \
        (recompute.saved_bytes, report.saved_bytes, plain.saved_bytes)


def test_policy_function_saving_attention_products(fresh_dynamo):
    """A policy function (ctx, op, *args, **kwargs) -> CheckpointPolicy, asked about the ops eager
    dispatches (aten.addmm and aten.bmm, not our decompositions' aten.mm): the two bmm results
    are saved, the linear products recomputed."""
    seen = []
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(saving([aten.bmm.default], seen=seen)))
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert _kept(report) == [[8, 8, 8], [8, 8, 8]], report
    assert aten.addmm.default in seen and aten.bmm.default in seen and aten.gelu.default in seen
    ops = _recomputed_ops(report)
    assert "aten.bmm.default" not in ops and {"aten.exp.default", "aten.erf.default"} <= ops, ops


def test_counting_policy_with_fresh_state_per_context(fresh_dynamo):
    """A policy that counts its calls, with its counter made in each ``context_fn()`` call (as
    torchtitan's "save every other mm"): here each region's first ``addmm`` is saved. The trace
    asks the policy once per forward it runs, each time from a fresh context, so its answers are
    eager's: qkv's product in the attention region, the MLP's first in the other."""
    def context_fn():
        count = [0]

        def policy(ctx, op, *args, **kwargs):
            if op == aten.addmm.default:
                count[0] += 1
                if count[0] == 1:
                    return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(context_fn))
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert _kept(report) == [[16, 96], [16, 128]], report
    assert "the policy keeps 4 value(s)" in report.checkpoint, report.checkpoint


@pytest.mark.parametrize("mode", ["recompute", "min_cut"])
def test_must_save_and_prefer_save(mode, fresh_dynamo):
    """GELU's output marked MUST_SAVE is computed once and saved (the MLP's second product reads
    it) under both MINICOMPILE_CHECKPOINT modes; PREFER_SAVE is honoured under ``recompute`` and
    left to the cut under ``min_cut``, which recomputes GELU from the product it saves anyway."""
    def run(save):
        got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(saving([aten.gelu.default], save)), mode)
        _assert_same(got, ref)
        return _one_training_graph(graphs).report
    must, prefer = run(CheckpointPolicy.MUST_SAVE), run(CheckpointPolicy.PREFER_SAVE)
    assert _kept(must) == [[2, 8, 128]], must
    assert "aten.erf.default" not in _recomputed_ops(must)
    if mode == "recompute":
        assert _kept(prefer) == [[2, 8, 128]] and prefer.saved_bytes == must.saved_bytes
    else:
        assert _kept(prefer) == [] and "aten.erf.default" in {r.split(" = ")[1] for r in prefer.recomputed}
        assert prefer.saved_bytes == must.saved_bytes - 2 * 8 * 128 * 4, (prefer.saved_bytes, must.saved_bytes)


def test_must_recompute_is_never_saved_under_min_cut(fresh_dynamo):
    """MUST_RECOMPUTE holds under MINICOMPILE_CHECKPOINT=min_cut too (PREFER_RECOMPUTE is the cut's
    to weigh): attention's bmm, which the cut would save, is recomputed."""
    must = saving([aten.mm.default, aten.addmm.default], otherwise=CheckpointPolicy.MUST_RECOMPUTE)
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(must), "min_cut")
    _assert_same(got, ref)
    assert "aten.bmm.default" in _recomputed_ops(_one_training_graph(graphs).report)
    prefer = saving([aten.mm.default, aten.addmm.default])
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(prefer), "min_cut")
    _assert_same(got, ref)
    assert "aten.bmm.default" not in _recomputed_ops(_one_training_graph(graphs).report)


def test_dropout_in_a_selective_checkpoint_trains_as_eager(fresh_dynamo):
    """Dropout inside regions with a policy: the trace caches every value, and dropout's in-place
    draw wrote one it had cached ("Tensor cached during selective activation checkpoint has been
    mutated", where eager's cache holds only what the policy saves); the forward's masks are kept."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, LINEAR_PRODUCTS)
    got, ref, graphs = _compiled_vs_eager(lambda: SelectiveBlock(context_fn, dropout=0.2))
    _assert_same(got, ref)
    line = _one_training_graph(graphs).report.checkpoint
    assert "random draws kept from the forward" in line and "3 saved for the backward" in line, line


CONTEXTS = {"plain": None, "selective": functools.partial(create_selective_checkpoint_contexts, LINEAR_PRODUCTS)}


class PlainBlock(CheckpointedBlock):
    """CheckpointedBlock without its dropout calls: under dynamic=True, Dynamo (torch 2.13) fails on
    a Python float read in two checkpoint regions (dropout's p: "lift_tracked_freevar_to_input
    should not be called on root SubgraphTracer", pytorch/pytorch#193194), with any backend."""

    def probs(self, att):
        return att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1)

    def mlp(self, x):
        return self.out(F.gelu(self.fc(x)))


class PlainSelectiveBlock(PlainBlock, SelectiveBlock):
    pass


def _block(context, dynamic=False):
    if CONTEXTS[context] is None:
        return PlainBlock() if dynamic else CheckpointedBlock()
    return PlainSelectiveBlock(CONTEXTS[context]) if dynamic else SelectiveBlock(CONTEXTS[context])


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_checkpoint_under_autocast_bf16_trains_as_eager(context, fresh_dynamo):
    """Checkpoints inside ``torch.autocast("cpu", dtype=torch.bfloat16)``: products in bfloat16,
    LayerNorm and softmax in float32, as eager's checkpoint computes (and recomputes) them."""
    torch.manual_seed(0)
    model = _block(context)
    ref_model = copy.deepcopy(model)
    x, y = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    record = Recorder()

    def forward(m):
        def run(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return m(x).float()
        return run
    with patch(fallback_on_error=False):
        got = train(model, forward(torch.compile(model, backend=record)), x, y)
    ref = train(ref_model, forward(ref_model), x, y)
    for step, ((loss, grads, _), (rloss, rgrads, _)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(loss, rloss, **BF16, msg=lambda m: f"step {step} loss: {m}")
        for k, (a, b) in enumerate(zip(grads, rgrads)):
            torch.testing.assert_close(a, b, **BF16, msg=lambda m: f"step {step} grad {k}: {m}")
    graph = _one_training_graph(record.graphs)
    assert "in 2 region(s)" in graph.report.checkpoint
    # the policy keeps the linear layers' products, computed in bfloat16 as eager's autocast does
    assert _kept(graph.report) == ([[16, 32], [16, 96], [16, 128]] if context == "selective" else []), graph.report
    assert all(s.dtype == torch.bfloat16 for s in graph.report.saved if s.name in graph.report.kept)



@pytest.mark.parametrize("context", list(CONTEXTS))
def test_checkpoint_with_dynamic_batch_trains_as_eager(context, fresh_dynamo):
    """``dynamic=True`` and a batch size that changes each call (2, 3, 5): one graph with a
    symbolic batch, whose regions are recomputed (or kept, by the policy) at every size."""
    torch.manual_seed(0)
    model = _block(context, dynamic=True)
    ref_model = copy.deepcopy(model)
    record = Recorder()
    compiled = torch.compile(model, backend=record, dynamic=True)
    with patch(fallback_on_error=False):
        for b in (2, 3, 5):
            x = torch.randn(b, 8, 32)
            loss = compiled(x).square().mean()
            loss.backward()
            ref_loss = ref_model(x).square().mean()
            ref_loss.backward()
            torch.testing.assert_close(loss, ref_loss, **TOL, msg=lambda m: f"batch {b}: {m}")
            for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
                torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"batch {b}, {name}: {m}")
            model.zero_grad()
            ref_model.zero_grad()
    assert len(record.graphs) == 1 and isinstance(record.graphs[0], TrainingGraph), record.graphs
    graph = record.graphs[0]
    assert (graph.forward_calls, graph.backward_calls) == (3, 3)
    assert "in 2 region(s)" in graph.report.checkpoint
    assert ("the policy keeps" in graph.report.checkpoint) == (context == "selective")
