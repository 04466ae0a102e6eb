"""One benchmark workload in its own process: ``python -m minicompile.tools.bench_worker ...``.

The parent (bench.py) points MINICOMPILE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR at fresh
directories, runs the "cold" phase (all timings; compiles start from empty caches), then
the "warm" phase in a new process with the same directories (compile times only). Progress
goes to stderr as ``@progress <step>`` lines; the result is written as JSON to --result.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from minicompile.tools.bench import time_interleaved
from minicompile.tools.workloads import WORKLOADS


def progress(step: str) -> None:
    print(f"@progress {step}", file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _calls_per_sample(fn, inputs, device: str, min_sample: float) -> int:
    for _ in range(3):
        fn(*inputs)
    sync(device)
    t0 = time.perf_counter()
    fn(*inputs)
    sync(device)
    return max(1, int(min_sample / max(time.perf_counter() - t0, 1e-9)))


def interleaved_samples(fns: dict, inputs, reps: int, device: str, min_sample: float = 2e-3) -> dict:
    """Seconds per call of each of ``fns``, ``reps`` samples each, taken in turns (each round
    starts at another one), so a machine that slows down mid-run slows every column alike.
    Each sample repeats its fn enough times to last ``min_sample``."""
    inner = {name: _calls_per_sample(fn, inputs, device, min_sample) for name, fn in fns.items()}

    def sample(fn, n):
        def run():
            for _ in range(n):
                fn(*inputs)
            sync(device)
        return run
    times = time_interleaved([sample(fns[name], inner[name]) for name in fns], reps)
    return {name: [t / inner[name] for t in ts] for name, ts in zip(fns, times)}


def timing(samples: list) -> dict:
    """Median seconds, and the spread: the interquartile range as a fraction of the median."""
    q1, median, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return {"median_s": median, "spread": (q3 - q1) / median if median > 0 else 0.0}


def median_seconds(fn, inputs, reps: int, device: str, min_sample: float = 2e-3) -> float:
    return timing(interleaved_samples({"fn": fn}, inputs, reps, device, min_sample)["fn"])["median_s"]


def max_diff(out, ref) -> float:
    flat_out, _ = torch.utils._pytree.tree_flatten(out)
    flat_ref, _ = torch.utils._pytree.tree_flatten(ref)
    return max(((o.double() - r.double()).abs().max().item() for o, r in zip(flat_out, flat_ref)
                if isinstance(r, torch.Tensor) and r.numel()), default=0.0)


def compile_once(label: str, model, inputs, backend, device: str, expected):
    """Compile (first call) from whatever the caches hold: (result columns, the compiled model)."""
    progress(f"{label} compile")
    try:
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend=backend) if backend else torch.compile(model)
        out = compiled(*inputs)
        sync(device)
        return {"compile_s": time.perf_counter() - t0, "max_abs_diff": max_diff(out, expected)}, compiled
    except Exception as e:  # one failing column must not lose the others
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}, None


def copy_bandwidth(nbytes: int, reps: int, device: str) -> float:
    """Bytes/s of ``dst.copy_(src)`` moving ``nbytes`` in total (half read, half written)."""
    n = max(1, nbytes // 2 // 4)
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    return 2 * n * 4 / median_seconds(lambda: dst.copy_(src), (), reps, device)


def run(workload: str, size: str, phase: str, reps: int, device: str, inductor: bool,
        warm_in_process: bool = False) -> dict:
    w = WORKLOADS[workload]
    params = w.sizes[size]
    torch.manual_seed(0)
    model, inputs = w.build(**params)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    result = {"workload": workload, "shape": w.describe(params), "phase": phase}
    timed = phase == "cold"
    with torch.no_grad():
        # not the process's first parallel region: there eager's second thread sometimes computes
        # sin/cos/exp ~1e-4 off (torch 2.13 CPU, seen in 1 of ~10 fresh processes; docs/testing.md)
        model(*inputs)
        expected = model(*inputs)
        backends = [("minicompile", "minicompile")] + ([("inductor", None)] if inductor else [])
        # Dynamo's cache keeps both compiled models: a compiled callable guards on its own entries
        runs = {"eager": model}
        for label, backend in backends:
            result[label], runs[label] = compile_once(label, model, inputs, backend, device, expected)
        if timed:
            progress("eager, minicompile and Inductor, in turns")
            samples = interleaved_samples({k: f for k, f in runs.items() if f is not None}, inputs, reps, device)
            result["eager"] = timing(samples.pop("eager"))
            for label, s in samples.items():
                result[label].update(timing(s))
        if warm_in_process:  # --quick: the warm compile reuses this process (and its in-memory caches)
            for label, backend in backends:
                torch._dynamo.reset()
                warm, _ = compile_once(label, model, inputs, backend, device, expected)
                result[label]["warm_compile_s"] = warm.get("compile_s")
        if timed and w.min_bytes is not None:
            progress("copy bandwidth")
            result["min_bytes"] = w.min_bytes(params)
            result["copy_bytes_per_s"] = copy_bandwidth(result["min_bytes"], reps, device)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--size", required=True)
    p.add_argument("--phase", choices=["cold", "warm"], required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--warm-in-process", action="store_true")
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    result = run(args.workload, args.size, args.phase, args.reps, args.device, not args.no_inductor,
                 args.warm_in_process)
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
