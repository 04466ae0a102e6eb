"""Horizontal groups: consecutive independent C++ kernels run as one call, one parallel region.

An optimizer step is one small pointwise kernel per parameter. Called one by one, each
kernel above the parallel threshold opens and joins its own OpenMP parallel region (a wake-up
of the pool and a join per tensor), and each costs a Python -> C call. When the machine's
cores are busy with other work, a join waits for the slowest thread to be scheduled again:
the SGD step over 100 tensors spent most of its time there (docs/optimizer.md). A group is
one ``extern "C"`` function that opens one region and runs its members inside it:

    #pragma omp parallel
    {
        kernel0_pointwise(...);           // its loop: #pragma omp for schedule(static) nowait
        #pragma omp single nowait
        kernel1_pointwise(...);           // a loop below the threshold: one thread runs it
        ...
    }

No member waits for another (``nowait``): the first thread done with its share of one
tensor's loop starts on the next, and small members go to whichever thread is free. That is
only correct when members are independent: a member joins the group when it writes nothing
another member touches and reads nothing another member writes (by storage name, so an
in-place update of a mutated input counts as a write of that input). Members are
consecutive in the schedule, so no extern call moves across a group; the wrapper keeps
every buffer a member touches alive until the group's call (codegen/wrapper.py).

Only static-size pointwise kernels of graphs without size symbols group (reductions keep
their own regions and per-row structure; symbolic sizes decide threads at run time).
"""
from __future__ import annotations

from minicompile.codegen.cpp_ops import CTYPE
from minicompile.config import config
from minicompile.scheduler.kernel import FusedKernel


def groupable(ck) -> bool:
    """A kernel that can run inside a group's region (a CppKernel, not yet rendered). Only in
    graphs without size symbols: a static-size kernel may still index by a symbolic stride,
    and a group passes pointers only."""
    return (not ck.k.is_reduction and ck.static and not ck.symbols and not ck.inner_parallel
            and ck.k.outer_numel != 0)


def form_groups(steps: list, kernels: dict) -> list[list]:
    """Runs of two or more consecutive, groupable, mutually independent kernels, in schedule
    order; ``kernels`` maps a FusedKernel's name to its CppKernel."""
    groups, run = [], []
    touched, written = set(), set()  # by the run so far: argument names

    def close():
        if len(run) > 1:
            groups.append(list(run))
        run.clear(), touched.clear(), written.clear()

    for step in steps:
        ck = kernels.get(step.name) if isinstance(step, FusedKernel) else None
        if ck is None or not groupable(ck):
            close()
            continue
        reads = {a.name for a in ck.args if a.read}
        writes = {a.name for a in ck.args if a.written}
        if writes & touched or reads & written:
            close()
        run.append(ck)
        touched |= reads | writes
        written |= writes
    close()
    return groups


def render_group(name: str, members: list) -> tuple[str, list]:
    """The group's C++ function (members already rendered as ``static`` functions) and its
    argument names: every member's arguments, each once, in first-use order."""
    args: dict = {}  # argument name -> (ctype, written by some member)
    for ck in members:
        for a in ck.args:
            _, written = args.get(a.name, (None, False))
            args[a.name] = (CTYPE[a.dtype], written or a.written)
    params = [f"    {'' if w else 'const '}{t}* {n}" for n, (t, w) in args.items()]
    work = sum(ck.work for ck in members)
    region = work >= config.parallel_threshold
    body = []
    for ck in members:
        call = f"{ck.k.name}({', '.join(a.name for a in ck.args)});"
        body += [call] if ck.parallel or not region else ["#pragma omp single nowait", call]
    lines = [f"// {name}: {len(members)} independent kernels, {work} elements, one call"
             + (", one parallel region, no barrier between kernels" if region else ""),
             f'extern "C" void {name}(', ",\n".join(params), ")", "{"]
    if region:
        lines += ["    #pragma omp parallel", "    {"] + ["        " + ln for ln in body] + ["    }"]
    else:
        lines += ["    " + ln for ln in body]
    return "\n".join(lines + ["}"]), list(args)
