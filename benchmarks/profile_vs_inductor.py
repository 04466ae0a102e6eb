"""One model compiled by minicompile and by Inductor, profiled kernel by kernel in one process.

    python benchmarks/profile_vs_inductor.py mixer --size quick --threads 1,2 --reps 21 --top 12
    python benchmarks/profile_vs_inductor.py gpt2 --train --size quick --threads 1   # a training step

Times eager, minicompile and Inductor in interleaved rounds (each round runs every thread count
and every column; medians), then profiles each compiled model with torch.profiler at each thread
count and prints, side by side, the ms per call of its generated kernels (ours: ``kernelN_*`` and
``groupN`` events; Inductor's: ``graph_N_cpp_*``, with ``cpp.enable_kernel_profile``) and of its
outermost ATen calls (convolutions, GEMMs, copies) by input shapes, largest first. ``--train``
takes a model of ``bench --train --models`` (tools/train_models.py) and times its training step
(its loss, then backward; the compiled backward's kernels count with the forward's). Results:
docs/models.md, "Kernel by kernel against Inductor"; docs/training.md for training.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from collections import defaultdict

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile, record_function

from minicompile.tools.models import MODELS
from minicompile.tools.train_models import TRAIN_MODELS

_KERNEL = re.compile(r"^(graph_\d+_)?(cpp_|triton_|kernel|group)")
_GRAPH = re.compile(r"^(minicompile_graph_\d+|## Call CompiledFxGraph .*|graph_\d+_inductor_wrapper_call)$")


def _outermost(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(("aten::", "mkldnn::")) or _KERNEL.match(parent.name):
            return False
        parent = parent.cpu_parent
    return True


def _shapes(event) -> str:
    """The shapes of an ATen call's inputs (ours: of the op under its record_function)."""
    while not any(event.input_shapes) and event.cpu_children:
        event = max(event.cpu_children, key=lambda c: c.cpu_time_total)
    return " " + "x".join(str(list(s)) for s in event.input_shapes if s) if any(event.input_shapes) else ""


def _column(event) -> str | None:
    while event is not None:
        if event.name.startswith("minicompile_graph_"):
            return "minicompile"
        if event.name.startswith("## Call CompiledFxGraph"):
            return "inductor"
        event = event.cpu_parent
    return None


def breakdown(fns: dict, calls: int, shapes: bool = False) -> dict:
    """Both compiled models profiled in one session, their calls alternating; per column, ms per call:
    {"graph": time inside the compiled graph, name: time of each kernel / outermost ATen op}."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
        for _ in range(calls):
            for fn in fns.values():
                fn()
            for _ in range(10):
                with record_function("empty_record_function"):
                    pass
    out = {col: defaultdict(list) for col in fns}
    # ours are Python record_function events (Inductor's are C++): what an empty one measures is
    # taken off each kernel; ATen calls are timed by the C++ op under our event, as Inductor's
    empty = statistics.median(e.cpu_time_total for e in prof.events() if e.name == "empty_record_function")
    for e in prof.events():
        col, name = _column(e), e.name
        if col is None:
            continue
        if _GRAPH.match(name):
            if not name.endswith("wrapper_call"):
                out[col]["graph"].append(e.cpu_time_total)
        elif _KERNEL.match(name):
            taken_off = empty if col == "minicompile" else 0.0
            out[col][re.sub(r"^graph_\d+_", "", name)].append(max(e.cpu_time_total - taken_off, 0.0))
        elif name.startswith(("aten::", "mkldnn::")) and _outermost(e):
            out[col][name + (_shapes(e) if shapes else "")].append(e.cpu_time_total)
    # each name's median duration times its calls per graph call: a call the machine's other
    # work preempted moves a median less than a sum
    return {col: {k: statistics.median(v) * len(v) / 1e3 / calls for k, v in d.items()} | {"empty": empty / 1e3}
            for col, d in out.items()}


def _kernel_count(d: dict) -> tuple:
    kernels = [v for k, v in d.items() if _KERNEL.match(k)]
    return len(kernels), sum(kernels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", default="quick")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--calls", type=int, default=20, help="calls per profile")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-shapes", action="store_true", help="ATen calls not keyed by their input shapes")
    parser.add_argument("--train", action="store_true", help="a training step of bench --train --models' model")
    args = parser.parse_args()
    inductor_config.cpp.enable_kernel_profile = True
    threads = [int(t) for t in args.threads.split(",")]
    model, inputs = (TRAIN_MODELS if args.train else MODELS)[args.model].build(args.size)
    fns = {"eager": _step(model) if args.train else model}
    with torch.enable_grad() if args.train else torch.no_grad():
        for col, backend in (("minicompile", "minicompile"), ("inductor", "inductor")):
            fns[col] = torch.compile(model, backend=backend)
            if args.train:
                fns[col] = _step(fns[col])
            t0 = time.perf_counter()
            fns[col](*inputs)
            print(f"{col}: first call {time.perf_counter() - t0:.1f} s", flush=True)
        samples = defaultdict(list)
        for t in threads * 2:  # a graph may recompile for a new thread count: none does while timed
            torch.set_num_threads(t)
            for fn in fns.values():
                fn(*inputs)
        for r in range(args.reps):
            for t in threads:
                torch.set_num_threads(t)
                cols = list(fns)
                for col in cols[r % 3:] + cols[:r % 3]:
                    t0 = time.perf_counter()
                    fns[col](*inputs)
                    samples[col, t].append(time.perf_counter() - t0)
        for t in threads:
            med = {c: statistics.median(samples[c, t]) * 1e3 for c in fns}
            print(f"\n{args.model} ({args.size}), {t} thread(s), medians of {args.reps}: eager {med['eager']:.2f}, "
                  f"minicompile {med['minicompile']:.2f}, inductor {med['inductor']:.2f} ms "
                  f"(mc/inductor {med['minicompile'] / med['inductor']:.2f})")
            torch.set_num_threads(t)
            prof = breakdown({c: (lambda c=c: fns[c](*inputs)) for c in ("minicompile", "inductor")}, args.calls,
                             not args.no_shapes)
            for col, d in prof.items():
                n, k = _kernel_count(d)
                ext = sum(v for name, v in d.items() if name not in ("graph", "empty") and not _KERNEL.match(name))
                print(f"  {col}: graph {d.get('graph', 0):.2f} ms = {n} kernels {k:.2f} + ATen {ext:.2f} "
                      f"+ rest {d.get('graph', 0) - k - ext:.2f} (an empty record_function: {d['empty'] * 1e3:.1f} us)")
                top = sorted(((v, name) for name, v in d.items() if name not in ("graph", "empty")), reverse=True)[:args.top]
                for v, name in top:
                    print(f"    {v:7.3f}  {name[:110]}")
        torch.set_num_threads(max(threads))


def _step(fn):
    """A training step of ``fn``: its loss, then backward (gradients accumulate; the time does not change)."""
    def step(*inputs):
        fn(*inputs).backward()
    return step


if __name__ == "__main__":
    main()
