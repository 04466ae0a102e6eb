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


# ---------------------------------------------------------------- training workloads

class DeepMLP(nn.Module):
    """Three Linear layers with ReLU and tanh: the training benchmark's MLP."""

    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class LayerNormSoftmax(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc, self.ln, self.out = nn.Linear(width, width), nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return F.softmax(self.out(F.gelu(self.ln(self.fc(x)))), dim=-1)


class SmallCNN(nn.Module):
    """Conv + BatchNorm (train mode: batch statistics, running statistics updated) + ReLU, max
    pooling, a residual pair of convolutions, global average pooling and a Linear head."""

    def __init__(self, channels, classes=10):
        super().__init__()
        c = channels
        self.stem, self.bn0 = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn0(self.stem(x))), 2)
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        x = F.relu(x + y)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


@dataclass
class TrainWorkload:
    """A model in train mode and the shape of its input; sizes as for WORKLOADS."""
    name: str
    describe: Callable[[dict], str]
    sizes: dict                         # size name -> its parameters; "shape" is the input's
    build: Callable[[dict], nn.Module]  # (a size's parameters) -> the model


TRAIN_WORKLOADS = {w.name: w for w in [
    TrainWorkload("mlp", lambda s: f"3 x Linear({s['width']}), relu, tanh; x {_dims(s['shape'])}",
                  {"full": dict(width=1024, shape=(256, 1024)), "quick": dict(width=512, shape=(128, 512)),
                   "tiny": dict(width=16, shape=(4, 16))}, lambda s: DeepMLP(s["width"])),
    TrainWorkload("gpt2_block", lambda s: "B{} T{} C{}, {} heads (attention written out)".format(*s["shape"], s["heads"]),
                  {"full": dict(c=256, heads=4, shape=(4, 128, 256)), "quick": dict(c=128, heads=4, shape=(2, 64, 128)),
                   "tiny": dict(c=16, heads=2, shape=(1, 8, 16))},
                  lambda s: Block(s["c"], heads=s["heads"], seq=s["shape"][1])),
    TrainWorkload("layernorm_softmax", lambda s: f"Linear, LayerNorm, GELU, Linear, softmax; x {_dims(s['shape'])}",
                  {"full": dict(width=1024, shape=(256, 1024)), "quick": dict(width=512, shape=(128, 512)),
                   "tiny": dict(width=16, shape=(4, 16))}, lambda s: LayerNormSoftmax(s["width"])),
    TrainWorkload("cnn", lambda s: f"conv+BN(train)+relu, maxpool, residual convs, avgpool, Linear; "
                                   f"C{s['channels']}, x {_dims(s['shape'])}",
                  {"full": dict(channels=32, shape=(32, 3, 32, 32)), "quick": dict(channels=16, shape=(16, 3, 32, 32)),
                   "tiny": dict(channels=4, shape=(2, 3, 8, 8))}, lambda s: SmallCNN(s["channels"])),
]}


def _dims(shape) -> str:
    return "x".join(map(str, shape))


def build_train(name: str, size: str) -> tuple[nn.Module, tuple]:
    """The training workload ``name`` (in train mode) and its input's shape."""
    params = TRAIN_WORKLOADS[name].sizes[size]
    return TRAIN_WORKLOADS[name].build(params).train(), params["shape"]
