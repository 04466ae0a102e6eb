"""``minicompile bench --train`` and benchmarks/bench_train.py: training steps of eager, minicompile
and Inductor, side by side in one process.

A step is one forward and one backward (``out.backward(grad_out)`` with a fixed random
``grad_out``; no optimizer; gradients set to None between steps, outside the timed region).
Three copies of each model start from the same weights: one runs eagerly, one through
``torch.compile(model, backend="minicompile")``, one through ``torch.compile(model)``
(Inductor). Compile time is each compiler's first step (forward and backward graphs both
compile then) measured cold: alone in a fresh process whose every cache is empty
(tools/cold_compile.py says which caches that takes), with no eager fallback for compile
errors. The timed columns compile again in this process (their compile time is kept in the
JSON as ``inprocess_compile_s``; it is warm for all but the first workload). Every repetition times one step of each column in turn,
starting at another column each time (tools/bench.time_interleaved). After the timed steps,
each compiled column's gradients are compared with eager's.

"saved" is what autograd keeps for backward in one step, counted with
``torch.autograd.graph.saved_tensors_hooks`` (it sees eager's saved tensors and both
compilers' autograd Functions alike): numel * itemsize of every packed tensor, each storage
once, leaving out the storages the caller holds anyway (the model's parameters and buffers and
the step's inputs): the memory that saving for backward adds. (Under autocast eager saves
bfloat16 copies of the weights, which count, and a compiled graph may save the float32
parameters themselves, which do not.)

A training graph minicompile cannot compile yet runs eagerly (the log says why); the table
then marks the row with "eager graphs" and the reasons, as its times are not minicompile's.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import statistics
import sys
import tempfile
import time

import torch

from minicompile.config import patch
from minicompile.tools import cold_compile
from minicompile.tools.bench import _render, machine_info, time_interleaved
from minicompile.tools.workloads import TRAIN_WORKLOADS, build_train

REPS = {"full": 30, "quick": 10, "tiny": 3}
COMPILERS = {   # column: how its model is wrapped
    "eager": lambda m: m,
    "minicompile": lambda m: torch.compile(m, backend="minicompile"),
    "inductor": torch.compile,
}


class EagerGraphs(logging.Handler):
    """Collects minicompile's "training graph runs eagerly: <reason>" warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons = []

    def emit(self, record):
        message = record.getMessage()
        if "runs eagerly" in message:
            self.reasons.append(message.split("runs eagerly", 1)[1].lstrip(": ;"))


@contextlib.contextmanager
def fresh_caches():
    """Empty kernel caches for both compilers, and compile errors raised instead of run eagerly."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="minicompile-bench-train-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        try:
            with patch(cache_dir=os.path.join(tmp, "minicompile"), fallback_on_error=False):
                yield
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def saved_bytes(step, held=()) -> int:
    """Bytes autograd packs for backward during ``step()``, each storage counted once, those of the
    tensors in ``held`` (what the caller keeps anyway) left out."""
    storages: dict = {}
    kept = {t.untyped_storage().data_ptr() for t in held}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in kept:
            storages[key] = max(storages.get(key, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(backward=False)
    return sum(storages.values())


def make_step(fn, model, x, grad_out):
    def step(backward=True):
        for p in model.parameters():
            p.grad = None
        x.grad = None
        out = fn(x)
        if backward:
            out.backward(grad_out)
    return step


def setup(name: str, size: str, columns: tuple) -> dict:
    model, shape = build_train(name, size)
    torch.manual_seed(0)
    x = torch.randn(shape)
    with torch.no_grad():
        grad_out = torch.randn_like(copy.deepcopy(model)(x))
    result = {}
    for col in columns:
        m = copy.deepcopy(model)
        xc = x.clone().requires_grad_(True)
        step = make_step(COMPILERS[col](m), m, xc, grad_out)
        t0 = time.perf_counter()
        step()   # compiles the forward, then the backward
        result[col] = dict(model=m, x=xc, inputs=[xc], step=step, inprocess_compile_s=time.perf_counter() - t0)
    return result


def cold_compiles(name: str, size: str, columns: tuple) -> dict:
    """Each compiler's cold compile of ``name``, each in its own fresh process (tools/cold_compile.py)."""
    cold = {}
    for col in columns[1:]:
        cold[col] = cold_compile.measure("train", name, size, col, MINICOMPILE_FALLBACK="0")
        shown = f"{cold[col]['compile_s']:.1f} s" if "compile_s" in cold[col] else cold[col]["error"]
        print(f"  {name} {col}: cold compile {shown}", file=sys.stderr, flush=True)
    return cold


def timed(make_columns, reps: int) -> tuple[dict, EagerGraphs]:
    """The columns ``make_columns()`` builds (with empty caches), each with its saved bytes and its
    median step time over ``reps`` interleaved steps after a warm-up; and the reasons any graph ran
    eagerly meanwhile."""
    eager_graphs = EagerGraphs()
    logging.getLogger("minicompile").addHandler(eager_graphs)
    try:
        with fresh_caches():
            cols = make_columns()
            for c in cols.values():
                held = [*c["model"].parameters(), *c["model"].buffers(), *c["inputs"]]
                c["saved"] = saved_bytes(c["step"], held)
                c["step"]()   # warm-up
            order = list(cols.values())
            for c, times in zip(order, time_interleaved([c["step"] for c in order], reps)):
                c["median_s"] = statistics.median(times)
    finally:
        logging.getLogger("minicompile").removeHandler(eager_graphs)
    return cols, eager_graphs


def run(name: str, size: str, reps: int, columns: tuple, cold: bool = True) -> dict:
    """One workload: compile (cold), count saved bytes, time interleaved, compare gradients."""
    torch._dynamo.reset()
    cols, eager_graphs = timed(lambda: setup(name, size, columns), reps)
    ref = cols["eager"]
    ref_grads = [ref["x"].grad] + [p.grad for p in ref["model"].parameters()]
    for c in cols.values():
        grads = [c["x"].grad] + [p.grad for p in c["model"].parameters()]
        c["max_diff"] = max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))
    cold = cold_compiles(name, size, columns) if cold else {}
    return {"workload": name, "eager_graphs": eager_graphs.reasons,
            **{col: {**{k: c[k] for k in ("median_s", "inprocess_compile_s", "saved", "max_diff")}, **cold.get(col, {})}
               for col, c in cols.items()}}


def format_table(results: list, info: dict) -> str:
    ind = "inductor" in results[0]
    per_col = " / ind" if ind else ""
    rows = [["model", "eager ms", "minicompile ms"] + (["inductor ms", "mc / ind"] if ind else []) +
            ["mc / eager", "cold compile s mc" + per_col] + (["compile mc / ind"] if ind else []) +
            ["saved KiB eager / mc" + per_col, "max |grad diff| mc" + per_col]]
    cols = ("eager", "minicompile", "inductor") if ind else ("eager", "minicompile")
    for r in results:
        ms = {k: r[k]["median_s"] * 1e3 for k in cols}
        name = r["workload"] + (" (eager graphs)" if r["eager_graphs"] else "")
        rows.append([name, f"{ms['eager']:.2f}", f"{ms['minicompile']:.2f}"] +
                    ([f"{ms['inductor']:.2f}", f"{ms['inductor'] / ms['minicompile']:.2f}x"] if ind else []) +
                    [f"{ms['eager'] / ms['minicompile']:.2f}x",
                     " / ".join(_cold(r[k]) for k in cols[1:])] + ([_cold_ratio(r)] if ind else []) +
                    [" / ".join(f"{r[k]['saved'] / 1024:.0f}" for k in cols),
                     " / ".join(f"{r[k]['max_diff']:.1e}" for k in cols[1:])])
    lines = [f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads); "
             f"float32, forward + backward per step, medians of {info['reps']} interleaved steps"
             + ("; mc / ind > 1: minicompile faster" if ind else "")
             + "; cold compile: the first step alone in a fresh process, every cache empty"]
    lines += [f"  {r['workload']}: {TRAIN_WORKLOADS[r['workload']].describe(TRAIN_WORKLOADS[r['workload']].sizes[info['size']])}"
              for r in results]
    lines += ["", _render(rows)]
    lines += [f"{r['workload']} {k} cold compile: {r[k]['error']}" for r in results for k in cols[1:]
              if "error" in r[k]]
    lines += [f"{r['workload']}: minicompile ran {len(r['eager_graphs'])} graph(s) eagerly: "
              + "; ".join(sorted(set(r["eager_graphs"]))) for r in results if r["eager_graphs"]]
    return "\n".join(lines) + "\n"


def _cold(col: dict) -> str:
    return f"{col['compile_s']:.1f}" if "compile_s" in col else "error" if "error" in col else "-"


def _cold_ratio(r: dict) -> str:
    mc, ind = r["minicompile"].get("compile_s"), r["inductor"].get("compile_s")
    return f"{mc / ind:.2f}" if mc and ind else "-"


def run_train_bench(names: list, size: str, reps: int, inductor: bool = True, json_path: str | None = None,
                    cold: bool = True) -> int:
    """``cold=False``: no cold-compile processes (the column shows "-")."""
    unknown = [n for n in names if n not in TRAIN_WORKLOADS]
    if unknown:
        print(f"minicompile bench --train: unknown workload(s) {', '.join(unknown)}; "
              f"choose from {', '.join(TRAIN_WORKLOADS)}", file=sys.stderr)
        return 2
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    columns = tuple(c for c in COMPILERS if inductor or c != "inductor")
    results = [run(n, size, reps, columns, cold) for n in names]
    info = dict(machine_info(), size=size, reps=reps)
    print(format_table(results, info), end="")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=2)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, help="timed steps per column (default: 30, --quick 10)")
    parser.add_argument("--models", default=",".join(TRAIN_WORKLOADS), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer steps")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else "full"
    return run_train_bench(args.models.split(","), size, args.reps or REPS[size], not args.no_inductor, args.json)


if __name__ == "__main__":
    sys.exit(main())
