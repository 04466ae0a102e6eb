"""``minicompile bench --train --models``: training steps of real models (tools/train_models.py),
eager, minicompile and Inductor side by side in one process.

A step is ``loss = model(*inputs); loss.backward()`` with the model's own loss (HF: its LM loss;
vision: cross-entropy), no optimizer, gradients set to None between steps outside the timed
region; BatchNorm in train mode. Three copies of each model start from the same weights. As in
``bench --train`` (tools/bench_train.py, whose helpers this uses): every repetition times one
step of each column in turn, starting at another column each time; "saved" is what autograd
packs for backward in one step; compile time is each compiler's first step measured cold, alone
in a fresh process with every cache empty (tools/cold_compile.py), compile errors raising; the
last column compares every parameter's gradient with eager's after the timed steps.

``--autocast bf16`` (or fp16) runs every column's forward under ``torch.autocast("cpu", dtype)``
(the backward outside it, as PyTorch recommends). Whether minicompile's step is its own is read
from what its backend returned for each graph Dynamo handed it: a compiled graph, or the
captured graph's own forward (a training graph that runs eagerly logs why). The "mc graphs"
column counts them; a model with any graph run eagerly is marked "(eager graphs)" and left out
of the geometric mean, as its time is not minicompile's.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
import traceback

import torch

from minicompile.backend import minicompile_backend
from minicompile.tools import cold_compile
from minicompile.tools.bench import _render, machine_info
from minicompile.tools.bench_train import REPS, _cold, _cold_ratio, timed
from minicompile.tools.train_models import TRAIN_MODELS

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Recorder:
    """The minicompile backend, keeping what it returned for each graph."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(minicompile_backend(gm, example_inputs))
        return self.graphs[-1]

    def compiled(self) -> int:
        """Graphs that run minicompile's code (not the captured GraphModule's own forward)."""
        return sum(not isinstance(getattr(g, "__self__", None), torch.fx.GraphModule) for g in self.graphs)


def autocast_ctx(autocast: str | None):
    return torch.autocast("cpu", dtype=AUTOCAST[autocast]) if autocast else contextlib.nullcontext()


def make_step(fn, model, inputs, autocast):
    def step(backward=True):
        for p in model.parameters():
            p.grad = None
        with autocast_ctx(autocast):
            loss = fn(*inputs)
        if backward:
            loss.backward()
    return step


def setup(name: str, size: str, columns: tuple, autocast: str | None, recorder: Recorder) -> dict:
    model, inputs = TRAIN_MODELS[name].build(size)
    wrap = {"eager": lambda m: m, "minicompile": lambda m: torch.compile(m, backend=recorder),
            "inductor": torch.compile}
    result = {}
    for col in columns:
        m = copy.deepcopy(model)
        step = make_step(wrap[col](m), m, inputs, autocast)
        t0 = time.perf_counter()
        step()   # compiles the forward, then the backward
        result[col] = dict(model=m, inputs=inputs, step=step, inprocess_compile_s=time.perf_counter() - t0)
    return result


def run(name: str, size: str, reps: int, columns: tuple, autocast: str | None = None, cold_compiles=True) -> dict:
    """One model: compile, count saved bytes, time interleaved, compare gradients, compile cold."""
    torch._dynamo.reset()
    recorder = Recorder()
    cols, eager_graphs = timed(lambda: setup(name, size, columns, autocast, recorder), reps)
    ref = [p.grad for p in cols["eager"]["model"].parameters()]
    for c in cols.values():
        diffs = [(g - r).abs().max().item() for g, r in zip((p.grad for p in c["model"].parameters()), ref)
                 if g is not None and r is not None]
        c["max_diff"] = max(diffs, default=0.0)
    cold = {}
    for col in columns[1:] if cold_compiles else ():
        cold[col] = cold_compile.measure("train_models", name, size, col, autocast=autocast, MINICOMPILE_FALLBACK="0")
        shown = f"{cold[col]['compile_s']:.1f} s" if "compile_s" in cold[col] else cold[col]["error"]
        print(f"  {name} {col}: cold compile {shown}", file=sys.stderr, flush=True)
    graphs = dict(total=len(recorder.graphs), compiled=recorder.compiled())
    return {"workload": name, "eager_graphs": eager_graphs.reasons, "mc_graphs": graphs,
            **{col: {**{k: c[k] for k in ("median_s", "inprocess_compile_s", "saved", "max_diff")}, **cold.get(col, {})}
               for col, c in cols.items()}}


def _all_compiled(r: dict) -> bool:
    return not r["eager_graphs"] and r["mc_graphs"]["compiled"] == r["mc_graphs"]["total"]


def _geomean(values: list) -> str:
    return f"{math.exp(sum(map(math.log, values)) / len(values)):.2f}" if values else "-"


def _row(r: dict, cols: tuple, ind: bool) -> list:
    if "error" in r:
        return [r["workload"] + " (error)"] + ["-"] * (10 if ind else 7)
    ms = {k: r[k]["median_s"] * 1e3 for k in cols}
    name = r["workload"] + ("" if _all_compiled(r) else " (eager graphs)")
    return ([name, f"{ms['eager']:.2f}", f"{ms['minicompile']:.2f}"] +
            ([f"{ms['inductor']:.2f}", f"{ms['inductor'] / ms['minicompile']:.2f}x"] if ind else []) +
            [f"{ms['eager'] / ms['minicompile']:.2f}x", "{compiled}/{total}".format(**r["mc_graphs"]),
             " / ".join(_cold(r[k]) for k in cols[1:])] + ([_cold_ratio(r)] if ind else []) +
            [" / ".join(f"{r[k]['saved'] / 1024:.0f}" for k in cols),
             " / ".join(f"{r[k]['max_diff']:.1e}" for k in cols[1:])])


def format_table(results: list, info: dict) -> str:
    ind = "inductor" in next((r for r in results if "error" not in r), {"inductor": 1})
    per_col = " / ind" if ind else ""
    cols = ("eager", "minicompile", "inductor") if ind else ("eager", "minicompile")
    rows = [["model", "eager ms", "minicompile ms"] + (["inductor ms", "mc / ind"] if ind else []) +
            ["mc / eager", "mc graphs", "cold compile s mc" + per_col] + (["compile mc / ind"] if ind else []) +
            ["saved KiB eager / mc" + per_col, "max |grad diff| mc" + per_col]]
    rows += [_row(r, cols, ind) for r in results]
    kept = [r for r in results if "error" not in r and _all_compiled(r)]
    if kept:
        speed = [r["eager"]["median_s"] / r["minicompile"]["median_s"] for r in kept]
        vs_ind = [r["inductor"]["median_s"] / r["minicompile"]["median_s"] for r in kept] if ind else []
        compile_ratio = [r["minicompile"]["compile_s"] / r["inductor"]["compile_s"] for r in kept
                         if ind and "compile_s" in r["minicompile"] and "compile_s" in r["inductor"]]
        rows.append([f"geomean ({len(kept)} of {len(results)})", "", ""] + (["", _geomean(vs_ind) + "x"] if ind else []) +
                    [_geomean(speed) + "x", "", ""] + ([_geomean(compile_ratio)] if ind else []) + ["", ""])
    dtype = f"autocast {info['autocast']} forward" if info.get("autocast") else "float32"
    lines = [f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads); "
             f"{dtype}, forward + loss.backward() per step, medians of {info['reps']} interleaved steps"
             + ("; mc / ind > 1: minicompile faster" if ind else "")
             + "; cold compile: the first step alone in a fresh process, every cache empty; "
               "mc graphs: graphs minicompile compiled / graphs Dynamo handed it"]
    lines += [f"  {r['workload']}: {TRAIN_MODELS[r['workload']].describe(info['size'])}" for r in results]
    lines += ["", _render(rows)]
    lines += [f"{r['workload']}: {r['error']}" for r in results if "error" in r]
    lines += [f"{r['workload']} {k} cold compile: {r[k]['error']}" for r in results if "error" not in r
              for k in cols[1:] if "error" in r[k]]
    lines += [f"{r['workload']}: minicompile ran {r['mc_graphs']['total'] - r['mc_graphs']['compiled']} of "
              f"{r['mc_graphs']['total']} graph(s) eagerly (its time is eager's there): "
              + "; ".join(sorted(set(r["eager_graphs"])) or ["no reason logged"])
              for r in results if "error" not in r and not _all_compiled(r)]
    return "\n".join(lines) + "\n"


def run_train_models_bench(names: list | None, size: str, reps: int, inductor: bool = True,
                           json_path: str | None = None, autocast: str | None = None, cold: bool = True) -> int:
    """``names``: a subset of TRAIN_MODELS (None: all); ``cold=False``: no cold-compile processes."""
    unknown = [n for n in names or [] if n not in TRAIN_MODELS]
    if unknown:
        print(f"minicompile bench --train --models: unknown model(s) {', '.join(unknown)}; "
              f"choose from {', '.join(TRAIN_MODELS)}", file=sys.stderr)
        return 2
    if autocast is not None and autocast not in AUTOCAST:
        print(f"minicompile bench: --autocast takes {' or '.join(AUTOCAST)}", file=sys.stderr)
        return 2
    chosen = names or list(TRAIN_MODELS)
    missing = [n for n in chosen if not TRAIN_MODELS[n].available()]
    for n in missing:
        print(f"  {n}: skipped ({TRAIN_MODELS[n].needs} is not installed)", file=sys.stderr)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    columns = ("eager", "minicompile") + (("inductor",) if inductor else ())
    results = []
    for name in (n for n in chosen if n not in missing):
        try:
            results.append(run(name, size, reps, columns, autocast, cold))
        except Exception as e:   # one model's failure is a row of the table, not the end of the run
            traceback.print_exc()
            results.append({"workload": name, "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"})
    info = dict(machine_info(), size=size, reps=reps, autocast=autocast)
    print(format_table(results, info), end="")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=2)
    return 0 if results and all("error" not in r for r in results) else 1
