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


