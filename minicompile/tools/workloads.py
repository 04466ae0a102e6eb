"""The benchmark workloads: a model, inputs of a named size, and the bytes a fused kernel must move.

Each workload builds ``(model, inputs)`` for a size: "full" (the numbers in
docs/benchmarks.md), "quick" (``bench --quick``: under 3 minutes for all on 2 cores) and
"tiny" (the test-suite). ``min_bytes`` is what the ideal single-pass kernel reads and
writes; memory-bound workloads are judged by it against the measured copy bandwidth.
Compute-bound ones (matmuls) report None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Workload:
    name: str
    describe: Callable[[dict], str]          # shape summary for the table
    sizes: dict                               # size name -> kwargs for build
    build: Callable[..., tuple]               # (**kwargs) -> (model, inputs)
    min_bytes: Callable[[dict], int] | None   # None: compute-bound


def pointwise_chain(x):
    return (torch.sin(x) * 2.0 + 1.0).relu() * torch.cos(x)


class MLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A GPT-2 block: pre-LayerNorm causal self-attention and a tanh-GELU MLP.

    With ``seq`` the attention is written out (matmul, a causal-mask buffer of ``seq`` x ``seq``,
    softmax), the form the training benchmark and tests use; without, it is
    ``scaled_dot_product_attention``."""

    def __init__(self, c, heads, seq: int | None = None):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        if seq is not None:
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(self, "mask"):
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
            y = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def _pointwise(n):
    return pointwise_chain, (torch.randn(n),)


def _softmax(rows, cols):
    return (lambda x: torch.softmax(x, dim=-1)), (torch.randn(rows, cols),)


def _layer_norm(rows, cols):
    return nn.LayerNorm(cols).eval(), (torch.randn(rows, cols),)


def _mlp(batch, d, hidden):
    return MLP(d, hidden).eval(), (torch.randn(batch, d),)


def _block(b, t, c, heads):
    return Block(c, heads).eval(), (torch.randn(b, t, c),)


F32 = 4
WORKLOADS = {w.name: w for w in [
    Workload("pointwise", lambda s: f"sin chain, {s['n'] / 1e6:g}M floats",
             {"full": dict(n=4 << 20), "quick": dict(n=1 << 20), "tiny": dict(n=4096)},
             _pointwise, lambda s: 2 * s["n"] * F32),
    Workload("softmax", lambda s: f"softmax {s['rows']}x{s['cols']}",
             {"full": dict(rows=4096, cols=1024), "quick": dict(rows=1024, cols=1024), "tiny": dict(rows=16, cols=64)},
             _softmax, lambda s: 2 * s["rows"] * s["cols"] * F32),
    Workload("layer_norm", lambda s: f"layer_norm {s['rows']}x{s['cols']}",
             {"full": dict(rows=8192, cols=1024), "quick": dict(rows=2048, cols=1024), "tiny": dict(rows=16, cols=64)},
             _layer_norm, lambda s: (2 * s["rows"] * s["cols"] + 2 * s["cols"]) * F32),
    Workload("mlp", lambda s: f"GELU MLP {s['batch']}x{s['d']}->{s['hidden']}->{s['d']}",
             {"full": dict(batch=256, d=1024, hidden=4096), "quick": dict(batch=128, d=512, hidden=2048),
              "tiny": dict(batch=4, d=16, hidden=32)},
             _mlp, None),
    Workload("block", lambda s: f"GPT-2 block B{s['b']} T{s['t']} C{s['c']}",
             {"full": dict(b=4, t=256, c=256, heads=4), "quick": dict(b=2, t=128, c=128, heads=4),
              "tiny": dict(b=1, t=8, c=16, heads=2)},
             _block, None),
]}
