"""The OpInfo sweep: every PyTorch OpInfo with float32 CPU samples, compiled and compared with eager.

For each OpInfo the first few float32 CPU samples are batched into one function (inputs: the
samples' tensors; output: each sample's result), traced to an ATen graph with ``make_fx`` in
fake mode and compiled with ``minicompile.pipeline.compile_graph`` directly. Going around
Dynamo is deliberate: a Dynamo graph break is not a minicompile bug, and the question here is
whether a graph containing the op compiles right. A function that cannot be traced to one
static graph (data-dependent output shapes, ``.item()``) is recorded as untraceable.

Each op ends in one status:

    native       every ATen node became loop IR; results match eager
    partial      some nodes ran as extern ATen calls (reasons recorded); results match
    extern       every node ran as an extern call; results match
    mismatch     compiled results differ from eager (a bug: fix it)
    crash        compiling or running raised (a bug: fix it)
    untraceable  make_fx cannot trace the sample to one static graph (not a compiler question)
    eager-error  eager itself raises on the sample
    no-samples   no float32 CPU sample inputs

Random ops (eager gives different values under different seeds) are compared on dtype,
shape and strides only.

The full sweep, writing docs/opinfo-report.md (two worker processes, crash-isolated)::

    python -m minicompile.testing.opinfo_sweep --jobs 2 --report docs/opinfo-report.md

Some ops only: ``--ops add,sum,softmax``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import islice

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from minicompile.config import config
from minicompile.pipeline import compile_graph
from minicompile.testing.compare import copy_preserving_strides, mismatch

MAX_SAMPLES = 4          # samples batched into one graph per op
MAX_SAMPLE_NUMEL = 1 << 16  # skip giant samples: they test nothing more and slow the sweep
OP_TIMEOUT_S = 240       # a worker making no progress for this long is killed; the op is a crash
BAD = ("mismatch", "crash")
MODULE = "minicompile.testing.opinfo_sweep"   # what workers run (__name__ is __main__ under -m)


@dataclass
class OpResult:
    op: str
    status: str
    samples: int = 0
    kernels: int = 0
    externs: list = field(default_factory=list)   # "op: reason", deduplicated
    detail: str = ""                               # the error or mismatch, or why untraceable
    random: bool = False
    seconds: float = 0.0


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def float32_ops():
    """The OpInfos with float32 CPU support, keyed by name[.variant]."""
    from torch.testing._internal.common_methods_invocations import op_db
    return {op_key(op): op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}


def _samples(op):
    out = []
    for s in islice(op.sample_inputs("cpu", torch.float32, requires_grad=False), 4 * MAX_SAMPLES):
        leaves = [x for x in pytree.tree_leaves((s.input, s.args, s.kwargs)) if isinstance(x, torch.Tensor)]
        if sum(x.numel() for x in leaves) <= MAX_SAMPLE_NUMEL:
            out.append(s)
        if len(out) == MAX_SAMPLES:
            break
    return out


def build_function(op, samples):
    """fn(*tensors) -> tuple of each sample's output, and the tensors it takes."""
    specs, inputs = [], []
    for s in samples:
        leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
        slots = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                slots.append(("tensor", len(inputs)))
                inputs.append(leaf)
            else:
                slots.append(("const", leaf))
        specs.append((slots, spec))

    def fn(*tensors):
        outs = []
        for slots, spec in specs:
            leaves = [tensors[v] if kind == "tensor" else v for kind, v in slots]
            x, args, kwargs = pytree.tree_unflatten(leaves, spec)
            outs.append(op.op(x, *args, **kwargs))
        return tuple(outs)
    return fn, inputs


def _fresh(inputs):
    return [copy_preserving_strides(x) for x in inputs]


def _run_eager(fn, inputs, seed):
    torch.manual_seed(seed)
    return fn(*_fresh(inputs))


def _is_random(fn, inputs, expected) -> bool:
    again = _run_eager(fn, inputs, 1)
    return mismatch(expected, again) is not None


# Their values are whatever the memory held: two eager runs may agree by chance, so the
# check above cannot be trusted to catch them.
UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


def _uninitialized(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.name.split("::")[-1] in UNINITIALIZED


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def _data_dependent(gm):
    for node in gm.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape)):
                return f"{node.target}"
    return None


def _externs(compiled) -> list:
    seen = []
    for rec in compiled.externs:
        line = f"{rec.op}: {rec.reason}"
        if line not in seen:
            seen.append(line)
    return seen


def sweep_op(op, samples=None) -> OpResult:
    """Compile ``op`` on its float32 CPU samples and compare with eager."""
    t0 = time.perf_counter()
    key = op_key(op)
    try:
        samples = _samples(op) if samples is None else samples
    except Exception as e:  # noqa: BLE001 - an OpInfo's own sample generator failing
        return OpResult(key, "eager-error", detail=f"sample_inputs raised {_short(e)}")
    if not samples:
        return OpResult(key, "no-samples")
    result = _sweep_samples(op, key, samples)
    if result.status in BAD and len(samples) > 1:
        # name the first sample that fails on its own, for the report
        for k, s in enumerate(samples):
            single = _sweep_samples(op, key, [s])
            if single.status in BAD:
                result.detail = f"sample {k} ({_describe(s)}): {single.detail}"
                break
    result.seconds = time.perf_counter() - t0
    return result


def _describe(sample) -> str:
    def show(x):
        if isinstance(x, torch.Tensor):
            dense = "" if x.is_contiguous() else f" strides {x.stride()}"
            return f"T{list(x.shape)}{dense}"
        return repr(x)
    args = [show(sample.input)] + [show(a) for a in pytree.tree_map(lambda v: v, sample.args)]
    kwargs = [f"{k}={show(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(args + kwargs)[:200]


def _sweep_samples(op, key, samples) -> OpResult:
    fn, inputs = build_function(op, samples)
    res = OpResult(key, "crash", samples=len(samples))
    try:
        expected = _run_eager(fn, inputs, 0)
        res.random = _is_random(fn, inputs, expected)
    except Exception as e:  # noqa: BLE001
        res.status, res.detail = "eager-error", _short(e)
        return res
    try:
        gm = make_fx(fn, tracing_mode="fake")(*_fresh(inputs))
    except Exception as e:  # noqa: BLE001
        res.status, res.detail = "untraceable", _short(e)
        return res
    # OpInfos wrap random ops in a fixed seed, which tracing does not capture: find them by tag
    res.random = res.random or any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                                   or _uninitialized(n.target) for n in gm.graph.nodes if n.op == "call_function")
    unbacked = _data_dependent(gm)
    if unbacked:
        res.status = "untraceable"
        res.detail = f"{unbacked} has a data-dependent shape (Dynamo graph-breaks there; not one static graph)"
        return res
    try:
        args = _fresh(inputs)
        compiled = compile_graph(gm, args)
        res.kernels, res.externs = compiled.num_kernels, _externs(compiled)
        torch.manual_seed(0)
        actual = compiled(*args)
    except Exception as e:  # noqa: BLE001
        res.detail = _short(e) + " | " + traceback.format_exc().strip().splitlines()[-3].strip()
        return res
    diff = mismatch(expected, actual, values=not res.random)
    if diff:
        res.status, res.detail = "mismatch", diff
    elif not res.externs:
        res.status = "native"
    elif res.kernels == 0:
        res.status = "extern"
    else:
        res.status = "partial"
    return res


# -- running the sweep in crash-isolated worker processes --------------------------------------

def worker(keys: list, out_path: str, ops: dict, sweep_one) -> None:
    """Sweep ``keys`` with ``sweep_one(op) -> OpResult``, one JSON line per op start and result."""
    with open(out_path, "a") as out:
        for key in keys:
            out.write(json.dumps({"start": key}) + "\n")
            out.flush()
            out.write(json.dumps(asdict(sweep_one(ops[key]))) + "\n")
            out.flush()


def _read_results(path: str):
    done, started = {}, None
    if not os.path.exists(path):
        return done, started
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in rec:
                started = rec["start"]
            else:
                done[rec["op"]] = OpResult(**rec)
                started = None
    return done, started


def run_sweep(keys: list, jobs: int, workdir: str, module: str = MODULE) -> dict:
    """Sweep ``keys`` in ``jobs`` worker processes (``python -m module --worker``); a worker that
    dies is restarted after its op."""
    os.makedirs(workdir, exist_ok=True)
    shards = [keys[k::jobs] for k in range(jobs)]
    results = {}
    procs = {}

    def launch(j, remaining):
        path = os.path.join(workdir, f"shard{j}.jsonl")
        args_path = os.path.join(workdir, f"shard{j}.keys.json")
        with open(args_path, "w") as f:
            json.dump(remaining, f)
        cmd = [sys.executable, "-m", module, "--worker", args_path, "--out", path]
        procs[j] = (subprocess.Popen(cmd), remaining, path, time.monotonic())

    for j, shard in enumerate(shards):
        open(os.path.join(workdir, f"shard{j}.jsonl"), "w").close()
        if shard:
            launch(j, shard)
    shown = -1
    while procs:
        time.sleep(0.5)
        for j, (proc, remaining, path, last) in list(procs.items()):
            done, started = _read_results(path)
            if len(done) != _progress.get(j):
                _progress[j], last = len(done), time.monotonic()
                procs[j] = (proc, remaining, path, last)
            stuck = time.monotonic() - last > OP_TIMEOUT_S
            if proc.poll() is None and not stuck:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            left = [k for k in remaining if k not in done]
            if started is not None and started in left:
                why = "timed out" if stuck else f"worker died (exit code {proc.returncode})"
                dead = OpResult(started, "crash", detail=f"{why} while compiling or running this op")
                with open(path, "a") as f:
                    f.write(json.dumps(asdict(dead)) + "\n")
                left.remove(started)
            del procs[j]
            _progress.pop(j, None)
            if left:
                launch(j, left)
        total = sum(len(_read_results(os.path.join(workdir, f"shard{j}.jsonl"))[0]) for j in range(jobs))
        if total != shown:
            shown = total
            print(f"\r[opinfo sweep] {total}/{len(keys)} ops", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for j in range(jobs):
        results.update(_read_results(os.path.join(workdir, f"shard{j}.jsonl"))[0])
    return results


_progress: dict = {}


# -- the report ---------------------------------------------------------------------------------

ORDER = ["native", "partial", "extern", "eager-fallback", "mismatch", "crash", "untraceable", "eager-error",
         "no-samples"]
HEADER = [
    "# OpInfo sweep report",
    "",
    "Every PyTorch OpInfo with float32 CPU samples (torch " + torch.__version__ + "), compiled by",
    "minicompile and compared with eager (values with dtype tolerances, NaN/inf positions,",
    "dtype, shape, strides where eager's output is dense). Regenerate with:",
    "",
    "    python -m minicompile.testing.opinfo_sweep --jobs 2 --report docs/opinfo-report.md",
    "",
]


def report(results: dict, seconds: float, header: list = HEADER, module: str = MODULE) -> str:
    rows = sorted(results.values(), key=lambda r: (ORDER.index(r.status), r.op))
    counts = Counter(r.status for r in rows)
    reasons = Counter(line for r in rows for line in r.externs)
    lines = header + [
        f"{len(rows)} OpInfos swept in {seconds / 60:.1f} min (up to {MAX_SAMPLES} samples each, batched "
        f"into one graph). Statuses are defined in `{module.replace('.', '/')}.py`.",
        "",
        "| status | ops |",
        "|---|---|",
    ]
    lines += [f"| {s} | {counts[s]} |" for s in ORDER if counts[s]]
    compiled = sum(counts[s] for s in ("native", "partial", "extern", "mismatch", "crash"))
    fallback = f"; eager fallbacks (compared too): {counts['eager-fallback']}" if counts["eager-fallback"] else ""
    lines += ["", f"Compiled and compared: {compiled} ops{fallback}; mismatches: {counts['mismatch']}; "
              f"crashes: {counts['crash']}.", ""]
    fallbacks = Counter(r.detail for r in rows if r.status == "eager-fallback")
    if fallbacks:
        lines += ["## Eager fallbacks, by reason", "", "| ops | reason |", "|---|---|"]
        lines += [f"| {n} | {_cell(reason)} |" for reason, n in fallbacks.most_common()] + [""]
    lines += ["## Most common extern reasons", "", "| ops | extern op: reason |", "|---|---|"]
    lines += [f"| {n} | {_cell(reason)} |" for reason, n in reasons.most_common(40)]
    lines += ["", "## Per op", "", "| op | status | samples | kernels | externs / detail |", "|---|---|---|---|---|"]
    for r in rows:
        notes = "; ".join(r.externs)
        if r.detail:
            notes = (r.detail + ("; " + notes if notes else ""))
        if r.random:
            notes = "random op: dtype/shape/strides compared only" + ("; " + notes if notes else "")
        lines.append(f"| `{r.op}` | {r.status} | {r.samples} | {r.kernels} | {_cell(notes)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:400]


def main(argv=None) -> int:
    return cli(argv, "Compile every float32 OpInfo with minicompile and compare with eager.",
               float32_ops, sweep_op, MODULE, HEADER, "opinfo-sweep")


def cli(argv, description: str, ops_fn, sweep_one, module: str, header: list, workdir: str) -> int:
    """The command line of a sweep: ``ops_fn()`` names the OpInfos, ``sweep_one(op)`` sweeps one."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant); default all")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--report", help="write the markdown report here (e.g. docs/opinfo-report.md)")
    p.add_argument("--workdir", default=os.path.join(config.cache_dir, workdir),
                   help="where workers write their results")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    ops = ops_fn()
    if args.worker:
        with open(args.worker) as f:
            worker(json.load(f), args.out, ops, sweep_one)
        return 0
    keys = sorted(ops)
    if args.ops:
        wanted = set(args.ops.split(","))
        keys = [k for k in keys if k in wanted or k.split(".")[0] in wanted]
    t0 = time.perf_counter()
    results = run_sweep(keys, max(1, args.jobs), args.workdir, module)
    seconds = time.perf_counter() - t0
    counts = Counter(r.status for r in results.values())
    print(", ".join(f"{s} {counts[s]}" for s in ORDER if counts[s]))
    for r in sorted(results.values(), key=lambda r: r.op):
        if r.status in BAD:
            print(f"  {r.status}: {r.op}: {r.detail}")
    if args.report:
        with open(args.report, "w") as f:
            f.write(report(results, seconds, header, module))
        print(f"report written to {args.report}")
    return 1 if any(r.status in BAD for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
