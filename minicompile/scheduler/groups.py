"""Horizontal groups, a step of schedule(): consecutive independent kernels run as one call.

An optimizer step is one small pointwise kernel per parameter; called one by one, each opens
and joins its own OpenMP region (docs/optimizer.md). A group is one call with one region, no
member waiting for another (codegen/cpp.py's render_group), so a kernel joins only when it
writes nothing another member touches and reads nothing another member writes (by storage
name). Members are consecutive: no extern moves across a group. Only where the backend can
(``BackendCaps.horizontal``), with ``MINICOMPILE_HORIZONTAL`` on, and only static-size pointwise
kernels of graphs without size symbols (a group passes pointers only).
"""
from __future__ import annotations

from dataclasses import dataclass

from minicompile.config import config
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import is_static
from minicompile.scheduler.caps import BackendCaps
from minicompile.scheduler.kernel import FusedKernel, kernel_args


@dataclass(frozen=True)
class HorizontalGroup:
    name: str         # the function the wrapper calls in place of its kernels
    kernels: tuple    # its kernels' names, in schedule order; called where the last of them was


def horizontal_groups(steps: list, graph: LoopGraph, caps: BackendCaps) -> list[HorizontalGroup]:
    """Runs of two or more consecutive, groupable, mutually independent kernels, in schedule order."""
    if not (caps.horizontal and config.horizontal_groups) or graph.symbols:
        return []
    runs, touched, written = [[]], set(), set()  # what the last run reads or writes, writes: storage names
    for step in steps:
        groupable = (isinstance(step, FusedKernel) and not step.is_reduction and step.outer_numel != 0
                     and is_static([step.outer_numel, step.inner_numel]) and not step.checks_indices())
        args = kernel_args(step, graph.by_name, graph.mutations) if groupable else []
        reads, writes = {a.name for a in args if a.read}, {a.name for a in args if a.written}
        if not groupable or writes & touched or reads & written:   # the run ends before this step
            runs, touched, written = runs + [[]], set(), set()
        if groupable:
            runs[-1].append(step.name)
            touched, written = touched | reads | writes, written | writes
    return [HorizontalGroup(f"group{i}", tuple(r)) for i, r in enumerate(r for r in runs if len(r) > 1)]
