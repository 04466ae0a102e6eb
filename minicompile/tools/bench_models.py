"""``minicompile bench --models``: eager vs minicompile vs Inductor on the models of tools/models.py.

One process per model, each with fresh caches (tools/cold_compile.cold_env). Compile times
are each compiler's cold first call (Dynamo included), measured alone in a fresh process
whose every cache is empty (tools/cold_compile.py lists them): in the timing process the
second compiler would find Dynamo warm. Inside the timing process the three
callables take turns (``bench.time_interleaved``), inference under ``torch.no_grad()`` in
eval mode, so a noisy neighbour slows all three alike; the table gives medians and the
ratios minicompile / eager and minicompile / Inductor (below 1: minicompile is faster),
and their geometric means. ``--profile`` adds, per model, where minicompile's time goes:
its fused kernels, each library (extern) op, and the rest (the Python wrapper, guards).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minicompile.config import MODES
from minicompile.tools import cold_compile
from minicompile.tools.cold_compile import cold_env
from minicompile.tools.bench import _render, machine_info, time_interleaved
from minicompile.tools.bench_worker import max_diff
from minicompile.tools.models import MODELS

REPS = {"full": 31, "quick": 11, "tiny": 3}
COLUMNS = ("eager", "minicompile", "inductor")


# ---------------------------------------------------------------- one model, in its own process

def _compile(model, inputs, backend, mode=None):
    # no torch._dynamo.reset() between the two: Dynamo keeps one cache entry per backend
    compiled = torch.compile(model, backend=backend, mode=mode)
    t0 = time.perf_counter()
    out = compiled(*inputs)
    return compiled, out, time.perf_counter() - t0


def profile_minicompile(call, calls: int = 3) -> dict:
    """ms per call of minicompile's kernels (``cpp_*`` events), of each extern op, and the total."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    events = {e.key: e for e in prof.key_averages()}
    graph = sum(e.cpu_time_total for k, e in events.items() if k.startswith("minicompile_graph_"))
    kernels = {k: e.cpu_time_total for k, e in events.items() if k.startswith(("cpp_", "triton_", "kernel"))}
    externs = {k: e.cpu_time_total for k, e in events.items()
               if (k.startswith("aten.") or k.startswith("mkldnn.")) and "::" not in k}
    ms = 1e-3 / calls
    top = sorted(externs.items(), key=lambda kv: -kv[1])[:6]
    return {"graph_ms": graph * ms, "kernels_ms": sum(kernels.values()) * ms, "n_kernels": len(kernels),
            "externs_ms": sum(externs.values()) * ms, "top_externs": [(k, v * ms) for k, v in top]}


def run_model(name: str, size: str, reps: int, inductor: bool, profile: bool, batch: int | None = None,
              dtype: str | None = None, autocast: str | None = None, mode: str | None = None) -> dict:
    spec = MODELS[name]
    model, inputs = spec.build(size, batch, dtype, autocast)
    shape = spec.describe if size == "full" else f"{name} ({size})"
    result = {"model": name, "shape": shape + (f", batch {batch}" if batch else "") + (f", {dtype}" if dtype else "")
              + (f", autocast {autocast}" if autocast else "")}
    with torch.no_grad():
        model(*inputs)
        expected = model(*inputs)
        steps = {"eager": lambda: model(*inputs)}
        for col, backend in [("minicompile", "minicompile")] + ([("inductor", "inductor")] if inductor else []):
            try:
                compiled, out, secs = _compile(model, inputs, backend, mode)
            except Exception as e:  # one failing column must not lose the others
                result[col] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                continue
            result[col] = {"inprocess_compile_s": secs, "max_abs_diff": max_diff(out, expected)}
            steps[col] = (lambda c: lambda: c(*inputs))(compiled)
        for fn in steps.values():  # warm: the first timed call is not anyone's first
            fn()
        times = time_interleaved(list(steps.values()), reps)
        for col, samples in zip(steps, times):
            result.setdefault(col, {})["median_s"] = statistics.median(samples)
            result[col]["spread"] = (max(samples) - min(samples)) / statistics.median(samples)
        if profile and "median_s" in result["minicompile"]:
            result["profile"] = profile_minicompile(steps["minicompile"])
    return result


# ---------------------------------------------------------------- the parent

def run_worker(name, size, reps, inductor, profile, threads=None, batch=None, cold=True, dtype=None,
               autocast=None, mode=None) -> dict:
    """The model timed in one process, then (``cold``) each compiler's cold compile in a process of its own."""
    threads_env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    result = _timed_worker(name, size, reps, inductor, profile, threads_env, batch, dtype, autocast, mode)
    if "error" not in result and cold:
        for col in COLUMNS[1:] if inductor else COLUMNS[1:2]:
            if "error" not in result.get(col, {}):
                result[col].update(cold_compile.measure("models", name, size, col, batch=batch, dtype=dtype,
                                                        autocast=autocast, mode=mode, **threads_env))
    return result


def _timed_worker(name, size, reps, inductor, profile, threads_env, batch=None, dtype=None, autocast=None,
                  mode=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="minicompile-models-") as tmp:
        env = cold_env(tmp, **threads_env)
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "minicompile.tools.bench_models", "--worker", name, "--size", size,
               "--reps", str(reps), "--result", out] + ([] if inductor else ["--no-inductor"]) + \
              (["--profile"] if profile else []) + (["--batch", str(batch)] if batch else []) + \
              (["--dtype", dtype] if dtype else []) + (["--autocast", autocast] if autocast else []) + \
              (["--mode", mode] if mode else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-10:]
            return {"model": name, "error": f"worker exited with status {proc.returncode}: " + " | ".join(tail)}
        with open(out) as f:
            return json.load(f)


def _ms(r, col):
    c = r.get(col) or {}
    return f"{c['median_s'] * 1e3:.2f}" if "median_s" in c else ("error" if "error" in c else "-")


def _ratio(r, a, b):
    x, y = (r.get(a) or {}).get("median_s"), (r.get(b) or {}).get("median_s")
    return x / y if x and y else None


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def format_table(results: list, info: dict) -> str:
    rows = [["model", "shape", "eager ms", "minicompile ms", "inductor ms", "mc/eager", "mc/inductor",
             "compile s mc / ind", "mc compile / ind"]]
    for r in results:
        if "error" in r:
            rows.append([r["model"], "error: " + r["error"][:100]] + [""] * 7)
            continue
        mc, ind = r.get("minicompile", {}), r.get("inductor", {})
        comp = f"{_fmt(mc.get('compile_s'), '.1f')} / {_fmt(ind.get('compile_s'), '.1f')}"
        cratio = mc["compile_s"] / ind["compile_s"] if "compile_s" in mc and "compile_s" in ind else None
        rows.append([r["model"], r["shape"], _ms(r, "eager"), _ms(r, "minicompile"), _ms(r, "inductor"),
                     _fmt(_ratio(r, "minicompile", "eager")), _fmt(_ratio(r, "minicompile", "inductor")),
                     comp, _fmt(cratio)])
    ok = [r for r in results if "error" not in r]
    rows.append(["geomean", "", "", "", "", _fmt(_geomean([_ratio(r, "minicompile", "eager") for r in ok])),
                 _fmt(_geomean([_ratio(r, "minicompile", "inductor") for r in ok])), "", ""])
    lines = [f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads); "
             f"inference ({info.get('dtype', 'float32')}{', autocast ' + info['autocast'] if info.get('autocast') else ''}"
             f"{', mode ' + info['mode'] if info.get('mode') else ''}), no_grad, eval; "
             f"medians of {info['reps']} interleaved calls; compile = each compiler's "
             "first call alone in a fresh process, every cache empty",
             "", _render(rows)]
    errors = [f"{r['model']} {col}: {r[col]['error']}" for r in ok for col in COLUMNS[1:]
              if "error" in (r.get(col) or {})]
    lines += ["", "errors:", *("  " + e for e in errors)] if errors else []
    for r in ok:
        p = r.get("profile")
        if p:
            ext = ", ".join(f"{k} {v:.2f}" for k, v in p["top_externs"])
            lines.append(f"profile {r['model']}: graph {p['graph_ms']:.2f} ms = {p['n_kernels']} kernels "
                         f"{p['kernels_ms']:.2f} + externs {p['externs_ms']:.2f} ({ext}) + rest "
                         f"{p['graph_ms'] - p['kernels_ms'] - p['externs_ms']:.2f}")
    return "\n".join(lines) + "\n"


def format_row(r: dict) -> str:
    """One model's line while the run goes on (stderr), so a cut-short run still says something."""
    if "error" in r:
        return f"{r['model']}: {r['error']}"
    return (f"{r['model']}: eager {_ms(r, 'eager')} / minicompile {_ms(r, 'minicompile')} / inductor "
            f"{_ms(r, 'inductor')} ms; compile {_fmt((r.get('minicompile') or {}).get('compile_s'), '.1f')} / "
            f"{_fmt((r.get('inductor') or {}).get('compile_s'), '.1f')} s")


def available(name: str) -> bool:
    needs = MODELS[name].needs
    return needs is None or importlib.util.find_spec(needs) is not None


def run_models(names: list | None, size: str = "full", inductor: bool = True, profile: bool = False,
               json_path: str | None = None, stream=sys.stdout, threads: int | None = None,
               batch: int | None = None, cold: bool = True, dtype: str | None = None,
               autocast: str | None = None, mode: str | None = None, reps: int | None = None) -> int:
    names = names or [n for n in MODELS if available(n)]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"minicompile bench: unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}",
              file=sys.stderr)
        return 2
    reps = reps or REPS[size]
    results = []
    for n in names:
        print(f"@progress {n}", file=sys.stderr, flush=True)
        results.append(run_worker(n, size, reps, inductor, profile, threads, batch, cold, dtype, autocast, mode))
        print(format_row(results[-1]), file=sys.stderr, flush=True)
    info = dict(machine_info(), size=size, reps=reps, torch_threads=threads or torch.get_num_threads(), batch=batch,
                dtype=dtype or "float32", autocast=autocast, mode=mode)
    print(format_table(results, info), end="", file=stream)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=2)
    return 1 if any("error" in r for r in results) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", help="comma-separated subset (default: all whose dependencies import)")
    p.add_argument("--size", default="full", choices=sorted(REPS))
    p.add_argument("--reps", type=int)
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--profile", action="store_true", help="also show where minicompile's time goes")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the workers (default: torch's choice)")
    p.add_argument("--batch", type=int, help="the inputs' batch size (default: each model's own, 2 or 4)")
    p.add_argument("--no-cold-compile", action="store_true", help="no cold-compile processes")
    p.add_argument("--dtype", choices=["bf16", "fp16"], help="the models and their inputs in this dtype")
    p.add_argument("--autocast", choices=["bf16", "fp16"], help="each forward under CPU autocast")
    p.add_argument("--mode", choices=[m for m in MODES if m], help="torch.compile's mode, both compilers (default: none)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        result = run_model(args.worker, args.size, args.reps or REPS[args.size], not args.no_inductor, args.profile,
                           args.batch, args.dtype, args.autocast, args.mode)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    names = [n.strip() for n in args.models.split(",")] if args.models else None
    return run_models(names, args.size, not args.no_inductor, args.profile, args.json, threads=args.threads,
                      batch=args.batch, cold=not args.no_cold_compile, dtype=args.dtype, autocast=args.autocast,
                      mode=args.mode, reps=args.reps)


if __name__ == "__main__":
    sys.exit(main())
