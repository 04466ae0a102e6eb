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

from minicompile.tools.workloads import WORKLOADS


def progress(step: str) -> None:
    print(f"@progress {step}", file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, inputs, reps: int, device: str, min_sample: float = 2e-3) -> float:
    """Median over ``reps`` samples; each sample repeats fn enough times to last ``min_sample``."""
    for _ in range(3):
        fn(*inputs)
    sync(device)
    t0 = time.perf_counter()
    fn(*inputs)
    sync(device)
    inner = max(1, int(min_sample / max(time.perf_counter() - t0, 1e-9)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*inputs)
        sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def max_diff(out, ref) -> float:
    flat_out, _ = torch.utils._pytree.tree_flatten(out)
    flat_ref, _ = torch.utils._pytree.tree_flatten(ref)
    return max(((o.double() - r.double()).abs().max().item() for o, r in zip(flat_out, flat_ref)
                if isinstance(r, torch.Tensor) and r.numel()), default=0.0)


def compile_and_time(label: str, model, inputs, backend, reps: int, device: str, expected, timed: bool) -> dict:
    """Compile (first call) from whatever the caches hold, then optionally time the compiled model."""
    progress(f"{label} compile")
    torch._dynamo.reset()
    try:
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend=backend) if backend else torch.compile(model)
        out = compiled(*inputs)
        sync(device)
        result = {"compile_s": time.perf_counter() - t0, "max_abs_diff": max_diff(out, expected)}
        if timed:
            progress(f"{label} run")
            result["median_s"] = median_seconds(compiled, inputs, reps, device)
        return result
    except Exception as e:  # one failing column must not lose the others
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


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
        if timed:
            progress("eager run")
            result["eager"] = {"median_s": median_seconds(model, inputs, reps, device)}
        result["minicompile"] = compile_and_time("minicompile", model, inputs, "minicompile", reps, device,
                                                 expected, timed)
        if inductor:
            result["inductor"] = compile_and_time("inductor", model, inputs, None, reps, device, expected, timed)
        if warm_in_process:  # --quick: the warm compile reuses this process (and its in-memory caches)
            for label, backend in [("minicompile", "minicompile")] + ([("inductor", None)] if inductor else []):
                warm = compile_and_time(label, model, inputs, backend, reps, device, expected, False)
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
