"""``minicompile bench``: eager vs minicompile vs Inductor, side by side, one process per workload.

For each workload: fresh temporary cache directories (every cache either compiler reads,
tools/cold_compile.cold_env), a "cold" subprocess (compile from empty caches, minicompile
first, so it pays the process's first-compile costs, then medians of eager / minicompile /
Inductor), then a "warm" subprocess on the same caches (compile times only). --quick
measures the warm compile inside the cold process instead, to stay under 3 minutes.
Prints a table; --json and --plot write machine-readable results and a bar chart.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from minicompile.tools.cold_compile import cold_env
from minicompile.tools.workloads import WORKLOADS

REPS = {"full": 30, "quick": 7, "tiny": 3}
STEPS = {"cold": 6, "warm": 2}   # @progress lines a phase prints (an upper bound, Inductor included)


class ProgressBar:
    """A one-line bar on stderr, redrawn with \\r; silent when stderr is not a terminal."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.live = stream.isatty()
        self.start = time.perf_counter()

    def step(self, label: str) -> None:
        self.done = min(self.done + 1, self.total)
        width = 30
        filled = int(width * self.done / self.total)
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} " \
               f"{time.perf_counter() - self.start:5.0f}s {label}"
        if self.live:
            self.stream.write(line[:120].ljust(120))
            self.stream.flush()
        else:
            self.stream.write(line.lstrip("\r") + "\n")

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * 120 + "\r")


def machine_info() -> dict:
    model = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads()}


def time_interleaved(steps: list, reps: int, clock=time.perf_counter) -> list[list[float]]:
    """Seconds per call of each of ``steps``, ``reps`` calls each, taking turns in one process.
    Each repetition starts at another step: no step always follows the same one (the one
    before may leave its thread pool spinning on the cores). ``clock``: wall time, or
    ``time.process_time`` for single-threaded steps on a machine busy with other work."""
    times = [[] for _ in steps]
    for k in range(reps):
        for i in [*range(k % len(steps), len(steps)), *range(k % len(steps))]:
            t0 = clock()
            steps[i]()
            times[i].append(clock() - t0)
    return times


def run_worker(workload, size, phase, reps, device, inductor, warm_in_process, env, bar) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, "-m", "minicompile.tools.bench_worker", "--workload", workload, "--size", size,
           "--phase", phase, "--reps", str(reps), "--device", device, "--result", result_path]
    cmd += [] if inductor else ["--no-inductor"]
    cmd += ["--warm-in-process"] if warm_in_process else []
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in proc.stdout:
        if line.startswith("@progress "):
            bar.step(f"{workload} ({phase}): {line[10:].strip()}")
        else:
            log.append(line)
    proc.wait()
    try:
        if proc.returncode != 0:
            tail = "".join(log[-15:])
            return {"workload": workload, "error": f"worker exited with status {proc.returncode}:\n{tail}"}
        with open(result_path) as f:
            return json.load(f)
    finally:
        os.unlink(result_path)


def bench_workload(name, size, reps, device, inductor, quick, bar) -> dict:
    with tempfile.TemporaryDirectory(prefix="minicompile-bench-") as tmp:
        env = cold_env(tmp)
        cold = run_worker(name, size, "cold", reps, device, inductor, quick, env, bar)
        if "error" in cold or quick:
            return cold
        warm = run_worker(name, size, "warm", reps, device, inductor, False, env, bar)
        for col in ("minicompile", "inductor"):
            if col in cold and col in warm:
                cold[col]["warm_compile_s"] = warm[col].get("compile_s")
        return cold


# ---------------------------------------------------------------- the table

def _ms(col: dict | None) -> str:
    if not col:
        return "-"
    if "error" in col:
        return "error"
    return f"{col['median_s'] * 1e3:.3f}" if "median_s" in col else "-"


def _speedup(r: dict, col: str) -> str:
    c, e = r.get(col), r.get("eager")
    if not c or "median_s" not in c or not e:
        return "-"
    return f"{e['median_s'] / c['median_s']:.2f}x"


def _compile(col: dict | None) -> str:
    if not col or "compile_s" not in col:
        return "-"
    warm = col.get("warm_compile_s")
    return f"{col['compile_s']:.1f} / {warm:.1f}" if warm is not None else f"{col['compile_s']:.1f} / -"


# A row is flagged rather than trusted when its samples spread too widely or a ratio cannot be.
WIDE_SPREAD = 0.10           # interquartile range above 10% of the median
PLAUSIBLE_SPEEDUP = (0.05, 50.0)


def row_flags(r: dict) -> list[str]:
    """Why this row's numbers should not be trusted (empty: nothing found)."""
    flags = []
    for col in ("eager", "minicompile", "inductor"):
        c = r.get(col) or {}
        if c.get("spread", 0.0) > WIDE_SPREAD:
            flags.append(f"{col} samples spread {100 * c['spread']:.0f}% of the median")
        e = r.get("eager") or {}
        if col != "eager" and "median_s" in c and "median_s" in e:
            ratio = e["median_s"] / c["median_s"]
            if not PLAUSIBLE_SPEEDUP[0] <= ratio <= PLAUSIBLE_SPEEDUP[1]:
                flags.append(f"{col} at {ratio:.2f}x eager is implausible")
        if "min_bytes" in r and "median_s" in c and r["min_bytes"] / c["median_s"] > r["copy_bytes_per_s"]:
            flags.append(f"{col} above copy bandwidth (impossible: the copy was measured on a busier machine)")
    return flags


def load_note(before: float, after: float, cores: int) -> str:
    """The machine's load around the run, and a warning when other work shared its cores."""
    note = f"load average {before:.1f} before, {after:.1f} after, on {cores} cores"
    if before > 0.5 * cores:
        note += (f"\nWARNING: the machine was busy before the run (load {before:.1f} on {cores} cores): "
                 "other work shared the cores, so times and ratios are unreliable; rerun on a quiet machine")
    return note


def _gbs(r: dict, col: str) -> str:
    c = r.get(col)
    if "min_bytes" not in r or not c or "median_s" not in c:
        return "-"
    rate = r["min_bytes"] / c["median_s"]
    return f"{rate / 1e9:.1f} ({100 * rate / r['copy_bytes_per_s']:.0f}%)"


def format_table(results: list, info: dict) -> str:
    rows = [["workload", "shape", "eager ms", "minicompile ms", "inductor ms", "mc speedup", "ind speedup",
             "mc compile s cold/warm", "ind compile s cold/warm", "flag"]]
    notes = []
    for r in results:
        if "error" in r and "eager" not in r:
            rows.append([r["workload"], "error: " + r["error"].splitlines()[0]] + [""] * 8)
            continue
        flags = row_flags(r)
        notes += [f"  {r['workload']}: {f}" for f in flags]
        rows.append([r["workload"], r["shape"], _ms(r.get("eager")), _ms(r.get("minicompile")),
                     _ms(r.get("inductor")), _speedup(r, "minicompile"), _speedup(r, "inductor"),
                     _compile(r.get("minicompile")), _compile(r.get("inductor")), "!" if flags else ""])
    out = [_render(rows)]
    if notes:
        out.append("! not to be trusted as measured:\n" + "\n".join(notes))
    bw = [["memory-bound", "bytes moved", "copy GB/s", "eager GB/s (% copy)", "minicompile GB/s", "inductor GB/s"]]
    for r in results:
        if "min_bytes" in r:
            bw.append([r["workload"], f"{r['min_bytes'] / 1e6:.1f} MB", f"{r['copy_bytes_per_s'] / 1e9:.1f}",
                       _gbs(r, "eager"), _gbs(r, "minicompile"), _gbs(r, "inductor")])
    if len(bw) > 1:
        out.append(_render(bw))
    errors = [f"{r['workload']} {col}: {r[col]['error']}" for r in results for col in ("minicompile", "inductor")
              if isinstance(r.get(col), dict) and "error" in r[col]]
    out += [f"errors:\n  " + "\n  ".join(errors)] if errors else []
    header = (f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), "
              f"size {info['size']}; medians of {info['reps']} samples taken in turns")
    if "load" in info:
        header += "\n" + load_note(*info["load"], info["cores"])
    return header + "\n\n" + "\n\n".join(out) + "\n"


def _render(rows: list) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def write_plot(results: list, path: str) -> str | None:
    """Bar chart of speedups over eager; returns an error message instead when it cannot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    names = [r["workload"] for r in results if "eager" in r]
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, col in enumerate(["minicompile", "inductor"]):
        vals = [(r["eager"]["median_s"] / r[col]["median_s"]) if "median_s" in r.get(col, {}) else 0
                for r in results if "eager" in r]
        ax.bar([i + 0.4 * k for i in range(len(names))], vals, width=0.4, label=col)
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.set_xticks([i + 0.2 for i in range(len(names))], names)
    ax.set_ylabel("speedup over eager (x)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return None


def run_bench(args) -> int:
    if args.device == "cuda" and not torch.cuda.is_available():
        print("minicompile bench: --device cuda, but torch sees no CUDA device here; run on a GPU machine "
              "or use --device cpu", file=sys.stderr)
        return 2
    size = args.size or ("quick" if args.quick else "full")
    names = [w.strip() for w in args.workloads.split(",")] if args.workloads else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"minicompile bench: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}",
              file=sys.stderr)
        return 2
    quick = size != "full"
    reps = REPS[size]
    bar = ProgressBar(len(names) * (STEPS["cold"] + STEPS["warm"]))
    load_before = os.getloadavg()[0]
    results = [bench_workload(n, size, reps, args.device, not args.no_inductor, quick, bar) for n in names]
    bar.finish()
    info = dict(machine_info(), size=size, reps=reps, device=args.device, load=(load_before, os.getloadavg()[0]))
    print(format_table(results, info), end="")
    status = 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=2)
    if args.plot:
        problem = write_plot(results, args.plot)
        if problem:
            print(f"minicompile bench: {problem}", file=sys.stderr)
            status = 1
    return status
