"""The fuzzer's dynamic mode: each batch compiled once with symbolic sizes, called at three sizes.

A batch of fuzzed programs (testing/fuzz.py) runs through ``torch.compile(dynamic=True,
backend="minicompile")``, so every size is a symbol, and is then called three times: at the
programs' own sizes, with every size made odd (``s -> s + 1 + s % 2``), and with the first
input's first size made 1 (Dynamo specialises sizes 0 and 1, so that call may recompile).
Sizes equal in a program stay equal, as broadcasting needs. A program that hard-codes a size
(``narrow``, ``select``, ``expand`` literals) may be rejected by eager at the new sizes: it
keeps its own sizes for that call. Every call is compared with eager::

    python -m minicompile.testing.fuzz --dynamic --seed 0 -n 1000
"""
from __future__ import annotations

from dataclasses import replace

import torch

from minicompile.backend import minicompile_backend
from minicompile.testing.compare import copy_preserving_strides, mismatch
from minicompile.testing.fuzz import Program, _precision_floor, _tolerances

STATS = {"dynamo compiles": 0, "calls": 0, "calls served by an earlier build": 0, "programs resized": 0,
         "programs kept at their sizes": 0}


def size_maps(prog: Program) -> list[dict]:
    """As written, every size (>= 2) made odd, the first input's first size (>= 2) made 1."""
    sizes = sorted({s for i in prog.inputs for s in i.shape if s >= 2})
    first = [s for s in prog.inputs[0].shape if s >= 2][:1]
    return [{}, {s: s + 1 + s % 2 for s in sizes}, {s: 1 for s in first}]


def resize(prog: Program, size_map: dict) -> Program:
    return replace(prog, inputs=[replace(i, shape=tuple(size_map.get(s, s) for s in i.shape)) for i in prog.inputs])


def _accepted(prog: Program) -> bool:
    try:
        prog.function()(*prog.make_inputs())
        return True
    except Exception:  # noqa: BLE001 - the program hard-codes a size eager rejects here
        return False


def check_batch(programs: list) -> str | None:
    """``programs`` compiled once as one symbolic graph (per Dynamo compile), called at each of
    ``size_maps``; None if every output matches eager, else the first difference."""
    fns = [p.function() for p in programs]

    def batched(*args):
        outs, k = [], 0
        for fn, p in zip(fns, programs):
            outs.append(fn(*args[k:k + len(p.inputs)]))
            k += len(p.inputs)
        return tuple(outs)

    def counting(gm, example_inputs):
        STATS["dynamo compiles"] += 1
        return minicompile_backend(gm, example_inputs)
    torch._dynamo.reset()
    compiled = torch.compile(batched, backend=counting, dynamic=True)
    try:
        for k in range(3):
            sized = []
            for p in programs:
                q = resize(p, size_maps(p)[k])
                resized = k > 0 and q != p and _accepted(q)
                STATS["programs resized" if resized else "programs kept at their sizes"] += k > 0
                sized.append(q if resized else p)
            found = _compare(batched, compiled, sized, k)
            if found:
                return found
    finally:
        torch._dynamo.reset()
    return None


def _compare(batched, compiled, programs: list, k: int) -> str | None:
    inputs = [p.make_inputs() for p in programs]
    flat = [t for x in inputs for t in x]
    STATS["calls"] += 1
    expected = batched(*[copy_preserving_strides(t) for t in flat])
    compiles = STATS["dynamo compiles"]
    try:
        actual = compiled(*[copy_preserving_strides(t) for t in flat])
        STATS["calls served by an earlier build"] += STATS["dynamo compiles"] == compiles
    except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
        return f"crash at size map {k}: {type(e).__name__}: {str(e).strip()[:300]}"
    for exp, act, x, p in zip(expected, actual, inputs, programs):
        found = mismatch(exp, act, tolerances=_tolerances(_precision_floor(x)))
        if found:
            return f"at input shapes {[i.shape for i in p.inputs]}: {found}"
    return None
