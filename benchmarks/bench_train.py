"""Training step benchmark: eager, minicompile and Inductor, side by side in one process.

    python benchmarks/bench_train.py [--reps N] [--models mlp,gpt2_block,layernorm_softmax]

A step is one forward and one backward (``out.backward(grad_out)`` with a fixed random
``grad_out``; no optimizer, gradients zeroed with ``set_to_none`` between steps, outside the
timed region). Three copies of each model start from the same weights: one runs eagerly, one
through ``torch.compile(model, backend="minicompile")``, one through ``torch.compile(model)``
(Inductor). Compile time is the first step (forward and backward both compile then), from
empty caches (fresh MINICOMPILE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR). Every repetition
times one step of each column in turn, starting at another column each time (interleaved, so a
machine-wide slowdown hits all three alike). After the timed steps each compiled column's
gradients are compared with eager's.

"saved" is what autograd keeps for backward in one step, counted with
``torch.autograd.graph.saved_tensors_hooks``: the bytes (numel * itemsize) of every packed
tensor, each storage counted once. It includes the inputs and parameters a graph saves (the
caller holds them anyway), so it compares the three columns, not their activation memory.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

_CACHES = tempfile.TemporaryDirectory(prefix="bench-train-")   # set before torch/minicompile read them
os.environ["MINICOMPILE_CACHE_DIR"] = os.path.join(_CACHES.name, "minicompile")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHES.name, "inductor")
os.environ["MINICOMPILE_FALLBACK"] = "0"   # a failed compile must not time eager under our name

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from minicompile.tools.bench import _render, machine_info, time_interleaved  # noqa: E402
from minicompile.tools.workloads import Block  # noqa: E402


class MLP(nn.Module):
    def __init__(self, width=1024):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class LayerNormSoftmax(nn.Module):
    def __init__(self, width=1024):
        super().__init__()
        self.fc, self.ln, self.out = nn.Linear(width, width), nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return F.softmax(self.out(F.gelu(self.ln(self.fc(x)))), dim=-1)


MODELS = {   # name: (constructor, input shape, description)
    "mlp": (MLP, (256, 1024), "3 x Linear(1024), relu, tanh; x 256x1024"),
    "gpt2_block": (lambda: Block(256, heads=4, seq=128), (4, 128, 256), "B4 T128 C256, 4 heads"),
    "layernorm_softmax": (LayerNormSoftmax, (256, 1024), "Linear, LayerNorm, GELU, Linear, softmax; x 256x1024"),
}
COMPILERS = {   # column: how its model is wrapped
    "eager": lambda m: m,
    "minicompile": lambda m: torch.compile(m, backend="minicompile"),
    "inductor": torch.compile,
}
COLUMNS = tuple(COMPILERS)


def saved_bytes(step) -> int:
    """Bytes autograd packs for backward during ``step()``, each storage counted once."""
    storages: dict = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = max(storages.get(t.untyped_storage().data_ptr(), 0),
                                                       t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(backward=False)
    return sum(storages.values())


def make_step(fn, model, x, grad_out):
    def step(backward=True):
        for p in model.parameters():
            p.grad = None
        x.grad = None
        out = fn(x)
        if backward:
            out.backward(grad_out)
    return step


def setup(name: str) -> dict:
    build, shape, _ = MODELS[name]
    torch.manual_seed(0)
    model = build()
    x, grad_out = torch.randn(shape), None
    columns = {}
    for col in COLUMNS:
        m = copy.deepcopy(model)
        xc = x.clone().requires_grad_(True)
        fn = COMPILERS[col](m)
        if grad_out is None:
            with torch.no_grad():
                grad_out = torch.randn_like(m(x))
        step = make_step(fn, m, xc, grad_out)
        t0 = time.perf_counter()
        step()   # compiles the forward, then the backward
        compile_s = time.perf_counter() - t0
        if col != "eager":
            print(f"  {name} {col}: compiled in {compile_s:.1f} s", file=sys.stderr, flush=True)
        columns[col] = dict(model=m, x=xc, step=step, compile_s=compile_s, times=[])
    return columns


def run(name: str, reps: int) -> dict:
    columns = setup(name)
    for c in columns.values():
        c["saved"] = saved_bytes(c["step"])
        c["step"]()   # warm-up
    order = list(columns.values())
    for c, times in zip(order, time_interleaved([c["step"] for c in order], reps)):
        c["times"] = times
    ref = columns["eager"]
    ref_grads = [ref["x"].grad] + [p.grad for p in ref["model"].parameters()]
    for c in columns.values():
        c["median_s"] = statistics.median(c["times"])
        grads = [c["x"].grad] + [p.grad for p in c["model"].parameters()]
        c["max_diff"] = max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))
    return columns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    rows = [["model", "eager ms", "minicompile ms", "inductor ms", "mc / ind", "mc / eager",
             "compile s mc / ind", "saved KiB eager / mc / ind", "max |grad diff| mc / ind"]]
    for name in args.models.split(","):
        torch._dynamo.reset()
        cols = run(name, args.reps)
        ms = {k: c["median_s"] * 1e3 for k, c in cols.items()}
        rows.append([name, f"{ms['eager']:.2f}", f"{ms['minicompile']:.2f}", f"{ms['inductor']:.2f}",
                     f"{ms['inductor'] / ms['minicompile']:.2f}x", f"{ms['eager'] / ms['minicompile']:.2f}x",
                     f"{cols['minicompile']['compile_s']:.1f} / {cols['inductor']['compile_s']:.1f}",
                     " / ".join(f"{cols[k]['saved'] / 1024:.0f}" for k in COLUMNS),
                     f"{cols['minicompile']['max_diff']:.1e} / {cols['inductor']['max_diff']:.1e}"])
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads); "
          f"float32, forward + backward per step, medians of {args.reps} interleaved steps; "
          f"mc / ind > 1: minicompile faster")
    for name in args.models.split(","):
        print(f"  {name}: {MODELS[name][2]}")
    print()
    print(_render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
