"""Dynamic shapes in training: one symbolic joint graph, both halves compiled once for every size
(docs/training.md, "Dynamic shapes in training").

Each model trains through torch.compile(backend="minicompile") on changing batch sizes or
sequence lengths, beside an eager copy with the same weights: the loss and every parameter's
gradient are compared with eager's at each size, and the training graphs the backend builds are
counted (``dynamic=True``: 1; Dynamo's automatic dynamic: 2, the first size static, then one
symbolic build). A graph counted here is compiled, not run eagerly: the fixture fails on
"training graph runs eagerly" and checks both halves' kernels take the sizes as arguments.
"""
import copy
import logging
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile.backend as backend_module
from minicompile.aot.runtime import TrainingGraph
from minicompile.ir.expr import NotSymbolic


@pytest.fixture
def training_graphs(monkeypatch):
    """What compile_training returned for each graph Dynamo handed the backend."""
    built = []
    compile_training = backend_module.compile_training

    def counting(gm, example_inputs, knobs):
        built.append(compile_training(gm, example_inputs, knobs))
        return built[-1]
    monkeypatch.setattr(backend_module, "compile_training", counting)
    return built


def train_and_compare(model, make_batch, sizes, dynamic=None, loss_fn=lambda out: out.square().mean(),
                      atol=1e-5, rtol=1e-4):
    """One forward and backward per size, compiled and eager, from the same weights: losses and
    gradients equal eager's at every size."""
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="minicompile", dynamic=dynamic)
    for n in sizes:
        inputs = make_batch(n)
        call = (lambda f: f(**inputs)) if isinstance(inputs, dict) else (lambda f: f(*inputs))
        loss = loss_fn(call(compiled))
        loss.backward()
        expected = loss_fn(call(eager))
        expected.backward()
        torch.testing.assert_close(loss, expected, atol=atol, rtol=rtol, msg=lambda m: f"size {n}: {m}")
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=rtol, msg=lambda m: f"size {n}, {name}: {m}")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    return eager


def assert_symbolic_builds(graphs, at_most: int, caplog):
    assert "training graph runs eagerly" not in caplog.text
    assert 1 <= len(graphs) <= at_most, len(graphs)
    last = graphs[-1]
    assert isinstance(last, TrainingGraph)
    for half in (last.forward, last.backward):   # both halves take the sizes as arguments
        assert "int64_t s" in half.kernel_source


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x):
        return self.down(F.gelu(self.norm(self.up(x))))


class Attention(nn.Module):
    """Causal softmax attention over a (batch, seq, channels) input."""

    def __init__(self, channels=16):
        super().__init__()
        self.qkv, self.out = nn.Linear(channels, 3 * channels), nn.Linear(channels, channels)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        return self.out(torch.softmax(scores, -1) @ v)


def conv_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def test_mlp_with_layer_norm_over_batch_and_sequence_compiles_once(training_graphs, fresh_dynamo, caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(MLP(), lambda n: (torch.randn(n % 4 + 2, n, 16),), range(3, 12, 2), dynamic=True)
    assert_symbolic_builds(training_graphs, 1, caplog)


def test_causal_attention_over_sequence_lengths_compiles_at_most_twice(training_graphs, fresh_dynamo, caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(Attention(), lambda t: (torch.randn(2, t, 16),), range(4, 33, 4))
    assert_symbolic_builds(training_graphs, 2, caplog)


class ShiftedLabelsLoss(nn.Module):
    """A language model's loss as HF writes it (ForCausalLMLoss): labels padded with -100 and
    shifted by one, cross-entropy over the flattened logits."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 50)

    def forward(self, x, labels):
        logits = self.head(x).float()
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), shifted.view(-1), ignore_index=-100)


def test_shifted_labels_loss_over_sequence_lengths_compiles_at_most_twice(training_graphs, fresh_dynamo, caplog):
    # the fake run of Dynamo's graph (aot/joint.py) ran constant_pad_nd's C++ fake kernel, which
    # reads sizes as ints: each sequence length became a guard, and HF GPT-2's loss recompiled at
    # every length until Dynamo's limit ran it eagerly
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(ShiftedLabelsLoss(), lambda t: (torch.randn(2, t, 16), torch.randint(0, 50, (2, t))),
                          range(16, 57, 8), loss_fn=lambda out: out)
    assert_symbolic_builds(training_graphs, 2, caplog)


def test_conv_net_with_batch_norm_over_batch_sizes(training_graphs, fresh_dynamo, caplog):
    torch.manual_seed(0)
    model = conv_net()
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        eager = train_and_compare(model, lambda b: (torch.randn(b, 3, 8, 8),), [2, 3, 5, 8], atol=1e-4)
    assert_symbolic_builds(training_graphs, 2, caplog)
    for name in ("running_mean", "running_var", "num_batches_tracked"):   # the compiled forwards' writes
        torch.testing.assert_close(getattr(model[1], name), getattr(eager[1], name))


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return (self.w * x).exp().sin()


def test_a_strided_input_whose_stride_is_a_symbol_compiles(training_graphs, fresh_dynamo, caplog):
    # x = base[::2] under dynamic=True: size (s10,), stride (s56,). The backward reads x, so it
    # needs s56, which is no backward input's size: Dynamo's int input s56 is handed to it too
    # (it ran eagerly: "symbols ['s56'] are no input's size"; training fuzzer seed 7)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(Scale(), lambda n: (torch.randn(2 * n)[::2],), [3, 5, 8], dynamic=True)
    assert_symbolic_builds(training_graphs, 1, caplog)


class Pick(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(1))

    def forward(self, x):
        y = x * self.w
        return y[:, 1].exp() + y[-1].square().sum()


def test_select_backward_with_a_symbolic_size(training_graphs, fresh_dynamo, caplog):
    # select_backward's ``index % size`` was Mod(1, s9), which the index math cannot take: every
    # graph with x[:, 1] or x[-1] ran eagerly under dynamic=True (training fuzzer, most batches)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(Pick(), lambda n: (torch.randn(n, n + 1),), [3, 5, 7], dynamic=True)
    assert_symbolic_builds(training_graphs, 1, caplog)


def test_a_graph_the_symbolic_path_cannot_lower_runs_eagerly_with_the_reason(training_graphs, fresh_dynamo,
                                                                            caplog, monkeypatch):
    # a lowering gap of the symbolic path (NotSymbolic) must cost speed, never a gradient, and
    # is not a compiler bug: it falls back even with MINICOMPILE_FALLBACK=0 (as in the tests)
    def refuse(gm, example_inputs, **about):
        raise NotSymbolic("index math over s0*s1 (a test's stand-in)")
    monkeypatch.setattr(backend_module, "compile_aten", refuse)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(MLP(), lambda n: (torch.randn(2, n, 16),), [3, 5, 7], dynamic=True)
    assert "training graph runs eagerly: not compiled with symbolic sizes: index math over s0*s1" in caplog.text
    assert not isinstance(training_graphs[-1], TrainingGraph)


def test_a_saved_value_laid_out_otherwise_is_copied_into_the_traced_strides():
    from minicompile.aot.runtime import SymbolicLayouts
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    traced = mode.from_tensor(torch.empty(4, 6))   # symbolic sizes (s0, s1), strides (s1, 1)
    gm = torch.fx.symbolic_trace(lambda x: x.clone())
    next(iter(gm.graph.nodes)).meta["val"] = traced
    seen = []
    run = SymbolicLayouts(gm, lambda x: seen.append(x.stride()) or x)
    x = torch.randn(7, 5).t()                       # sizes (5, 7), strides (1, 5)
    torch.testing.assert_close(run(x), x)
    assert seen == [(7, 1)]


@pytest.mark.slow
def test_hf_gpt2_trained_on_sequence_lengths_16_to_128_compiles_at_most_twice(training_graphs, fresh_dynamo,
                                                                             caplog):
    """issue 26's bar: GPT-2 (2 layers, hidden 64, random init) trained on sequence lengths
    16..128 in steps of 8 with at most 2 compiles, losses and gradients as eager's."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=128,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.loss_type = "ForCausalLM"   # unset, HF logs a warning inside forward: a graph break
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(model, lambda t: dict(input_ids=(ids := torch.randint(0, 128, (2, t))), labels=ids),
                          range(16, 129, 8), loss_fn=lambda out: out.loss)
    assert_symbolic_builds(training_graphs, 2, caplog)


@pytest.mark.slow
def test_fuzzed_training_programs_with_symbolic_sizes_match_eager(tmp_path):
    """The training fuzzer's dynamic mode (testing/fuzz_train_dynamic.py) on 10 programs: outputs
    and gradients as eager's at three sizes each (76 s on the loaded 2-core machine)."""
    from minicompile.testing import fuzz_train, fuzz_train_dynamic
    failures = fuzz_train.run(seed=0, n=10, batch=10, repro_dir=str(tmp_path), log=lambda *a: None, dynamic=True)
    assert not failures, failures
    assert fuzz_train_dynamic.STATS["training graphs"] > 0, fuzz_train_dynamic.summary()


def test_clone_of_a_transposed_strided_view_keeps_eagers_strides(fresh_dynamo):
    """Training fuzzer seed 295: the clone's eager strides (1, 7, 63, 189) are dense only where its
    last size ``s//3`` is 1, as the graph is guarded to; they were replaced by row-major ones."""
    def fn(v0):
        return v0[:, :, :, 2::3].clone()
    x = torch.randn(5, 1, 9, 7).permute(3, 2, 1, 0).requires_grad_()
    out = torch.compile(fn, backend="minicompile", dynamic=True)(x)
    torch.testing.assert_close(out, fn(x))
    assert out.stride() == fn(x).stride()


class Scaled(nn.Module):
    """``fn(x * w)`` with a weight per row: its gradient checks the backward."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.w = fn, nn.Parameter(torch.rand(3, 1) + 0.5)

    def forward(self, x):
        return self.fn(x * self.w)


@pytest.mark.parametrize("fn", [lambda x: x[:, 7:] * 2, lambda x: x[:, 8::2] * 2, lambda x: x.unfold(1, 8, 1).sum(-1),
                                lambda x: F.avg_pool1d(x.unsqueeze(0), 8, 1).squeeze(0),
                                lambda x: F.conv1d(x.unsqueeze(0), torch.ones(3, 3, 8)).squeeze(0)],
                         ids=["slice", "strided_slice", "unfold", "avg_pool", "conv"])
def test_sizes_short_by_a_constant_compile_for_training(fn, training_graphs, fresh_dynamo, caplog):
    """A size ``s - 7`` gives the contiguous stride ``Max(1, s - 7)``, which differs from ``s - 7``
    only where the tensor is empty, and ``x[:, 8::2]`` the size ``(s - 7)//2``, a floor that C++'s
    division matches only for ``s >= 7``: the trace's guard says so. Both ran eagerly ("not a
    polynomial"), found by the dynamic training fuzzer on seeds 290-499."""
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        train_and_compare(Scaled(fn), lambda n: (torch.randn(3, n),), (13, 17, 24, 30), dynamic=True)
    assert_symbolic_builds(training_graphs, 2, caplog)
