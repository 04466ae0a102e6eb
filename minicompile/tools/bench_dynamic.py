"""``minicompile bench --dynamic`` and benchmarks/bench_dynamic.py: our static build, our symbolic
build and Inductor's, side by side.

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

The measuring process is a child (``run_dynamic_bench``) started with empty caches for both
compilers (tools/cold_compile.cold_env), OMP_NUM_THREADS=1 set before torch loads, and
MINICOMPILE_FALLBACK=0 (a failed compile must not time eager under our name).
Measured numbers are in docs/dynamic.md.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from minicompile.tools.bench import _render, machine_info, time_interleaved
from minicompile.tools.cold_compile import cold_env
from minicompile.tools.workloads import WORKLOADS

COLUMNS = ("eager", "mc static", "mc dynamic", "inductor static", "inductor dynamic")
SHORT = {"mc static": "mc s", "mc dynamic": "mc d", "inductor static": "ind s", "inductor dynamic": "ind d"}
COMPILERS = {"mc": "minicompile", "inductor": "inductor"}   # column prefix -> Dynamo backend name
DYNAMIC_DIM = {"block": 1}   # the dimension that varies: the sequence length of the block, else the batch
REPS = {"full": 21, "quick": 21, "tiny": 3}


def counting(backend: str, counts: dict, col: str):
    """A backend that counts its compiles; one object per column, so Dynamo keeps their builds apart."""
    compiler = torch._dynamo.lookup_backend(backend)

    def count_and_compile(gm, example_inputs):
        counts[col] += 1
        return compiler(gm, example_inputs)
    return count_and_compile


def setup(name: str, size: str, columns: tuple) -> tuple[dict, dict]:
    """Each column's call and the compiles each made; every column checked against eager."""
    w = WORKLOADS[name]
    torch.manual_seed(0)
    model, (x,) = w.build(**w.sizes[size])
    dim = DYNAMIC_DIM.get(name, 0)
    half = x.narrow(dim, 0, max(2, x.shape[dim] // 2)).contiguous()
    counts = dict.fromkeys(columns, 0)
    calls = {"eager": lambda: model(x)}
    for col in dict.fromkeys(c.split()[0] for c in columns[1:]):
        static = torch.compile(model, backend=counting(COMPILERS[col], counts, f"{col} static"), dynamic=False)
        dynamic = torch.compile(model, backend=counting(COMPILERS[col], counts, f"{col} dynamic"))
        torch._dynamo.mark_dynamic(half, dim)
        dynamic(half)                      # the symbolic build, compiled at another size ...
        calls[f"{col} static"] = lambda f=static: f(x)
        calls[f"{col} dynamic"] = lambda f=dynamic: f(x)   # ... serves the measured one
    expected = model(x)
    for col, call in calls.items():
        torch.testing.assert_close(call(), expected, atol=1e-3, rtol=1e-3, msg=lambda m: f"{name} {col}: {m}")
    return calls, counts


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


def bench(name: str, size: str, reps: int, columns: tuple) -> list:
    """One table row: per-call medians of every column, the ratios, compile counts, the spread."""
    with torch.no_grad():
        calls, counts = setup(name, size, columns)
        steps = {col: batched(call) for col, call in calls.items()}   # also warms every column up
        times = time_interleaved([step for step, _ in steps.values()], reps, clock=time.process_time)
    per_call = {col: [t / steps[col][1] for t in ts] for col, ts in zip(calls, times)}
    med = {col: statistics.median(t) for col, t in per_call.items()}
    spread = {col: (max(t) - min(t)) / statistics.median(t) for col, t in per_call.items()}
    w = WORKLOADS[name]
    row = [name, w.describe(w.sizes[size])] + [f"{med[c] * 1e3:.3f}" for c in columns]
    row += [f"{med['mc static'] / med['mc dynamic']:.2f}x"]
    row += [f"{med['inductor dynamic'] / med['mc dynamic']:.2f}x"] if "inductor dynamic" in med else []
    return row + [" ".join(str(counts[c]) for c in columns[1:]), f"{max(spread.values()):.0%}"]


def measure(names: list, size: str, reps: int, columns: tuple) -> int:
    """In the child process: the table, printed."""
    torch.set_num_threads(1)
    inductor = "inductor dynamic" in columns
    rows = [["workload", "shape", *(f"{c} ms" for c in columns), "mc static/dynamic"]
            + (["ind dyn/mc dyn"] if inductor else [])
            + [f"compiles ({', '.join(SHORT[c] for c in columns[1:])})", "max spread"]]
    for name in names:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        rows.append(bench(name, size, reps, columns))
        torch._dynamo.reset()
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), "
          f"size {size}; one thread, CPU time; medians of {reps} interleaved reps"
          + ("; 'x' columns above 1.00 favour mc dynamic" if inductor else ""))
    print(_render(rows))
    return 0


def run_dynamic_bench(names: list, size: str, reps: int, inductor: bool = True) -> int:
    """Run the measurement in a child process with empty caches and one OpenMP thread."""
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"minicompile bench --dynamic: unknown workload(s) {', '.join(unknown)}; "
              f"choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "minicompile.tools.bench_dynamic", "--measure", "--size", size,
           "--reps", str(reps), "--workloads", ",".join(names)] + ([] if inductor else ["--no-inductor"])
    with tempfile.TemporaryDirectory(prefix="minicompile-bench-dynamic-") as tmp:
        env = cold_env(tmp, OMP_NUM_THREADS="1", MINICOMPILE_FALLBACK="0")
        return subprocess.run(cmd, env=env).returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(REPS), default="quick")
    p.add_argument("--reps", type=int, help="interleaved repetitions (default 21, tiny 3)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--no-inductor", action="store_true", help="only eager and minicompile's two builds")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)   # the child process
    args = p.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",")]
    reps = args.reps or REPS[args.size]
    if args.measure:
        return measure(names, args.size, reps, COLUMNS[:3] if args.no_inductor else COLUMNS)
    return run_dynamic_bench(names, args.size, reps, not args.no_inductor)


if __name__ == "__main__":
    sys.exit(main())
