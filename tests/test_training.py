"""Training through torch.compile(backend="minicompile"): joint trace, partition, compiled backward.

Every test compares with eager in float32: losses and outputs, parameters after SGD-with-momentum
steps, and every input's gradient, within TOL. The recording backend keeps what the backend
returned for each graph, so the tests also assert the graphs were compiled (TrainingGraph, with
its forward and backward run) rather than run eagerly.
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.aot.joint import trace_joint
from minicompile.aot.partition import MAX_RECOMPUTE_DEPTH, partition
from minicompile.aot.runtime import TrainingGraph
from minicompile.config import patch
from minicompile.cpu import CPU
from minicompile.decomp import CORE_OPS, EXTERN_COMPUTE_OPS
from minicompile.tools.workloads import Block
from tests.helpers import Recorder, assert_matches_eager

TOL = dict(rtol=1e-4, atol=1e-5)   # float32; backward sums in another order than eager's kernels


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class LayerNormSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.out = nn.Linear(12, 24), nn.LayerNorm(24), nn.Linear(24, 4)

    def forward(self, x):
        return F.softmax(self.out(F.gelu(self.ln(self.fc(x)))), dim=-1)


MODELS = {
    "mlp": (MLP, lambda: (torch.randn(8, 12), torch.randn(8, 4))),
    "layernorm_softmax": (LayerNormSoftmax, lambda: (torch.randn(8, 12), torch.rand(8, 4))),
    "gpt2_block": (lambda: Block(16, heads=2, seq=6), lambda: (torch.randn(2, 6, 16), torch.randn(2, 6, 16))),
}



def train(model, forward, x, y, steps=3):
    """SGD with momentum; per step the loss, every parameter's grad, and the parameters after."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        history.append((loss.detach(), grads, [p.detach().clone() for p in model.parameters()]))
    return history


@pytest.mark.parametrize("partitioner", ["save_all", "min_cut"])
@pytest.mark.parametrize("name", list(MODELS))
def test_training_matches_eager(name, partitioner, fresh_dynamo):
    make_model, make_data = MODELS[name]
    torch.manual_seed(0)
    model, (x, y) = make_model(), make_data()
    reference = copy.deepcopy(model)
    rec = Recorder()
    with patch(partitioner=partitioner):
        compiled = train(model, torch.compile(model, backend=rec), x, y)
    expected = train(reference, reference, x, y)
    for got, want in zip(compiled, expected):
        assert_matches_eager(got, want, **TOL)
    assert len(rec.graphs) == 1 and len(rec.training) == 1, rec.graphs
    graph = rec.training[0]
    assert graph.forward_calls == 3 and graph.backward_calls == 3 and graph.backward is not None
    assert graph.report.mode == partitioner
    assert graph.report.saved_bytes <= graph.report.save_all_bytes


def _joint_of(model, x):
    rec = []

    def grab(gm, example_inputs):
        rec.append(trace_joint(gm, list(example_inputs), CPU))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(model, backend=grab)(x)
    return rec[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_joint_graph_holds_only_core_ops(name, fresh_dynamo):
    """The backward ops these models produce all decompose (decomp/backward.py); matmuls stay externs."""
    make_model, make_data = MODELS[name]
    joint = _joint_of(make_model(), make_data()[0])
    ops = {n.target for n in joint.graph.graph.nodes if n.op == "call_function"}
    assert not ops - CORE_OPS - EXTERN_COMPUTE_OPS, ops - CORE_OPS - EXTERN_COMPUTE_OPS


def test_min_cut_saves_less_than_save_all_and_recomputes_only_cheap_ops(fresh_dynamo):
    torch.manual_seed(0)
    joint = _joint_of(LayerNormSoftmax(), torch.randn(64, 12))
    full, cut = partition(joint, "save_all").report, partition(joint, "min_cut").report
    assert full.saved_bytes == full.save_all_bytes and not full.recomputed
    assert cut.saved_bytes < full.saved_bytes and cut.recomputed
    recomputed_ops = {r.split(" = ")[1] for r in cut.recomputed}
    never = {"aten.mm.default", "aten.var_mean.correction", "aten.sum.dim_IntList", "aten.amax.default",
             "<built-in function getitem>"}
    assert not recomputed_ops & never, recomputed_ops & never
    assert "saving" in str(cut) and "recomputed" in str(cut)


def test_unknown_partitioner_is_a_clear_error(fresh_dynamo):
    joint = _joint_of(MLP(), torch.randn(4, 12))
    with pytest.raises(ValueError, match="unknown partitioner"):
        partition(joint, "greedy")


def test_recompute_chains_are_bounded(fresh_dynamo):
    def long_chain(x, w):
        h = x @ w
        for _ in range(3 * MAX_RECOMPUTE_DEPTH):
            h = torch.sin(h) * 1.5
        return h @ w

    w = torch.randn(8, 8, requires_grad=True)
    joint = _joint_of(lambda x: long_chain(x, w), torch.randn(4, 8))
    report = partition(joint, "min_cut").report
    recomputed = {r.split(" = ")[0] for r in report.recomputed}
    assert recomputed, "the cheap sin/mul chain should be partly recomputed"
    depth = {}
    for node in joint.graph.graph.nodes:
        if node.name in recomputed:
            depth[node.name] = 1 + max((depth.get(a.name, 0) for a in node.all_input_nodes), default=0)
    assert max(depth.values()) <= MAX_RECOMPUTE_DEPTH


# -- runtime edge cases ----------------------------------------------------------------------------

def _compiled_and_eager(fn, *inputs):
    """fn through our backend and eagerly, on separate leaf copies of ``inputs``."""
    rec = Recorder()
    torch._dynamo.reset()
    copies = [[t.detach().clone().requires_grad_(t.requires_grad) for t in inputs] for _ in range(2)]
    return rec, torch.compile(fn, backend=rec)(*copies[0]), copies[0], fn(*copies[1]), copies[1]


def test_inputs_that_do_not_require_grad(fresh_dynamo):
    fn = lambda x, w: (torch.relu(x @ w) * x.sum()).sum()  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
    out.backward()
    ref.backward()
    assert ins[0].grad is None and ref_ins[0].grad is None
    assert_matches_eager((out, ins[1].grad), (ref, ref_ins[1].grad), **TOL)
    assert len(rec.training) == 1


def test_outputs_that_are_not_differentiable(fresh_dynamo):
    fn = lambda x, w: (torch.tanh(x * w), x > 0, x * 2)  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(5), torch.randn(5, requires_grad=True))
    assert [o.requires_grad for o in out] == [o.requires_grad for o in ref] == [True, False, False]
    out[0].sum().backward()
    ref[0].sum().backward()
    assert_matches_eager((out, ins[1].grad), (ref, ref_ins[1].grad), **TOL)
    assert len(rec.training) == 1


def test_grad_outputs_that_are_none_become_zeros(fresh_dynamo):
    fn = lambda x, w: (torch.sin(x * w), torch.exp(w) * 3)  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(5), torch.randn(5, requires_grad=True))
    (out[0] * 2).sum().backward()       # the second output takes no gradient
    (ref[0] * 2).sum().backward()
    assert_matches_eager(ins[1].grad, ref_ins[1].grad, **TOL)
    assert rec.training[0].backward_calls == 1


def test_retain_graph_runs_backward_twice(fresh_dynamo):
    fn = lambda x, w: (F.gelu(x @ w) ** 2).mean()  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
    for loss in (out, ref):
        loss.backward(retain_graph=True)
        loss.backward()
    assert_matches_eager(ins[1].grad, ref_ins[1].grad, **TOL)
    assert rec.training[0].backward_calls == 2
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


def test_double_backward_raises_instead_of_a_wrong_gradient(fresh_dynamo):
    fn = lambda x, w: (torch.sin(x * w)).sum()  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(5), torch.randn(5, requires_grad=True))
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(out, ins[1], create_graph=True)
    (g,) = torch.autograd.grad(out, ins[1])                   # without create_graph: eager's gradient
    (g_ref,) = torch.autograd.grad(ref, ref_ins[1])
    assert_matches_eager(g, g_ref, **TOL)


# -- graphs that run eagerly, with the reason logged ------------------------------------------------

class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.fc(x)).relu()


class DropoutNet(nn.Module):
    """Two dropouts on independent branches: their masks must come from torch's generator in
    eager's order (the schedule keeps random extern calls in program order)."""

    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(6, 8), nn.Linear(6, 8)

    def forward(self, x):
        a = F.dropout(self.fc(x), p=0.5, training=True)
        b = F.dropout(torch.tanh(self.fc2(x)), p=0.3, training=True)
        return a * 2 + b


@pytest.mark.parametrize("make", [BatchNormNet, DropoutNet], ids=["batchnorm_train", "dropout"])
def test_batchnorm_and_dropout_compile_and_match_eager(make, fresh_dynamo):
    """BatchNorm's running statistics are written back once per forward; dropout's masks are
    eager's (same seed), and backward reuses them."""
    torch.manual_seed(0)
    model, x = make(), torch.randn(4, 6)
    reference = copy.deepcopy(model)
    rec = Recorder()
    compiled = torch.compile(model, backend=rec)
    for seed in range(2):
        got, want = [], []
        for m, out in ((model, got), (reference, want)):
            torch.manual_seed(seed)
            y = (compiled if m is model else reference)(x)
            out += [y, torch.autograd.grad(y.square().sum(), list(m.parameters())), dict(m.named_buffers())]
        assert_matches_eager(got, want, **TOL)
    assert len(rec.training) == 1 and rec.training[0].forward_calls == 2


def _mutate_an_input_that_requires_grad(x, w):
    y = x * w
    torch._dynamo.graph_break()
    y.mul_(2)                      # the second graph's input y requires grad
    return (y * y).sum()


FALLBACKS = {
    "mutated_input_requires_grad": (_mutate_an_input_that_requires_grad,
                                    (torch.randn(4), torch.randn(4, requires_grad=True)), "mutates an input that"),
    "output_aliases_input": (lambda x, w: ((x * w).sum(), w.view(-1)),
                             (torch.randn(4), torch.randn(4, requires_grad=True)), "aliases"),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_unsupported_training_graphs_run_eagerly_with_the_reason(case, caplog, fresh_dynamo):
    fn, inputs, reason = FALLBACKS[case]
    rec = Recorder()
    reference = copy.deepcopy(fn)
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        torch.manual_seed(1)
        out = torch.compile(fn, backend=rec)(*inputs)
    torch.manual_seed(1)
    ref = reference(*inputs)
    first = lambda o: o[0] if isinstance(o, tuple) else o  # noqa: E731
    assert_matches_eager(first(out), first(ref), **TOL)
    params = lambda f: list(f.parameters()) if isinstance(f, nn.Module) else [inputs[-1]]  # noqa: E731
    got = torch.autograd.grad(first(out).sum(), params(fn))
    want = torch.autograd.grad(first(ref).sum(), params(reference) if isinstance(fn, nn.Module) else params(fn))
    assert_matches_eager(got, want, **TOL)
    assert any(not isinstance(g, TrainingGraph) for g in rec.graphs)   # the refused graph runs eagerly
    assert any("training graph runs eagerly" in r.message and reason in r.message for r in caplog.records), \
        [r.message for r in caplog.records]


def test_a_backward_that_fails_to_compile_runs_its_aten_graph_eagerly(caplog, fresh_dynamo):
    fn = lambda x, w: torch.tanh(x @ w).sum()  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
    graph = rec.training[0]

    def broken(gm, example_inputs):
        raise RuntimeError("simulated compiler bug")
    graph.compile_fn = broken
    graph.ahead = None   # the backward compiled beside the forward: a failed one is compiled again at the first backward
    with patch(fallback_on_error=True), caplog.at_level(logging.WARNING, logger="minicompile"):
        out.backward()
    ref.backward()
    assert_matches_eager(ins[1].grad, ref_ins[1].grad, **TOL)
    assert graph.backward.run is graph.partition.backward and "simulated compiler bug" in caplog.text


def test_the_backward_is_compiled_beside_the_forward(fresh_dynamo, tmp_path):
    """The backward is compiled while the forward's kernels build (an empty cache: g++ runs), for
    the layouts the compiled forward returns (its outputs' strides, known before it runs): the
    first backward compiles nothing. With the forward's library in the cache there is nothing to
    overlap, and the backward is left to the first backward (a forward-only caller needs none)."""
    fn = lambda x, w: (torch.nn.functional.gelu(x @ w).transpose(0, 1) * 2).sum()  # noqa: E731
    with patch(cache_dir=str(tmp_path), fallback_on_error=False):
        rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
        graph = rec.training[0]
        ahead = graph.ahead[1]

        def broken(gm, example_inputs, **kw):
            raise RuntimeError("the backward was compiled again")
        graph.compile_fn = broken
        out.backward()
        ref.backward()
        assert_matches_eager(ins[1].grad, ref_ins[1].grad, **TOL)
        assert graph.backward is ahead and graph.ahead is None
        rec_again, out, *_ = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
        assert rec_again.training[0].ahead is None and rec_again.training[0].backward is None


def test_a_backward_compiled_ahead_for_other_layouts_is_compiled_again(fresh_dynamo, tmp_path):
    """Inputs the first backward gets laid out otherwise than predicted: the backward compiled
    ahead is not used (it indexes its inputs with the predicted strides); it is compiled again."""
    fn = lambda x, w: torch.tanh(x @ w).sum()  # noqa: E731
    with patch(cache_dir=str(tmp_path), fallback_on_error=False):
        rec, out, ins, ref, ref_ins = _compiled_and_eager(fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True))
        graph = rec.training[0]
        expected, ahead = graph.ahead
        tensor_at = next(k for k, e in enumerate(expected) if isinstance(e, tuple) and len(e[0]) == 2)
        size, stride, dtype, device = expected[tensor_at]
        expected[tensor_at] = (size, stride[::-1], dtype, device)   # as if predicted transposed
        out.backward()
        ref.backward()
        assert_matches_eager(ins[1].grad, ref_ins[1].grad, **TOL)
        assert graph.backward is not ahead and graph.backward is not None


def test_training_on_each_code_generator(backend, fresh_dynamo):
    """The forward and backward graphs go through whichever generator the device picks."""
    torch.manual_seed(0)
    model, (x, y) = LayerNormSoftmax(), MODELS["layernorm_softmax"][1]()
    reference = copy.deepcopy(model)
    rec = Recorder()
    compiled = train(model, torch.compile(model, backend=rec), x, y, steps=2)
    for got, want in zip(compiled, train(reference, reference, x, y, steps=2)):
        assert_matches_eager(got, want, **TOL)
    graph = rec.training[0]
    assert graph.forward.backend == graph.backward.backend == backend


def test_backward_inside_a_compiled_train_step(fresh_dynamo):
    """loss.backward() called in the compiled function itself: the compiled backward is built
    while Dynamo evaluates that frame, and must not be traced by Dynamo."""
    torch.manual_seed(0)
    model, (x, y) = MLP(), MODELS["mlp"][1]()
    reference = copy.deepcopy(model)

    def step(m):
        loss = F.mse_loss(m(x), y)
        loss.backward()
        return loss

    rec = Recorder()
    loss = torch.compile(step, backend=rec)(model)
    expected = step(reference)
    assert_matches_eager((loss.detach(), [p.grad for p in model.parameters()]),
                         (expected.detach(), [p.grad for p in reference.parameters()]), **TOL)
    assert rec.training and all(g.backward is not None for g in rec.training)


def test_an_unused_input_gets_no_grad_and_strided_grad_outputs_work(fresh_dynamo):
    fn = lambda x, w, unused: ((x @ w).t() * 2, (x @ w).argmax(-1))  # noqa: E731
    rec, out, ins, ref, ref_ins = _compiled_and_eager(
        fn, torch.randn(4, 6), torch.randn(6, 3, requires_grad=True), torch.randn(3, requires_grad=True))
    grad = torch.randn(4, 3).t()                 # a non-contiguous gradient for the transposed output
    out[0].backward(grad)
    ref[0].backward(grad)
    assert ins[2].grad is None and ref_ins[2].grad is None
    assert_matches_eager((out, ins[1].grad), (ref, ref_ins[1].grad), **TOL)
    assert len(rec.training) == 1


def test_debug_level_2_prints_the_partition_report(capsys, fresh_dynamo):
    with patch(debug=2):
        torch.compile(MLP(), backend=Recorder())(torch.randn(4, 12))
    assert "partition (min_cut):" in capsys.readouterr().out
