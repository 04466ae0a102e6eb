"""What MINICOMPILE_CHECK=1 costs per call: eager, compiled, and compiled with the check, side by side.

Three small inference models (an MLP, a transformer block, a conv-BN-ReLU CNN) are compiled twice,
once with the check (a backend that turns it on for its graphs, so Dynamo keeps both), warmed up,
and timed alternately in one run. Times are CPU seconds of this process per call (the best of
``--rounds`` medians), which a machine shared with other work disturbs less than wall time; run
with OMP_NUM_THREADS=1 for one thread.

    OMP_NUM_THREADS=1 python benchmarks/bench_check.py [--calls 30] [--rounds 5]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn

from minicompile.backend import minicompile_backend
from minicompile.config import patch


class Block(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


def models() -> dict:
    torch.manual_seed(0)
    return {
        "mlp 256-512-512-10, batch 64": (nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                                                       nn.Linear(512, 10)), [torch.randn(64, 256)]),
        "transformer block, 8x64x64": (Block(), [torch.randn(8, 64, 64)]),
        "cnn conv-bn-relu x2, 8x3x32x32": (nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval(), [torch.randn(8, 3, 32, 32)]),
    }


def checked_backend(gm, example_inputs):
    with patch(check=True):
        return minicompile_backend(gm, example_inputs)


def cpu_time_per_call(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.process_time()
        fn(*args)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    with torch.no_grad():
        for name, (model, args) in models().items():
            runs = {"eager": model, "compiled": torch.compile(model, backend="minicompile"),
                    "compiled + check": torch.compile(copy.deepcopy(model), backend=checked_backend)}
            for fn in runs.values():
                fn(*args)
            best = {k: min(cpu_time_per_call(fn, args, opts.calls) for _ in range(opts.rounds)) * 1e3
                    for k, fn in runs.items()}
            ratio = best["compiled + check"] / (best["eager"] + best["compiled"])
            print(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in best.items())
                  + f"; check / (eager + compiled) = {ratio:.2f}")


if __name__ == "__main__":
    main()
