"""Single-threaded pointwise transcendentals: eager vs minicompile vs Inductor, one process.

    OMP_NUM_THREADS=1 python benchmarks/bench_transcendental.py [--reps 41] [--no-inductor]

Each function is ``op(y + b)`` (b a broadcast row, so eager runs two kernels and the compilers
one), GELU backward is ``aten.gelu_backward(g, y + b)``. The three runs of each case take
turns (tools/bench.time_interleaved) and are timed in CPU time of this process, so other
work on a shared machine costs less accuracy than wall time would. Prints medians in
microseconds with the spread between the 25th and 75th percentiles. Results: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench-trans-inductor-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import minicompile  # noqa: E402
from minicompile.tools.bench import time_interleaved  # noqa: E402

aten = torch.ops.aten


def gelu_new(x):
    """GPT-2's gelu_new (transformers.activations.NewGELUActivation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


CASES = {
    "add": lambda y, b, g: y + b,
    "gelu_erf": lambda y, b, g: F.gelu(y + b),
    "gelu_tanh": lambda y, b, g: F.gelu(y + b, approximate="tanh"),
    "gelu_new": lambda y, b, g: gelu_new(y + b),
    "tanh": lambda y, b, g: torch.tanh(y + b),
    "erf": lambda y, b, g: torch.erf(y + b),
    "sigmoid": lambda y, b, g: torch.sigmoid(y + b),
    "silu": lambda y, b, g: F.silu(y + b),
    "exp": lambda y, b, g: torch.exp(y + b),
    "gelu_bwd_erf": lambda y, b, g: aten.gelu_backward(g, y + b),
    "gelu_bwd_tanh": lambda y, b, g: aten.gelu_backward(g, y + b, approximate="tanh"),
}
SHAPES = [(128, 2048), (394, 768)]


def measure(name, shape, reps, inductor):
    fn = CASES[name]
    y, b, g = torch.randn(shape) * 3, torch.randn(shape[-1]), torch.randn(shape)
    runs = {"eager": fn, "minicompile": minicompile.compile(fn)}
    if inductor:
        torch._dynamo.reset()
        runs["inductor"] = torch.compile(fn)
    for f in runs.values():  # compile and warm up
        torch.testing.assert_close(f(y, b, g), fn(y, b, g), rtol=1e-5, atol=1e-5)
        for _ in range(5):
            f(y, b, g)
    steps = [(lambda f=f: f(y, b, g)) for f in runs.values()]
    times = time_interleaved(steps, reps, clock=time.process_time)
    return {k: [t * 1e6 for t in ts] for k, ts in zip(runs, times)}


def summary(ts):
    q = statistics.quantiles(ts, n=4)
    return f"{statistics.median(ts):7.1f} ({q[0]:.0f}-{q[2]:.0f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cols = ["eager", "minicompile"] + ([] if args.no_inductor else ["inductor"])
    print(f"us per call, 1 thread, median (25th-75th percentile) of {args.reps} CPU-time reps")
    print(f"{'case':14} {'shape':10} " + " ".join(f"{c:>20}" for c in cols))
    with torch.no_grad():
        for shape in SHAPES:
            for name in args.cases:
                res = measure(name, shape, args.reps, not args.no_inductor)
                print(f"{name:14} {'x'.join(map(str, shape)):10} " + " ".join(f"{summary(res[c]):>20}" for c in cols),
                      flush=True)


if __name__ == "__main__":
    main()
