"""The one pass runner of the ATen stage: inference, the joint graph, and compile_aten alike.

    gm = run_passes(gm, ctx, passes, by="trace_inference")

Each pass is an ``AtenPass(name, run)`` with ``run(gm, ctx) -> gm``. The runner times each and
stamps the result, as thunder's traces do: ``ctx.constructed_by`` gains
``(by, ((pass name, seconds), ...))``, one entry per runner that worked on the graph, oldest
first (a half of the joint graph carries trace_joint's, partition's and compile_aten's). Passes
run with autocast off; the ones that trace the captured graph apply the recorded state
(aot/autocast.py). ``constructed_by(program)`` prints an ``AtenProgram``'s as its header:

    # Constructed by trace_joint: custom_ops 0.0 ms, fake_forward 28.4 ms, trace 793.6 ms, ... (823 ms)
    #   then partition, forward half: min_cut 2.1 ms, split 0.8 ms (3 ms)
    #   then compile_aten: lift 0.0 ms, aten_inputs 0.1 ms, ..., restride 0.6 ms, ... (8 ms)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from minicompile.aot.autocast import autocast_off


@dataclass(frozen=True)
class AtenPass:
    name: str
    run: Callable   # (gm, ctx) -> gm


@dataclass(frozen=True)
class AtenProgram:
    """What the ATen stage hands the stages after it (lowering, codegen, the wrapper)."""
    gm: torch.fx.GraphModule    # functional, decomposed ATen; meta["val"] on every node
    lifted: tuple = ()          # tensor attributes ``lift`` made inputs, passed after the caller's
    prepared: Any = None        # the CPU's CachedPreparation of the trailing inputs (cpu/prepare.py), or None
    constructed_by: tuple = ()  # ((by, ((pass name, seconds), ...)), ...), oldest first
    choices: tuple = ()         # one line per choice a device policy measured


def run_passes(gm: torch.fx.GraphModule, ctx, passes, by: str) -> torch.fx.GraphModule:
    """Run ``passes`` in order; ``ctx.constructed_by`` gains ``(by, ((name, seconds), ...))``."""
    stamps = []
    with autocast_off():   # the passes that trace the captured graph apply ctx.autocast (aot/autocast.py)
        for p in passes:
            t0 = time.perf_counter()
            gm = p.run(gm, ctx)
            stamps.append((p.name, time.perf_counter() - t0))
    ctx.constructed_by = (*ctx.constructed_by, (by, tuple(stamps)))
    return gm


def constructed_by(program) -> str:
    """``# Constructed by trace_inference: lift 0.1 ms, functionalize 80.2 ms, ... (88 ms)``, one
    line per runner of ``program.constructed_by`` (an AtenProgram, a JointGraph), then one per
    choice a device policy measured (``# cpu: mm 8x16x32 -> onednn 0.012 ms, mkl 0.015 ms``)."""
    lines = []
    for k, (by, stamps) in enumerate(program.constructed_by):
        total = sum(s for _, s in stamps) * 1000
        passes = ", ".join(f"{name} {s * 1000:.1f} ms" for name, s in stamps)
        lines.append(f"# {'Constructed by' if k == 0 else '  then'} {by}: {passes} ({total:.0f} ms)\n")
    return "".join(lines) + "".join(f"# {line}\n" for line in program.choices)
