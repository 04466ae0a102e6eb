"""Optimizer step benchmark: eager (foreach), Inductor and minicompile, side by side in one process.

    python benchmarks/bench_optimizer.py [--reps N] [--blocks N] [--width N] [--optimizers sgd,adam,adamw] [--ungrouped]

A stack of Linear(width, width) + LayerNorm(width) blocks (default 25 x 640: 10.3M parameters
in 100 tensors) with gradients filled with random values once. For each optimizer (SGD with
momentum, Adam, AdamW; all ``foreach=True``) three copies of the model and optimizer start
from the same state: one steps eagerly, one through ``torch.compile(opt.step)`` (Inductor),
one through ``torch.compile(opt.step, backend="minicompile")`` (and with ``--ungrouped`` one more
compiled by minicompile with horizontal groups off: one C call and one parallel region per kernel). Compile time is the first two
compiled calls (the first step creates the optimizer state and compiles a graph of its own). Then every repetition times one step of each column in turn (interleaved, so
a machine-wide slowdown hits all three alike; each repetition starts at another column); the table shows medians, ratios, and the
bandwidth each step reaches against the bytes it has to move (read p, grad and the state,
write p and the state), next to a plain copy of the parameters' size (timed in the same
interleaved loop). After the last step the compiled
columns' parameters are compared with eager's (they took the same steps). Both compilers start
from empty caches (fresh MINICOMPILE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR): compile times are cold.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

_CACHES = tempfile.TemporaryDirectory(prefix="bench-optimizer-")   # set before torch/minicompile read them
os.environ["MINICOMPILE_CACHE_DIR"] = os.path.join(_CACHES.name, "minicompile")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHES.name, "inductor")
os.environ["MINICOMPILE_FALLBACK"] = "0"   # a failed compile must not time eager under our name

import torch  # noqa: E402

from minicompile.config import patch  # noqa: E402
from minicompile.tools.bench import _render, machine_info, time_interleaved  # noqa: E402

OPTIMIZERS = {
    # name: (constructor, float32 tensors read + written per parameter element)
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True), 5),     # p, g, buf; p, buf
    "adam": (lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True), 7),                 # p, g, m, v; p, m, v
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2, foreach=True), 7),
}
COLUMNS = ("eager", "inductor", "minicompile")
UNGROUPED = "mc ungrouped"   # --ungrouped: minicompile with config.horizontal_groups off


def make_model(blocks: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    model = torch.nn.Sequential(*layers)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return model


def setup(name: str, model: torch.nn.Module, extra: tuple = ()) -> dict:
    """One (model copy, optimizer, step function, compile seconds) per column."""
    build, _ = OPTIMIZERS[name]
    columns = {}
    for col in COLUMNS + extra:
        m = copy.deepcopy(model)
        for p, q in zip(m.parameters(), model.parameters()):
            p.grad = q.grad.clone()   # (deepcopy does not copy a Parameter's .grad)
        opt = build(list(m.parameters()))
        if col == "eager":
            step, compile_s = opt.step, 0.0
        else:
            step = torch.compile(opt.step) if col == "inductor" else torch.compile(opt.step, backend="minicompile")
            t0 = time.perf_counter()
            with patch(horizontal_groups=col != UNGROUPED):
                step()   # the first step creates the state (a graph of its own) ...
                step()   # ... the second compiles the step every later call runs
            compile_s = time.perf_counter() - t0
            print(f"  {name} {col}: compiled in {compile_s:.1f} s", file=sys.stderr, flush=True)
        columns[col] = dict(model=m, step=step, compile_s=compile_s, times=[])
    for _ in range(2):   # the compiled columns took two steps while compiling
        columns["eager"]["step"]()
    return columns


def run(name: str, model, reps: int, extra: tuple = ()) -> dict:
    columns = setup(name, model, extra)
    numel = sum(p.numel() for p in model.parameters())
    src, dst = torch.randn(numel), torch.empty(numel)
    columns["copy"] = dict(model=columns["eager"]["model"], step=lambda: dst.copy_(src), times=[])
    for _ in range(2):            # warm-up: page in the state, settle the caches
        for c in columns.values():
            c["step"]()
    order = list(columns.values())
    for c, times in zip(order, time_interleaved([c["step"] for c in order], reps)):
        c["times"] = times
    ref = list(columns["eager"]["model"].parameters())
    for c in columns.values():
        c["median_s"] = statistics.median(c["times"])
        c["max_diff"] = max((p - r).abs().max().item() for p, r in zip(c["model"].parameters(), ref))
    return columns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=25)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--ungrouped", action="store_true", help="one more column: minicompile with "
                        "horizontal groups off (one C call and parallel region per kernel)")
    args = parser.parse_args(argv)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    model = make_model(args.blocks, args.width)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    rows = [["optimizer", "eager ms", "inductor ms", "minicompile ms", "mc / ind", "mc / eager",
             "GB/s eager / ind / mc (copy)", "compile s ind / mc", "max |diff| ind / mc"]
            + (["ungrouped ms", "mc / ungrouped"] if args.ungrouped else [])]
    extra = (UNGROUPED,) if args.ungrouped else ()
    for name in args.optimizers.split(","):
        torch._dynamo.reset()
        cols = run(name, model, args.reps, extra)
        ms = {k: c["median_s"] * 1e3 for k, c in cols.items()}
        nbytes = OPTIMIZERS[name][1] * 4 * numel
        gbs = " / ".join(f"{nbytes / cols[k]['median_s'] / 1e9:.1f}" for k in COLUMNS)
        copy_bps = 2 * 4 * numel / cols["copy"]["median_s"]
        rows.append([name, f"{ms['eager']:.2f}", f"{ms['inductor']:.2f}", f"{ms['minicompile']:.2f}",
                     f"{ms['inductor'] / ms['minicompile']:.2f}x", f"{ms['eager'] / ms['minicompile']:.2f}x",
                     f"{gbs} ({copy_bps / 1e9:.1f})",
                     f"{cols['inductor']['compile_s']:.1f} / {cols['minicompile']['compile_s']:.1f}",
                     f"{cols['inductor']['max_diff']:.1e} / {cols['minicompile']['max_diff']:.1e}"]
                    + ([f"{ms[UNGROUPED]:.2f}", f"{ms[UNGROUPED] / ms['minicompile']:.2f}x"] if extra else []))
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads); "
          f"{numel / 1e6:.1f}M parameters in {len(params)} tensors ({args.blocks} x Linear({args.width}) + "
          f"LayerNorm); medians of {args.reps} interleaved steps; mc / ind > 1: minicompile faster")
    print()
    print(_render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
