"""The inference layout choice on CNNs: eager, minicompile with its convolutions pinned NCHW, minicompile
as it chooses (``conv_layout`` "auto", measured), and Inductor, in one process.

    python benchmarks/bench_conv_layout.py resnext efficientnet --threads 1 --reps 41

Each model is compiled twice by minicompile, once under ``conv_channels_last=False`` (every
convolution as the user wrote it: NCHW here, as no model's input is channels-last) and once as
shipped; the four callables are timed in turns (``tools/bench.time_interleaved``; process CPU time at one thread, which a
busy machine's waits do not inflate; wall time at more), medians. Prints each model's layout choice
as its ATen graph's header gives it. Results: docs/models.md, "Layout choice counts every convolution".
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from minicompile.aot.passes import constructed_by
from minicompile.backend import minicompile_backend
from minicompile.config import patch
from minicompile.tools.bench import time_interleaved
from minicompile.tools.models import MODELS


def compiled(model, inputs, **knobs):
    """(the compiled model, its layout choice lines) after one call under ``knobs``."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(minicompile_backend(gm, example_inputs))
        return graphs[-1]
    fn = torch.compile(copy.deepcopy(model), backend=backend)
    with patch(**knobs), torch.no_grad():
        fn(*inputs)
    return fn, [line for g in graphs if hasattr(g, "aten") for line in constructed_by(g.aten).splitlines()
                if "layout of" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", choices=sorted(MODELS))
    parser.add_argument("--size", default="quick", choices=("full", "quick", "tiny"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=41)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    for name in args.models:
        torch._dynamo.reset()
        model, inputs = MODELS[name].build(args.size)
        nchw, _ = compiled(model, inputs, conv_channels_last=False)
        auto, layout = compiled(model, inputs)
        inductor = torch.compile(copy.deepcopy(model))
        steps = {"eager": model, "mc nchw": nchw, "mc auto": auto, "inductor": inductor}
        with torch.no_grad():
            for fn in steps.values():
                for _ in range(3):
                    fn(*inputs)
            times = time_interleaved([lambda fn=fn: fn(*inputs) for fn in steps.values()], args.reps, clock)
        ms = {k: statistics.median(t) * 1e3 for k, t in zip(steps, times)}
        print(f"{name} ({args.size}), {args.threads} thread(s), load {os.getloadavg()[0]:.2f}: "
              + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
              + f" ms; auto/inductor {ms['mc auto'] / ms['inductor']:.2f}, nchw/inductor {ms['mc nchw'] / ms['inductor']:.2f}")
        for line in layout:
            print("   ", line)


if __name__ == "__main__":
    main()
