"""Dynamic-shape benchmark: our static build, our symbolic build and Inductor's, side by side.

    python benchmarks/bench_dynamic.py [--size quick|full|tiny] [--reps N] [--workloads a,b]

For each workload of ``minicompile bench`` (tools/workloads.py), one process builds the model
once and compiles it five ways: eager; minicompile and Inductor static (``dynamic=False``, at
the measured size); minicompile and Inductor dynamic (the batch dimension, or the sequence
length of the GPT-2 block, marked dynamic with ``torch._dynamo.mark_dynamic``, compiled at
half the measured size and then *called* at the measured size, so the timed build is the one
that serves every size). Every column's output at the measured size is compared with eager,
and the compiles each column made are counted (a dynamic column must not recompile for the
measured size). Then each repetition times every column in turn (interleaved, starting at
another column each time: tools/bench.time_interleaved), each step calling the column as
often as fills about 10 ms; the table shows medians per call, and the largest spread
(max - min over the median) of any column, a measure of how noisy the machine was. Every
column runs on one thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)) and is timed by the
process's CPU time, not wall time: on a machine shared with other work, a wall-clock step
mostly measures how long the scheduler kept us waiting. This compares the kernels, not
their threading.
Both compilers start from empty caches. Measured numbers are in docs/dynamic.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

_CACHES = tempfile.TemporaryDirectory(prefix="bench-dynamic-")   # set before torch/minicompile read them
os.environ["MINICOMPILE_CACHE_DIR"] = os.path.join(_CACHES.name, "minicompile")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHES.name, "inductor")
os.environ["MINICOMPILE_FALLBACK"] = "0"   # a failed compile must not time eager under our name
os.environ["OMP_NUM_THREADS"] = "1"        # one thread, timed by its CPU time (see the docstring)

import torch  # noqa: E402
from torch._inductor.compile_fx import compile_fx  # noqa: E402  (the comparison only)

from minicompile.backend import minicompile_backend  # noqa: E402
from minicompile.tools.bench import _render, machine_info, time_interleaved  # noqa: E402
from minicompile.tools.workloads import WORKLOADS  # noqa: E402

COLUMNS = ("eager", "mc static", "mc dynamic", "inductor static", "inductor dynamic")
DYNAMIC_DIM = {"block": 1}   # the dimension that varies: the sequence length of the block, else the batch


def counting(compiler, counts: dict, col: str):
    """A backend that counts its compiles; one object per column, so Dynamo keeps their builds apart."""
    def backend(gm, example_inputs):
        counts[col] += 1
        return compiler(gm, example_inputs)
    return backend


def setup(name: str, size: str) -> tuple[dict, dict, torch.Tensor]:
    """Each column's call, the compiles each made, and eager's output at the measured size."""
    w = WORKLOADS[name]
    torch.manual_seed(0)
    model, (x,) = w.build(**w.sizes[size])
    dim = DYNAMIC_DIM.get(name, 0)
    half = x.narrow(dim, 0, max(2, x.shape[dim] // 2)).contiguous()
    counts = dict.fromkeys(COLUMNS, 0)
    calls = {"eager": lambda: model(x)}
    for col, compiler in (("mc", minicompile_backend), ("inductor", compile_fx)):
        static = torch.compile(model, backend=counting(compiler, counts, f"{col} static"), dynamic=False)
        dynamic = torch.compile(model, backend=counting(compiler, counts, f"{col} dynamic"))
        torch._dynamo.mark_dynamic(half, dim)
        dynamic(half)                      # the symbolic build, compiled at another size ...
        calls[f"{col} static"] = lambda f=static: f(x)
        calls[f"{col} dynamic"] = lambda f=dynamic: f(x)   # ... serves the measured one
    with torch.no_grad():
        expected = model(x)
        for col, call in calls.items():
            torch.testing.assert_close(call(), expected, atol=1e-3, rtol=1e-3, msg=lambda m: f"{name} {col}: {m}")
    return calls, counts, expected


def batched(call, seconds: float = 0.01):
    """``call`` repeated often enough that one timed step takes about ``seconds`` (a short call
    timed alone mostly measures the scheduler of a busy machine); returns (step, calls per step)."""
    t0 = time.process_time()
    call()
    n = max(1, int(seconds / max(time.process_time() - t0, 1e-6)))

    def step():
        for _ in range(n):
            call()
    return step, n


def bench(name: str, size: str, reps: int) -> list:
    with torch.no_grad():
        calls, counts, _ = setup(name, size)
        steps = {col: batched(call) for col, call in calls.items()}   # also warms every column up
        times = time_interleaved([step for step, _ in steps.values()], reps, clock=time.process_time)
    per_call = {col: [t / steps[col][1] for t in ts] for col, ts in zip(calls, times)}
    med = {col: statistics.median(t) for col, t in per_call.items()}
    spread = {col: (max(t) - min(t)) / statistics.median(t) for col, t in per_call.items()}
    w = WORKLOADS[name]
    row = [name, w.describe(w.sizes[size])] + [f"{med[c] * 1e3:.3f}" for c in COLUMNS]
    row += [f"{med['mc static'] / med['mc dynamic']:.2f}x", f"{med['inductor dynamic'] / med['mc dynamic']:.2f}x",
            " ".join(str(counts[c]) for c in COLUMNS[1:]), f"{max(spread.values()):.0%}"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=["full", "quick", "tiny"], default="quick")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [["workload", "shape", *(f"{c} ms" for c in COLUMNS), "mc static/dynamic",
             "ind dyn/mc dyn", "compiles (mc s, mc d, ind s, ind d)", "max spread"]]
    for name in args.workloads.split(","):
        print(f"  {name} ...", file=sys.stderr, flush=True)
        rows.append(bench(name, args.size, args.reps))
        torch._dynamo.reset()
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), "
          f"size {args.size}; one thread, CPU time; medians of {args.reps} interleaved reps; "
          "'x' columns above 1.00 favour mc dynamic")
    print(_render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
