"""Cache-hit overhead of minicompile capture vs torch.compile(backend="eager").

Both compile the same tiny function with an eager backend, are warmed up, and are then
timed side by side in one run on the same inputs. The function's own work (one add on a
small tensor) is timed eagerly too, so overhead = compiled - eager. Prints medians and
the ratio minicompile / Dynamo (lower is better; the target is < 1).

    python benchmarks/bench_capture_overhead.py [--repeat 30] [--number 2000]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import timeit

import torch

import minicompile.capture as capture


def tiny(x, y):
    return x + y


def tiny_module():
    return torch.nn.Linear(4, 4)


def measure(fn, args, repeat: int, number: int) -> float:
    """Median microseconds per call."""
    for _ in range(200):
        fn(*args)
    times = timeit.repeat(lambda: fn(*args), repeat=repeat, number=number)
    return statistics.median(times) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--number", type=int, default=2000)
    opts = ap.parse_args()
    x, y = torch.randn(8), torch.randn(8)
    mod = tiny_module()
    inp = torch.randn(2, 4)
    cases = {
        "tiny fn  x + y": (tiny, (x, y)),
        "nn.Linear(4, 4)": (mod, (inp,)),
    }
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'case':18s} {'eager us':>9s} {'minicompile us':>15s} {'dynamo us':>10s} "
          f"{'mc overhead':>12s} {'dynamo overhead':>16s} {'ratio':>6s}")
    with torch.no_grad():
        pass
    for name, (fn, args) in cases.items():
        mc = capture.compile(fn)
        dyn = torch.compile(fn, backend="eager")
        with torch.inference_mode(False):
            eager_t = measure(fn, args, opts.repeat, opts.number)
            mc_t = measure(mc, args, opts.repeat, opts.number)
            dyn_t = measure(dyn, args, opts.repeat, opts.number)
        mc_o, dyn_o = mc_t - eager_t, dyn_t - eager_t
        print(f"{name:18s} {eager_t:9.2f} {mc_t:15.2f} {dyn_t:10.2f} {mc_o:12.2f} "
              f"{dyn_o:16.2f} {mc_o / dyn_o if dyn_o > 0 else float('nan'):6.2f}")
        assert torch.equal(mc(*args), fn(*args))
        assert mc.capture_report.graph_count == 1, mc.capture_report


if __name__ == "__main__":
    main()
