"""Activation checkpointing (``torch.utils.checkpoint``, non-reentrant) in compiled training.

Dynamo hands each checkpointed call over as ``tag_activation_checkpoint``; the joint trace tags
the ATen nodes each region made, and the partitioner recomputes them in the backward instead of
saving them (``MINICOMPILE_CHECKPOINT=recompute``, as eager) or lets its min-cut choose
(``min_cut``); aot/checkpoint.py. Every test compares with eager running the same checkpoints, in
float32, and checks the graph compiled (a TrainingGraph whose forward and backward ran) with the
eager fallback off, except the one case that must run eagerly: a random draw in a region with
``preserve_rng_state=False``.
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from minicompile.aot.runtime import TrainingGraph
from minicompile.config import patch
from tests.helpers import Recorder
from tests.test_training import TOL, train

aten = torch.ops.aten


class CheckpointedBlock(nn.Module):
    """A GPT-2-style block (LayerNorm, causal softmax attention, GELU MLP), attention and MLP each
    in its own checkpoint when ``ckpt``; ``dropout`` inside both regions; ``nested`` puts the
    attention's softmax in a checkpoint of its own inside the attention's."""

    def __init__(self, c=32, heads=4, seq=8, ckpt=True, dropout=0.0, nested=False, preserve_rng_state=True):
        super().__init__()
        self.heads, self.ckpt, self.p, self.nested = heads, ckpt, dropout, nested
        self.preserve = preserve_rng_state
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def probs(self, att):
        return F.dropout(att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1), self.p)

    def attn(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        p = self.run(self.probs, att) if self.nested else self.probs(att)
        return self.proj((p @ v).transpose(1, 2).reshape(b, t, c))

    def mlp(self, x):
        return F.dropout(self.out(F.gelu(self.fc(x))), self.p)

    def run(self, fn, x):
        return checkpoint(fn, x, use_reentrant=False, preserve_rng_state=self.preserve) if self.ckpt else fn(x)

    def forward(self, x):
        x = x + self.run(self.attn, self.ln1(x))
        return x + self.run(self.mlp, self.ln2(x))


def _compiled_vs_eager(make, policy="recompute", steps=3, seed=0):
    """``make()``'s module trained ``steps`` SGD steps compiled and eagerly from the same weights
    and the same generator state; returns both histories and the backend's graphs."""
    torch.manual_seed(seed)
    model = make()
    ref_model = copy.deepcopy(model)
    x, y = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    record = Recorder()
    torch._dynamo.reset()
    with patch(fallback_on_error=False, checkpoint=policy):
        torch.manual_seed(seed + 1)
        got = train(model, torch.compile(model, backend=record), x, y, steps)
    torch.manual_seed(seed + 1)
    ref = train(ref_model, ref_model, x, y, steps)
    return got, ref, record.graphs


def _assert_same(got, ref):
    for step, ((loss, grads, params), (rloss, rgrads, rparams)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(loss, rloss, **TOL, msg=lambda m: f"step {step} loss: {m}")
        for k, (a, b) in enumerate(zip(grads + params, rgrads + rparams)):
            torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"step {step} grad/param {k}: {m}")


def _one_training_graph(graphs, steps=3) -> TrainingGraph:
    assert len(graphs) == 1 and isinstance(graphs[0], TrainingGraph), graphs
    assert (graphs[0].forward_calls, graphs[0].backward_calls) == (steps, steps)
    return graphs[0]


def _saved_bytes(make, policy="recompute") -> tuple:
    got, ref, graphs = _compiled_vs_eager(make, policy, steps=1)
    _assert_same(got, ref)
    return _one_training_graph(graphs, steps=1).report


@pytest.mark.parametrize("policy", ["recompute", "min_cut"])
def test_checkpointed_block_trains_as_eager_checkpointing(policy, fresh_dynamo):
    got, ref, graphs = _compiled_vs_eager(CheckpointedBlock, policy)
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert f"checkpoint ({policy}):" in str(report) and "in 2 region(s)" in report.checkpoint


def test_checkpointing_saves_less_and_the_report_says_what_was_recomputed(fresh_dynamo):
    plain = _saved_bytes(lambda: CheckpointedBlock(ckpt=False))
    recompute = _saved_bytes(CheckpointedBlock, "recompute")
    min_cut = _saved_bytes(CheckpointedBlock, "min_cut")
    assert not plain.checkpoint and not plain.checkpointed
    assert recompute.saved_bytes < min_cut.saved_bytes <= plain.saved_bytes, \
        (recompute.saved_bytes, min_cut.saved_bytes, plain.saved_bytes)
    # under `recompute` the regions' matrix products, reductions and softmax are recomputed,
    # which the min-cut never does for a value outside a region
    ops = {r.split(" = ")[1] for r in recompute.recomputed if r.split(" = ")[0] in recompute.checkpointed}
    assert {"aten.bmm.default", "aten.amax.default", "aten.exp.default", "aten.erf.default"} <= ops, ops
    assert not {"aten.bmm.default", "aten.amax.default"} & {r.split(" = ")[1] for r in min_cut.recomputed}
    text = str(recompute)
    assert "(checkpointed)" in text and "checkpoint (recompute): " in text and ", 0 saved" in text


def test_nested_checkpoints_train_as_eager(fresh_dynamo):
    """A checkpoint inside a checkpoint: its values belong to the outer region (the trace tags them
    with the outer's id), which is recomputed whole, as eager recomputes the outer call."""
    got, ref, graphs = _compiled_vs_eager(lambda: CheckpointedBlock(nested=True))
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert "in 2 region(s)" in report.checkpoint and ", 0 saved" in report.checkpoint
    assert {"aten.amax.default", "aten.exp.default"} <= {r.split(" = ")[1] for r in report.recomputed}


def test_dropout_in_a_checkpoint_keeps_the_forwards_mask(fresh_dynamo):
    """Eager restores the generator's state and draws the same mask again; the compiled backward
    reads the forward's draw (saved), so gradients match and nothing draws twice."""
    got, ref, graphs = _compiled_vs_eager(lambda: CheckpointedBlock(dropout=0.2))
    _assert_same(got, ref)
    report = _one_training_graph(graphs).report
    assert "random draws kept from the forward" in report.checkpoint


def test_dropout_without_preserved_rng_state_runs_eagerly_with_a_reason(caplog, fresh_dynamo):
    """preserve_rng_state=False: eager's recomputation draws a new mask, which a compiled backward
    would not reproduce; the graph runs eagerly (as eager, mask for mask) and the log says why."""
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        got, ref, graphs = _compiled_vs_eager(lambda: CheckpointedBlock(dropout=0.2, preserve_rng_state=False))
    _assert_same(got, ref)
    assert not any(isinstance(g, TrainingGraph) for g in graphs), graphs
    assert "preserve_rng_state=False" in caplog.text


def test_debug_2_prints_the_checkpoint_line(capsys, fresh_dynamo):
    with patch(debug=2):
        _saved_bytes(CheckpointedBlock)
    out = capsys.readouterr().out
    assert "partition (min_cut):" in out and "checkpoint (recompute): " in out and "(checkpointed)" in out


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gpt2_with_activation_checkpointing_trains_as_eager(reentrant, fresh_dynamo):
    """HF GPT-2 (2 layers, hidden 64, dropout 0.1) after ``activation_checkpointing_enable``: each
    layer a checkpoint region (Dynamo hands the reentrant form over as the same op); one step's loss
    and every gradient as eager's, the dropout masks inside the regions included."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=100,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.activation_checkpointing_enable({"use_reentrant": reentrant})   # gradient_checkpointing_enable before 5.x
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 16))
    record = Recorder()
    with patch(fallback_on_error=False):
        torch.manual_seed(1)
        loss = torch.compile(model, backend=record)(input_ids=ids, labels=ids).loss
        loss.backward()
    torch.manual_seed(1)
    ref_loss = ref(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, **TOL)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"{name}: {m}")
    assert record.graphs and all(isinstance(g, TrainingGraph) for g in record.graphs), record.graphs
    lines = [g.report.checkpoint for g in record.training if g.report.checkpoint]
    assert len(lines) == 1 and "in 2 region(s)" in lines[0] and "random draws kept from the forward" in lines[0]


class CheckpointedSdpa(nn.Module):
    """Attention through F.scaled_dot_product_attention inside a checkpoint."""

    def __init__(self, c=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(c, 3 * c), nn.Linear(c, c)

    def attn(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        return x + checkpoint(self.attn, x, use_reentrant=False)


def test_checkpointed_fused_attention_over_sequence_lengths_compiles(fresh_dynamo):
    # eager's fused attention (the op HF's models get where it measures faster) is computed once,
    # never recomputed: its output and logsumexp must then be saved, though a region's are not; they were
    # marked "never saved" and the min-cut had no finite cut (NetworkXUnbounded, the graph ran
    # eagerly: found fine-tuning HF GPT-2 with checkpointing on changing lengths)
    torch.manual_seed(0)
    model = CheckpointedSdpa()
    ref_model = copy.deepcopy(model)
    record = Recorder()
    compiled = torch.compile(model, backend=record)
    with patch(fallback_on_error=False, cpu_attention="flash"):   # the fused op, as HF's models get it
        for t in (8, 12, 16):
            x = torch.randn(2, t, 32)
            compiled(x).square().mean().backward()
            ref_model(x).square().mean().backward()
            for p, q in zip(model.parameters(), ref_model.parameters()):
                torch.testing.assert_close(p.grad, q.grad, **TOL)
            model.zero_grad()
            ref_model.zero_grad()
    assert len(record.graphs) == 2 and all(isinstance(g, TrainingGraph) for g in record.graphs)
