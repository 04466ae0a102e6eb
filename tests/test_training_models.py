"""Whole models trained through torch.compile(backend="minicompile"), compared with eager.

A small CNN (convolutions, BatchNorm in train mode, ReLU, pooling, a residual) and HF GPT-2,
BERT and Llama from tiny configs (random init, 2 layers, hidden 64, vocab 100, seq 16; HF's
default dropout probabilities, so GPT-2 and BERT train with dropout 0.1). Each trains 3
SGD-with-momentum steps and then takes one AdamW step from the same parameters (a fresh
optimizer on both sides), compiled and eagerly from the same RNG seed. After every step the
loss, every parameter's gradient, every parameter and every buffer (BatchNorm's running
statistics and num_batches_tracked) match eager within TOL (float32). Every graph Dynamo hands
the backend must be a compiled TrainingGraph whose forward and backward both ran each step:
nothing runs eagerly (the conftest sets MINICOMPILE_FALLBACK=0, and a graph the training
runtime refuses would come back as the captured graph's forward, not a TrainingGraph).
"""
from __future__ import annotations

import copy
import logging
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.aot.runtime import TrainingGraph
from minicompile.backend import minicompile_backend
from minicompile.decomp import DECOMPOSITIONS
from tests.helpers import Recorder, assert_matches_eager

aten = torch.ops.aten
TOL = dict(rtol=1e-4, atol=1e-5)   # float32; backward sums in another order than eager's kernels
ADAMW_LR = 1e-3
# Adam divides each gradient by its own magnitude: where eager's gradient is float noise around
# zero (the key projection's bias: softmax is shift invariant) the update is lr-sized with a
# random sign. Parameters whose eager gradient is below NOISE_GRAD may differ by up to 2 * lr.
NOISE_GRAD = 1e-6


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.relu(h + self.bn2(self.conv2(h)))
        return F.cross_entropy(self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1)), y)


def _hf(name):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    small = dict(vocab_size=100)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, **small)
        model = transformers.GPT2LMHeadModel(config)
    elif name == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=32, **small)
        model = transformers.BertForMaskedLM(config)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=128, max_position_embeddings=32,
                                          **small)
        model = transformers.LlamaForCausalLM(config)
    return HFLoss(model)


class HFLoss(nn.Module):
    """The HF model's own language-modelling loss (labels = the input ids)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


MODELS = {
    "cnn": (CNN, lambda: (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))),
    "hf_gpt2": (lambda: _hf("gpt2"), lambda: (torch.randint(0, 100, (2, 16)),) * 2),
    "hf_bert": (lambda: _hf("bert"), lambda: (torch.randint(0, 100, (2, 16)),) * 2),
    "hf_llama": (lambda: _hf("llama"), lambda: (torch.randint(0, 100, (2, 16)),) * 2),
}



def _step(model, loss_fn, opt, inputs, seed):
    opt.zero_grad()
    torch.manual_seed(seed)                  # the same dropout masks, compiled and eager
    loss = loss_fn(*inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, params, {n: b.clone() for n, b in model.named_buffers()}


def _train(model, loss_fn, inputs):
    """3 SGD-with-momentum steps, then one AdamW step from where they left the parameters."""
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = [_step(model, loss_fn, sgd, inputs, seed) for seed in range(3)]
    adamw = torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)
    return history + [_step(model, loss_fn, adamw, inputs, 3)]


def _assert_adamw_step_matches(got, want):
    """Parameters with a gradient above float noise match within TOL; the rest within 2 lr (each
    side moves them by at most lr, plus the weight decay, which is the same on both)."""
    (loss, grads, state, buffers), (ref_loss, ref_grads, ref_state, ref_buffers) = got, want
    assert_matches_eager((loss, grads, buffers), (ref_loss, ref_grads, ref_buffers), **TOL)
    for name, g in ref_grads.items():
        noise = g.abs() < NOISE_GRAD
        assert_matches_eager(state[name][~noise], ref_state[name][~noise], **TOL)
        assert torch.all((state[name][noise] - ref_state[name][noise]).abs() <= 2 * ADAMW_LR), name
    assert_matches_eager({n: t for n, t in state.items() if n not in grads},
                         {n: t for n, t in ref_state.items() if n not in grads}, **TOL)   # no gradient


@pytest.mark.parametrize("name", list(MODELS))
def test_model_trains_like_eager_with_every_graph_compiled(name, caplog, fresh_dynamo):
    make_model, make_data = MODELS[name]
    torch.manual_seed(0)
    model, inputs = make_model(), make_data()
    model.train()
    reference = copy.deepcopy(model)
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        got = _train(model, torch.compile(model, backend=rec), inputs)
    want = _train(reference, reference, inputs)
    for k in range(3):
        assert_matches_eager(got[k], want[k], **TOL)
    _assert_adamw_step_matches(got[3], want[3])
    assert "runs eagerly" not in caplog.text, caplog.text
    assert rec.graphs and all(isinstance(g, TrainingGraph) for g in rec.graphs), rec.graphs
    for graph in rec.graphs:
        assert graph.forward_calls == graph.backward_calls == 4
        assert graph.backward is not graph.partition.backward    # the backward was compiled too
    externs = _externs(rec.graphs)     # batch norm and the backward ops of slicing and the loss fuse
    assert externs & {"mm", "_linear_pointwise"} and not externs & set(DECOMPOSED), externs
    assert ("bernoulli" in externs) == (name in ("hf_gpt2", "hf_bert")), externs   # HF's dropout 0.1 is on


# -- the backward ops these models produce, decomposed into core ops --------------------------------

# Backward ops that must reach the compiled graphs as core ops, not extern calls.
DECOMPOSED = ("native_batch_norm", "_native_batch_norm_legit", "nll_loss_backward", "nll_loss2d_backward",
              "slice_backward", "select_backward")


def _externs(graphs) -> set:
    """The names of the ops the compiled halves run as extern calls ("mm", "convolution_backward")."""
    return {str(e.op).split("::")[-1].split(".")[0] for g in graphs for half in (g.forward, g.backward) for e in half.externs}


def _decomposed(op, *args):
    return DECOMPOSITIONS[op](*args)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shape,affine", [((4, 3, 5, 5), True), ((6, 3), False)])
def test_batch_norm_forward_and_backward_decompositions(shape, affine, train):
    torch.manual_seed(0)
    x, dy = torch.randn(shape), torch.randn(shape)
    w, b = (torch.randn(3), torch.randn(3)) if affine else (None, None)
    stats = [torch.randn(3), torch.rand(3) + 0.5]
    eager_stats, our_stats = [s.clone() for s in stats], [s.clone() for s in stats]
    want = aten.native_batch_norm.default(x, w, b, *eager_stats, train, 0.1, 1e-5)
    got = _decomposed(aten.native_batch_norm.default, x, w, b, *our_stats, train, 0.1, 1e-5)
    assert_matches_eager((got, our_stats), (want, eager_stats), **TOL)   # running stats updated in place
    args = (dy, x, w, *stats, want[1], want[2], train, 1e-5, [True, affine, affine])
    assert_matches_eager(_decomposed(aten.native_batch_norm_backward.default, *args),
                         aten.native_batch_norm_backward.default(*args), **TOL)


@pytest.mark.parametrize("op,args", [
    (aten.slice_backward.default, (torch.randn(5, 4), [5, 7], 1, -4, 100, 1)),
    (aten.slice_backward.default, (torch.randn(2, 7), [5, 7], 0, 1, 3, 1)),
    (aten.select_backward.default, (torch.randn(7), [5, 7], 0, -1)),
    (aten.select_backward.default, (torch.randn(5), [5, 7], -1, 2)),
])
def test_slice_and_select_backward_decompositions(op, args):
    assert_matches_eager(_decomposed(op, *args), op(*args))


def test_native_dropout_backward_decomposition():
    torch.manual_seed(0)
    out, mask = aten.native_dropout.default(torch.randn(6, 5), 0.3, True)
    args = (torch.randn(6, 5), mask, 1 / 0.7)
    assert_matches_eager(_decomposed(aten.native_dropout_backward.default, *args),
                         aten.native_dropout_backward.default(*args))


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("shape", [(6, 5), (5,), (2, 5, 3, 3)])
def test_nll_loss_backward_decomposition(shape, reduction):
    torch.manual_seed(0)
    logp = torch.randn(shape).log_softmax(1 if len(shape) > 1 else 0)
    target = torch.randint(0, 5, shape[:1] + shape[2:]) if len(shape) > 1 else torch.tensor(3)
    if len(shape) > 1:
        target.view(-1)[0] = -100                        # an ignored position
    forward = aten.nll_loss_forward.default if len(shape) < 3 else aten.nll_loss2d_forward.default
    backward = aten.nll_loss_backward.default if len(shape) < 3 else aten.nll_loss2d_backward.default
    loss, total_weight = forward(logp, target, None, reduction, -100)
    args = (torch.randn(loss.shape), logp, target, None, reduction, -100, total_weight)
    assert_matches_eager(_decomposed(backward, *args), backward(*args))


def test_random_ops_draw_in_eager_order(fresh_dynamo):
    """Random extern calls keep their program order in the schedule (scheduler/fusion.py), even
    where a later kernel reads both: the same seed gives eager's samples."""
    def f(x):
        a = torch.sigmoid(x)
        r1 = torch.bernoulli(a)
        r2 = torch.bernoulli(torch.sigmoid(x * 2))
        return r1, a + r2, F.dropout(x, 0.5, training=True)

    x = torch.randn(64)
    torch.manual_seed(0)
    got = torch.compile(f, backend=minicompile_backend)(x)
    torch.manual_seed(0)
    assert_matches_eager(got, f(x))


def test_fused_dropout_trains_with_the_forward_mask(fresh_dynamo):
    """native_dropout (what F.dropout is on CUDA) stays one extern call in the forward; its
    backward (decomposed) reads the mask the forward drew."""
    def f(x, w):
        return (torch.native_dropout(torch.tanh(x @ w), 0.4, True)[0] ** 2).sum()

    x, w = torch.randn(8, 6), torch.randn(6, 5)
    rec, results = Recorder(), []
    for fn in (torch.compile(f, backend=rec), f):
        leaf = w.clone().requires_grad_()
        torch.manual_seed(0)
        loss = fn(x, leaf)
        results.append((loss, torch.autograd.grad(loss, leaf)))
    assert_matches_eager(results[0], results[1], **TOL)
    assert len(rec.graphs) == 1 and isinstance(rec.graphs[0], TrainingGraph)
    assert "native_dropout_backward" not in _externs(rec.graphs)
