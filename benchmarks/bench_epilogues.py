"""Fused oneDNN epilogues on real models: eager vs minicompile before (epilogues separate) vs after
(measured per shape), one process, interleaved, medians and minimums.

    THREADS=1 python benchmarks/bench_epilogues.py resnet18 --reps 31 --freezing
    THREADS=1 python benchmarks/bench_epilogues.py convnext,vit,gpt2 --reps 31

Models from minicompile/tools/models.py at their bench sizes; ``--freezing`` prepares weights
(BatchNorm folded into the convolutions, which then meet their ReLU). Prints each model's
epilogue choices (the ATen header's lines) and the times. Results: docs/models.md "Fused epilogues".
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from minicompile.backend import minicompile_backend
from minicompile.config import patch
from minicompile.tools.bench import time_interleaved
from minicompile.tools.models import MODELS

LINEAR, CONVOLUTION = torch.ops.mkldnn._linear_pointwise, torch.ops.mkldnn._convolution_pointwise


def compiled(model, inputs, mode: str, freezing: bool):
    """``model`` compiled with MINICOMPILE_CPU_EPILOGUE=mode, called once; (fn, fused count, header lines)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(minicompile_backend(gm, example_inputs))
        return graphs[-1]
    fn = torch.compile(copy.deepcopy(model), backend=backend)
    with torch.no_grad(), patch(cpu_epilogue=mode, prepare_weights=freezing):
        fn(*inputs)
    atens = [g.aten for g in graphs if hasattr(g, "aten")]
    fused = sum(1 for a in atens for n in a.gm.graph.nodes if n.target in (LINEAR.binary, CONVOLUTION.default,
                                                                         CONVOLUTION.binary)
                or (n.target is LINEAR.default and n.args[3] != "none"))
    lines = [line for a in atens for line in a.choices if "epilogue" in line]
    return fn, fused, lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models")
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--freezing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    for name in args.models.split(","):
        model, inputs = MODELS[name].build("full")
        fns = {}
        for mode in ("separate", "auto"):
            t0 = time.perf_counter()
            fns[mode], fused, lines = compiled(model, inputs, mode, args.freezing)
            print(f"{name} {mode}: first call {time.perf_counter() - t0:.1f} s, {fused} epilogues fused, "
                  f"{sum('-> fused' in line for line in lines)} of {len(lines)} choices fused", flush=True)
            for line in lines:
                print("   ", line)
        steps = [lambda: model(*inputs), lambda: fns["separate"](*inputs), lambda: fns["auto"](*inputs)]
        with torch.no_grad():
            for step in steps:
                step()
            times = time_interleaved(steps, args.reps)
        med, low = ([f(t) * 1e3 for t in times] for f in (statistics.median, min))
        print(f"{name} threads {torch.get_num_threads()}: medians eager {med[0]:.2f}, before {med[1]:.2f}, "
              f"after {med[2]:.2f} ms (after/before {med[2] / med[1]:.3f}); minimums {low[0]:.2f}, {low[1]:.2f}, "
              f"{low[2]:.2f} ms (after/before {low[2] / low[1]:.3f})", flush=True)


if __name__ == "__main__":
    main()
