"""The generated C++ kernels of the benchmark suites, written to a folder, to show a refactor
changed none of them.

    python benchmarks/kernel_snapshot.py OUT [--size full] [--choices DIR] [--only NAME,...]
    python benchmarks/kernel_snapshot.py --compare OUT_BEFORE OUT_AFTER

Compiles `bench`'s workloads (inference), `bench --models`' models (inference) and `bench
--train`'s workloads (one forward and backward step) with torch.compile(backend="minicompile"),
each with an empty kernel cache, and writes OUT/<suite>-<name>.cpp: every kernels.cpp the
compile produced (sorted by content, so the order of compiles does not matter). Measured
library choices (matrix product and attention library, convolution layout) depend on timings;
``--choices DIR`` keeps them in DIR and replays them in a later run, so two runs compare
kernels, not stopwatches. ``--compare`` says, per file, whether two snapshots hold the same
code: comments (source lines, FX node names) left out, and buffers named by first use (a graph
with one more value numbers the rest one higher).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import torch

from minicompile.config import patch
from minicompile.tools.models import MODELS
from minicompile.tools.workloads import TRAIN_WORKLOADS, WORKLOADS, build_train


def kernels_of(cache: Path) -> str:
    sources = sorted(p.read_text() for p in cache.rglob("kernels*.cpp"))
    return "\n// ---- next kernels.cpp ----\n".join(sources)


def code_of(path: Path) -> list:
    """The kernels.cpp files of a snapshot file, comments left out, buffers renamed by first use."""
    units = []
    for text in path.read_text().split("\n// ---- next kernels.cpp ----\n"):
        code = "\n".join(line.split("//")[0].rstrip() for line in text.splitlines() if line.split("//")[0].strip())
        names: dict = {}
        units.append(re.sub(r"\bbuf\d+\b", lambda m: names.setdefault(m.group(0), f"buf_{len(names)}"), code))
    return sorted(units)


def compare(before: Path, after: Path) -> int:
    differ = 0
    for f in sorted(before.glob("*.cpp")):
        other = after / f.name
        same = other.exists() and code_of(f) == code_of(other)
        differ += not same
        print(f"{f.stem}: {'same code' if same else 'DIFFERENT' if other.exists() else 'missing'}")
    return 1 if differ else 0


def compile_once(suite: str, name: str, size: str):
    torch.manual_seed(0)
    if suite == "bench":
        w = WORKLOADS[name]
        model, inputs = w.build(**w.sizes[size])
        with torch.no_grad():
            torch.compile(model, backend="minicompile")(*inputs)
    elif suite == "models":
        model, inputs = MODELS[name].build(size)
        with torch.no_grad():
            torch.compile(model, backend="minicompile")(*inputs)
    else:
        model, shape = build_train(name, size)
        x = torch.randn(*shape)
        torch.compile(model, backend="minicompile")(x).float().sum().backward()
    torch._dynamo.reset()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    ap.add_argument("--size", default="full", help="workload size: full, quick or tiny (models: full or tiny)")
    ap.add_argument("--choices", help="folder that keeps measured library choices between runs")
    ap.add_argument("--only", help="comma-separated names (suite-name, e.g. models-gpt2)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*map(Path, args.compare))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = ([("bench", n) for n in WORKLOADS] + [("models", n) for n in MODELS]
            + [("train", n) for n in TRAIN_WORKLOADS])
    if args.only:
        wanted = set(args.only.split(","))
        jobs = [j for j in jobs if f"{j[0]}-{j[1]}" in wanted]
    choices = Path(args.choices or tempfile.mkdtemp(prefix="mc-choices-")).resolve()
    choices.mkdir(parents=True, exist_ok=True)
    for suite, name in jobs:
        size = args.size if suite != "models" or args.size in ("full", "tiny") else "tiny"
        with tempfile.TemporaryDirectory(prefix="mc-snapshot-") as cache:
            os.symlink(choices, Path(cache) / "cpu-autotune")
            try:
                with patch(cache_dir=cache):
                    compile_once(suite, name, size)
            except Exception as e:  # a model whose optional dependency is missing, say
                print(f"{suite}-{name}: skipped ({type(e).__name__}: {e})", file=sys.stderr)
                continue
            text = kernels_of(Path(cache))
        (out / f"{suite}-{name}.cpp").write_text(text)
        print(f"{suite}-{name}: {text.count(chr(10))} lines of kernels", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
