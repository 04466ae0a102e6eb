"""A CPython-differential fuzzer for the capture front end.

Program k (seed + k) is a random Python function mixing tensors with containers, NumPy,
closures, generators, exceptions, classes, functools/itertools/copy, builtins on any object and
``.item()`` (the blocks of ``fuzz_py_blocks``). Its module source is executed twice, so the
eager run and the compiled run each have their own globals and classes. The function is called
several times with new inputs of the same and other shapes; after every call the result (or the
exception's type and message), the arguments it may have mutated and the module's mutable
globals must be the same as CPython's running the function uncompiled.

The bulk run compiles with a backend that runs each captured FX graph eagerly: it tests the front
end, which is what is under test. Every ``--pipeline-every``-th program goes through the real
minicompile pipeline instead. A failing program is shrunk (blocks, then lines, then calls) and
written as a standalone reproducer under ``--repro-dir``::

    python -m minicompile.testing.fuzz_py --seed 0 -n 5000
    python -m minicompile.testing.fuzz_py --show 1234      # print program 1234
"""
from __future__ import annotations

import argparse
import collections
import linecache
import math
import os
import random
import sys
import time
import types
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch

import minicompile
from minicompile.testing.fuzz_py_blocks import BLOCKS, GLOBALS, PRELUDE

SHAPES = [(3, 4), (3, 4), (5, 4), (3, 4)]     # new data, then another shape (automatic dynamic)


def front_end_backend(gm, example_inputs):
    """Runs the captured graph eagerly: the bulk run tests capture, not code generation."""
    return gm.forward


@dataclass
class Program:
    seed: int
    blocks: list                  # each a list of source lines of the function body
    calls: list                   # (input seed, shape, opt kind)
    pipeline: bool = False        # compiled by the real pipeline, not the eager-graph backend

    def function_source(self) -> str:
        body = ["global G_N", "acc = x * 1", "n = len(lst)", "out = []"]
        body += [line for block in self.blocks for line in block]
        body.append("return acc, n, out")
        return "def program(x, y, lst, dct, obj, opt=None):\n" + "".join(f"    {line}\n" for line in body)

    def source(self) -> str:
        return PRELUDE + "\n\n" + self.function_source()

    def reproducer(self, message: str) -> str:
        header = "\n".join(f"# {line}" for line in message.splitlines())
        return (f"# fuzz_py program {self.seed}: compiled and CPython runs disagree\n{header}\n"
                f"{self.source()}\n\nCALLS = {self.calls!r}\n\n"
                "if __name__ == '__main__':\n"
                "    from minicompile.testing.fuzz_py import Program, check\n"
                f"    print(check(Program({self.seed}, [], CALLS, pipeline={self.pipeline}),"
                " source=open(__file__).read()) or 'ok')\n")


def generate(seed: int, pipeline_every: int = 0) -> Program:
    rng = random.Random(seed)
    blocks = [rng.choice(BLOCKS)(rng) for _ in range(rng.randint(2, 5))]
    calls = [(seed * 10 + i, shape, rng.choice([0, 0, 1, 2, 3])) for i, shape in enumerate(SHAPES)]
    return Program(seed, blocks, calls, pipeline=bool(pipeline_every) and seed % pipeline_every == 0)


@dataclass
class Raised:
    """An exception as the comparison sees it: type name and message."""
    kind: str
    message: str


def _load(source: str, name: str) -> dict:
    filename = f"<fuzz_py {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(f"fuzz_py_{name}".replace(" ", "_"))
    sys.modules[module.__name__] = module      # dataclasses and pickling look their module up
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)      # `(1, 2) is None` is a fine test
        exec(compile(source, filename, "exec"), module.__dict__)
    return module.__dict__


def _call(fn, args):
    try:
        return fn(*args)
    except Exception as e:            # the comparison is of what the user sees
        return Raised(type(e).__name__, str(e))


def diff(e, a, path: str = "result", tol: float = 1e-5) -> str | None:
    """Where CPython's value ``e`` and the compiled run's ``a`` differ, or None."""
    if type(e).__qualname__ != type(a).__qualname__:
        return f"{path}: type {type(e).__qualname__} vs {type(a).__qualname__} ({_short(e)} vs {_short(a)})"
    if isinstance(e, Raised):
        return None if e == a else f"{path}: raised {e.kind}({e.message!r}) vs {a.kind}({a.message!r})"
    if isinstance(e, torch.Tensor):
        if e.dtype != a.dtype or e.shape != a.shape:
            return f"{path}: tensor {e.dtype}{list(e.shape)} vs {a.dtype}{list(a.shape)}"
        ok = torch.allclose(e.double(), a.double(), rtol=tol, atol=tol, equal_nan=True)
        return None if ok else f"{path}: tensor values differ (max {float((e.double() - a.double()).abs().max())})"
    if isinstance(e, (np.ndarray, np.generic)):
        if e.dtype != a.dtype or e.shape != a.shape:
            return f"{path}: array {e.dtype}{e.shape} vs {a.dtype}{a.shape}"
        return None if np.allclose(e, a, rtol=tol, atol=tol, equal_nan=True) else f"{path}: array values differ"
    if isinstance(e, float):
        same = math.isclose(e, a, rel_tol=tol, abs_tol=tol) or (math.isnan(e) and math.isnan(a))
        return None if same else f"{path}: {e!r} vs {a!r}"
    if isinstance(e, (list, tuple, collections.deque)):
        if len(e) != len(a):
            return f"{path}: length {len(e)} vs {len(a)} ({_short(e)} vs {_short(a)})"
        if isinstance(e, collections.deque) and e.maxlen != a.maxlen:
            return f"{path}: maxlen {e.maxlen} vs {a.maxlen}"
        return next((d for i, (x, y) in enumerate(zip(e, a)) if (d := diff(x, y, f"{path}[{i}]", tol))), None)
    if isinstance(e, dict):
        if list(e) != list(a):
            return f"{path}: keys {list(e)} vs {list(a)}"
        return next((d for k in e if (d := diff(e[k], a[k], f"{path}[{k!r}]", tol))), None)
    if isinstance(e, (set, frozenset, int, str, bytes, type(None), torch.dtype, torch.device)):
        return None if e == a else f"{path}: {e!r} vs {a!r}"
    if hasattr(e, "__dict__") and not callable(e):
        return diff(dict(sorted(vars(e).items())), dict(sorted(vars(a).items())), f"{path}.__dict__", tol)
    return None                       # functions, iterators, classes: the type is all we compare


_IDENTITY_TYPES = (list, dict, set, collections.deque, torch.Tensor, np.ndarray)


def _walk(value, path: str, depth: int = 0):
    """(path, object) for ``value`` and what it holds, for the objects whose identity is visible."""
    if isinstance(value, _IDENTITY_TYPES) or (hasattr(value, "__dict__") and not callable(value)):
        yield path, value
    if depth < 3 and isinstance(value, (list, tuple, collections.deque)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]", depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}[{k!r}]", depth + 1)


def identities(result, args) -> list:
    """Which parts of ``result`` are (``is``) which parts of the arguments: Python shows it."""
    where = {}
    for path, v in _walk(list(args), "args"):
        where.setdefault(id(v), path)
    return [f"{path} is {where[id(v)]}" for path, v in _walk(result, "result") if id(v) in where]


def _short(v) -> str:
    text = repr(v) if not isinstance(v, torch.Tensor) else f"tensor{list(v.shape)}"
    return text if len(text) < 120 else text[:117] + "..."


@dataclass
class Outcome:
    failure: str | None = None
    graphs: int = 0
    breaks: int = 0
    fallbacks: int = 0
    raised: int = 0                   # calls where CPython itself raised
    notes: list = field(default_factory=list)


def run(program: Program, source: str | None = None) -> Outcome:
    source = source or program.source()
    eager_ns, compiled_ns = _load(source, f"{program.seed} eager"), _load(source, f"{program.seed}")
    if program.pipeline:
        compiled = minicompile.compile(compiled_ns["program"])
    else:
        compiled = minicompile.compile(compiled_ns["program"], backend=front_end_backend)
    outcome = Outcome()
    tol = 1e-4 if program.pipeline else 1e-5
    for index, (seed, shape, opt_kind) in enumerate(program.calls):
        eager_args = eager_ns["make_inputs"](seed, shape, opt_kind)
        compiled_args = compiled_ns["make_inputs"](seed, shape, opt_kind)
        expected = _call(eager_ns["program"], eager_args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _call(compiled, compiled_args)
        outcome.raised += isinstance(expected, Raised)
        where = f"call {index} (inputs seed {seed}, shape {shape}, opt kind {opt_kind})"
        pairs = [(expected, got, "result"), (eager_args, compiled_args, "arguments")]
        pairs += [(eager_ns[g], compiled_ns[g], g) for g in GLOBALS]
        for e, a, path in pairs:
            if (d := diff(e, a, path, tol)):
                outcome.failure = f"{where}: {d}"
                break
        same_objects = identities(expected, eager_args), identities(got, compiled_args)
        if not outcome.failure and same_objects[0] != same_objects[1]:
            outcome.failure = f"{where}: aliasing {same_objects[0]} vs {same_objects[1]}"
        if outcome.failure:
            break
    for namespace in (eager_ns, compiled_ns):
        sys.modules.pop(namespace["__name__"], None)
    report = compiled.capture_report
    outcome.graphs, outcome.breaks, outcome.fallbacks = len(report.graphs), report.break_count, len(report.fallbacks)
    return outcome


def check(program: Program, source: str | None = None) -> str | None:
    """The first difference between CPython and the compiled run, or None."""
    return run(program, source).failure


def _still_fails(program: Program) -> bool:
    try:
        compile(program.source(), "<shrink>", "exec")
    except SyntaxError:
        return False
    return check(program) is not None


def shrink(program: Program) -> Program:
    """A smaller program that still fails: drop blocks, then single lines, then calls."""
    program = _drop_each(program, lambda p: p.blocks, lambda p, blocks: replace(p, blocks=blocks))
    for b in range(len(program.blocks)):
        program = _drop_each(program, lambda p: p.blocks[b],
                             lambda p, lines: replace(p, blocks=p.blocks[:b] + [lines] + p.blocks[b + 1:]))
    return _drop_each(program, lambda p: p.calls, lambda p, calls: replace(p, calls=calls))


def _drop_each(program: Program, items, rebuild) -> Program:
    """Drop the items ``items(program)`` one at a time (keeping one) while the program still fails."""
    i = 0
    while i < len(items(program)) and len(items(program)) > 1:
        smaller = rebuild(program, items(program)[:i] + items(program)[i + 1:])
        if _still_fails(smaller):
            program = smaller
        else:
            i += 1
    return program


def fuzz(seed: int, count: int, repro_dir: str, pipeline_every: int = 25, log=print) -> list:
    """Runs programs seed .. seed + count - 1; returns the failing seeds (reproducers written)."""
    failing, totals, start = [], collections.Counter(), time.perf_counter()
    for k in range(count):
        program = generate(seed + k, pipeline_every)
        try:
            outcome = run(program)
        except Exception as e:       # a program whose compiled wrapper itself could not be made
            outcome = Outcome(failure=f"fuzzer: {type(e).__name__}: {e}")
        totals.update(programs=1, graphs=outcome.graphs, breaks=outcome.breaks, fallbacks=outcome.fallbacks,
                      raised=outcome.raised, pipeline=program.pipeline)
        if outcome.failure:
            small = shrink(program)
            message = check(small) or outcome.failure
            os.makedirs(repro_dir, exist_ok=True)
            path = os.path.join(repro_dir, f"fuzz_py_{program.seed}.py")
            with open(path, "w") as f:
                f.write(small.reproducer(message))
            failing.append(program.seed)
            log(f"program {program.seed} FAILED: {message}\n    reproducer: {path}")
        if (k + 1) % 25 == 0 or k + 1 == count:
            log(f"{k + 1} programs, {len(failing)} failing, {totals['graphs']} graphs, {totals['breaks']} breaks, "
                f"{totals['fallbacks']} fallbacks, {totals['raised']} calls raising in CPython, "
                f"{totals['pipeline']} through the pipeline, {time.perf_counter() - start:.0f} s")
    return failing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="first program's seed (program k uses seed+k)")
    p.add_argument("-n", type=int, default=200, help="number of programs")
    p.add_argument("--pipeline-every", type=int, default=25,
                   help="every Nth program compiles through the real pipeline (0: none)")
    p.add_argument("--repro-dir", default="fuzz-py-repros", help="where shrunk reproducers are written")
    p.add_argument("--show", type=int, help="print program SEED as a standalone file and exit")
    args = p.parse_args(argv)
    if args.show is not None:
        program = generate(args.show, args.pipeline_every)
        print(program.source() + f"\n\nCALLS = {program.calls!r}")
        return 0
    return 1 if fuzz(args.seed, args.n, args.repro_dir, args.pipeline_every) else 0


if __name__ == "__main__":
    sys.exit(main())
