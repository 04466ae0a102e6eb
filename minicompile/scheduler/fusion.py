"""The fusion scheduler: a LoopGraph's buffers -> kernels, in an order that respects every dependency.

    plan = schedule(graph, caps)     ir.LoopGraph + BackendCaps -> Schedule

Buffers are visited in program order. Each computed buffer joins the most recent kernel it
reads from (or shares an input with) when the loops can be laid out together
(scheduler/kernel.py), every in-kernel read is of an element the same loop iteration wrote,
and fusing cannot create a cycle through a buffer outside the kernel. Every producer ->
consumer edge that ends up split across kernels keeps the reason, for ``explain`` and the CLI.
Last, runs of independent kernels become horizontal groups (scheduler/groups.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import torch
from torch.utils import _pytree as pytree

from minicompile.config import config
from minicompile.ir.expr import Expr, symbols_of
from minicompile.ir.flex import FlexAttention, FlexStat
from minicompile.ir.graph import LoopGraph, recorded_body
from minicompile.ir.nodes import ComputedBuffer, ExternKernel, Reduction, ScalarRef, StorageView, is_static, prod
from minicompile.scheduler.caps import BackendCaps
from minicompile.scheduler.groups import horizontal_groups
from minicompile.scheduler.kernel import CannotFuse, FusedKernel, Stage, plan_kernel, shared_recordings, split_loops


@dataclass
class ExternStep:
    buffer: object      # ExternKernel | MultiOutput
    reads: frozenset    # names of the buffers it reads

    @property
    def name(self):
        return self.buffer.name


@dataclass
class TemplateKernel:
    """A kernel the backend generates whole for one op (flex_attention's fused attention, ir/flex.py):
    it writes ``buffer`` and the buffers listed in ``outputs`` after it."""
    name: str
    buffer: FlexAttention
    reads: frozenset

    @property
    def outputs(self) -> list:
        return [self.buffer, *self.buffer.stats]


@dataclass
class Decision:
    producer: str
    consumer: str
    fused: bool
    reason: str = ""


@dataclass
class Schedule:
    steps: list                        # FusedKernel | ExternStep, in execution order
    caps: BackendCaps                  # what the plan assumed the code generator can do
    decisions: list = field(default_factory=list)
    groups: list = field(default_factory=list)   # HorizontalGroup (scheduler/groups.py)

    @property
    def kernels(self) -> list:
        return [s for s in self.steps if isinstance(s, FusedKernel)]

    @property
    def templates(self) -> list:
        return [s for s in self.steps if isinstance(s, TemplateKernel)]

    def __str__(self) -> str:
        lines = []
        for s in self.steps:
            if isinstance(s, FusedKernel):
                kind = "reduction" if s.is_reduction else "pointwise"
                lines.append(f"{s.name}: {kind} kernel, outer {list(s.outer_ranges)} inner {list(s.inner_ranges)}")
                lines += [f"    {line}" for line in str(s.values or "").splitlines()]
                for n in s.nodes:
                    where = "local" if n.name in s.local else "row scratch" if n.name in s.scratch else "stored"
                    lines.append(f"    {n.name} ({s.level[n.name]}, {where}) <- FX {', '.join(n.origins)}")
            elif isinstance(s, TemplateKernel):
                lines.append(f"{s.name}: fused flex_attention kernel, writes {', '.join(b.name for b in s.outputs)} "
                             f"<- FX {', '.join(s.buffer.origins)}")
            else:
                b = s.buffer
                if isinstance(b, ExternKernel):
                    lines.append(f"{b.name}: extern {b.op} <- FX {', '.join(b.origins)}  [{b.reason}]")
        if self.groups:
            lines.append("horizontal groups:")
            lines += [f"    {g.name}: one call, no barrier between {', '.join(g.kernels)}" for g in self.groups]
        unfused = [d for d in self.decisions if not d.fused]
        if unfused:
            lines.append("not fused:")
            lines += [f"    {d.producer} -> {d.consumer}: {d.reason}" for d in unfused]
        return "\n".join(lines)


def computed_numbers(graph: LoopGraph) -> dict:
    """Each symbol or number the graph computes at run time (graph.bound, and the ScalarRefs
    externs read) -> the buffer whose step computes it."""
    out = {s: where[0] for s, where in graph.bound.items()}
    for b in graph.buffers:
        if isinstance(b, ExternKernel):
            out.update({a.name: a.name for a in pytree.tree_leaves((b.args, b.kwargs)) if isinstance(a, ScalarRef)})
    return out


def buffer_symbols(buf) -> set:
    """The names of the symbols and run-time numbers ``buf`` uses: in its layout, its loops and
    loop body, or an extern's arguments."""
    exprs, names = [], set()
    if buf.layout is not None:
        exprs += [*buf.layout.size, *buf.layout.stride, buf.layout.offset]
    if isinstance(buf, ComputedBuffer):
        rec = recorded_body(buf)
        exprs += [*buf.data.reduction_ranges, *buf.data.ranges, *(r.index for r in rec.reads), *rec.exprs]
    elif isinstance(buf, ExternKernel):
        for leaf in pytree.tree_leaves((buf.args, buf.kwargs)):
            if isinstance(leaf, StorageView):
                exprs += [*leaf.size, *leaf.stride, leaf.offset]
            elif isinstance(leaf, Expr):
                exprs.append(leaf)
            elif isinstance(leaf, ScalarRef):
                names.add(leaf.name)
    return names | {s.name for e in exprs for s in symbols_of(e)}


class _Group:
    """Buffers bound for one kernel (or extern call); what the fusion search asks is kept current."""

    def __init__(self, index, first, bit: int):
        self.index = index
        self.nodes = [first]
        self.names = {first.name}
        self.mask = bit                           # the members' bits (see schedule's ``bit``)
        self.single = _single_element(first)      # every member is one element
        self.kernel = None

    def add(self, b, bit: int) -> None:
        self.nodes.append(b)
        self.names.add(b.name)
        self.mask |= bit
        self.single = self.single and _single_element(b)

    @property
    def is_extern(self):
        return not isinstance(self.nodes[0], ComputedBuffer)


# A row kept in a scratch array must fit comfortably on a thread's stack.
ROW_SCRATCH_LIMIT = 16384


def schedule(graph: LoopGraph, caps: BackendCaps) -> Schedule:
    """Group ``graph``'s buffers into kernels. With ``caps.row_scratch`` a per-row value read by a
    later loop of the same kernel is kept in a row-sized array instead of memory."""
    buffers, reads = graph.buffers, graph.reads
    deps = _dependencies(graph, reads)
    with shared_recordings():
        groups, group_of, failures = _fuse(buffers, reads, deps)
        steps = _steps(_group_order(groups, group_of, deps), graph, reads, deps, caps)
    decisions = []
    for b in buffers:
        for d in sorted(deps[b.name]):
            gp, gc = group_of[d], group_of[b.name]
            if gp is gc or (isinstance(b, FlexStat) and b.parent.name == d):   # one kernel writes both
                decisions.append(Decision(d, b.name, True))
            else:
                decisions.append(Decision(d, b.name, False, _edge_reason(gp, gc, b, failures)))
    return Schedule(steps, caps, decisions, horizontal_groups(steps, graph, caps))


def _dependencies(graph: LoopGraph, reads: dict) -> dict:
    """Buffer name -> the buffers that must run before it: those it reads, every earlier reader of
    an input it writes, the step computing a size or number it uses, the previous random draw."""
    buffers = graph.buffers
    by_name = {b.name: b for b in buffers}
    deps = {b.name: {r for r in reads[b.name] if r in by_name} for b in buffers}
    # a write into an input waits for every earlier reader of it, and for every check of an index read
    # from memory (a graph that raises IndexError leaves the caller's tensors as they were)
    checks = {b.name for b in buffers if isinstance(b, ComputedBuffer) and recorded_body(b).checks_indices()} \
        if any(isinstance(b, ComputedBuffer) and b.mutates for b in buffers) else set()
    for k, b in enumerate(buffers):
        if isinstance(b, ComputedBuffer) and b.mutates:
            deps[b.name] |= {o.name for o in buffers[:k] if b.mutates in reads[o.name] or o.name in checks}
    computed = computed_numbers(graph)  # a size or number the graph computes is known once its step ran
    if computed:
        symbols = {b.name: buffer_symbols(b) for b in buffers}
        for b in buffers:
            deps[b.name] |= {computed[s] for s in symbols[b.name] if s in computed} - {b.name}
        _checks_first(buffers, symbols, computed, deps)
    random = [b.name for b in buffers if _is_random(b)]  # draw from torch's generator in eager's order
    for before, after in zip(random, random[1:]):
        deps[after].add(before)
    return deps


def _fuse(buffers: list, reads: dict, deps: dict) -> tuple[list, dict, dict]:
    """(groups, buffer name -> its group, (group index, buffer name) -> why it could not join):
    each buffer in program order joins the first candidate kernel it can, or starts its own."""
    by_name = {b.name: b for b in buffers}
    # ancestor sets as bit masks (one bit per buffer): graph-sized sets per buffer, built and
    # intersected at machine-word speed (sets of names made this stage quadratic in time)
    bit = {b.name: 1 << k for k, b in enumerate(buffers)}
    ancestors = {}
    for b in buffers:
        anc = 0
        for d in deps[b.name]:
            anc |= ancestors[d] | bit[d]
        ancestors[b.name] = anc
    mutated_by = {b.mutates: b.name for b in buffers if isinstance(b, ComputedBuffer) and b.mutates}

    groups, group_of, failures = [], {}, {}
    readers = {}       # buffer or input name -> the groups with a member that reads it
    single = []        # groups whose first member is one element
    edges = nx.DiGraph()  # between groups so far: a buffer's group -> the groups of its readers
    for b in buffers:
        placed = None
        if isinstance(b, ComputedBuffer) and config.fusion:
            for g in _candidates(b, deps, reads, group_of, readers, single):
                reason = (_group_cycle(g, b, deps, group_of, edges)
                          or _try_fuse(g, b, deps, ancestors, reads, mutated_by, by_name))
                if reason is None:
                    placed = g
                    break
                failures[(g.index, b.name)] = reason
        if placed is None:
            placed = _Group(len(groups), b, bit[b.name])
            groups.append(placed)
            single += [placed] if placed.single else []
            if isinstance(b, ComputedBuffer):
                placed.kernel = plan_kernel("", [b])
        else:
            placed.add(b, bit[b.name])
        for r in reads[b.name]:
            readers.setdefault(r, {})[placed.index] = placed
        group_of[b.name] = placed
        edges.add_node(placed.index)
        edges.add_edges_from((group_of[d].index, placed.index) for d in deps[b.name] if group_of[d] is not placed)
    return groups, group_of, failures


def _steps(order: list, graph: LoopGraph, reads: dict, deps: dict, caps: BackendCaps) -> list:
    """The groups in run order as steps: an extern call, or a kernel named, its loops split where
    the backend can, in stages, with the values only it reads kept local (or in row scratch), and
    the backend's plan of its values (BackendCaps.plan)."""
    output_names = {o.buffer.name for o in graph.outputs if isinstance(o, StorageView)}
    readers_of = {}
    for b in graph.buffers:
        for r in reads[b.name]:
            readers_of.setdefault(r, []).append(b.name)
    steps, externs = [], 0
    by_name, mutations = (graph.by_name, graph.mutations) if caps.plan else ({}, {})
    for g in order:
        if isinstance(g.nodes[0], FlexStat):   # written by its FlexAttention's kernel
            continue
        if isinstance(g.nodes[0], FlexAttention):
            steps.append(TemplateKernel(f"kernel{len(steps) - externs}_flex_attention", g.nodes[0],
                                        reads[g.nodes[0].name]))
            continue
        if g.is_extern:
            steps.append(ExternStep(g.nodes[0], reads[g.nodes[0].name]))
            externs += 1
            continue
        kernel = g.kernel = split_loops(g.kernel) if caps.split_loops else g.kernel
        kernel.name = _kernel_name(len(steps) - externs, g.nodes)
        _build_stages(kernel, deps)
        _mark_locals(kernel, readers_of, output_names, caps.row_scratch)
        kernel.values = caps.plan(kernel, by_name, mutations, graph.sources) if caps.plan else None
        steps.append(kernel)
    return steps


def _candidates(b, deps, reads, group_of, readers, single) -> list:
    """The kernels ``b`` may join, most recent first: those holding a buffer it reads, those reading
    what it reads, and (for one element) those of one-element buffers. Looked up in indexes:
    walking every group per buffer made scheduling quadratic in the graph's size."""
    found = {group_of[d].index: group_of[d] for d in deps[b.name]}
    for r in reads[b.name]:
        found.update(readers.get(r, {}))
    if _single_element(b):
        found.update((g.index, g) for g in single if g.single)
    return [g for _, g in sorted(found.items(), reverse=True) if not g.is_extern]


def _single_element(b) -> bool:
    """One element, no loop: such kernels join each other even when they share no input (an
    optimizer's per-parameter step counters become one kernel, not one call each)."""
    return isinstance(b, ComputedBuffer) and not isinstance(b.data, Reduction) and prod(b.data.ranges) == 1


def _group_cycle(g, b, deps, group_of, edges) -> str | None:
    """Joining ``g`` makes ``b``'s producers' groups feed ``g``: a cycle if ``g`` already reaches
    one of them through other groups (``b`` shares only an input with ``g``, while a member of a
    group ``b`` reads depends on ``g``). Buffer-level ancestry does not see such group paths."""
    if not edges.has_node(g.index) or edges.out_degree(g.index) == 0:
        return None
    for p in deps[b.name]:
        gp = group_of[p]
        if gp is not g and nx.has_path(edges, g.index, gp.index):
            return f"would create a cycle through the kernel of {p}"
    return None


def _try_fuse(g, b, deps, ancestors, reads, mutated_by, by_name):
    names = g.names
    for r in reads[b.name]:
        if r in mutated_by and mutated_by[r] in names:
            return f"reads input {r} that the kernel overwrites"
    for p in deps[b.name] - names:
        if ancestors[p] & g.mask:
            return f"would create a cycle through {p}"
    try:
        kernel = plan_kernel("", g.nodes + [b])
    except CannotFuse as e:
        return str(e)
    if any(n.mutates for n in kernel.nodes) and kernel.checks_indices():
        return "a kernel that writes into an input reads no index from memory (it checks them all before)"
    if kernel.is_reduction and not deps[b.name] & names and not _shares_a_load(kernel, b):
        return "shares an input with the reduction kernel but reads none of its elements in the same iteration"
    for c in kernel.nodes:
        for r in kernel.reads(c):
            if r.name == b.mutates and r.index != kernel.store_index(b):
                # read-then-write of one element in one iteration is safe; any other element
                # may be read by another iteration after this one overwrote it
                return (f"writes input {b.mutates} at [{kernel.store_index(b)}] that {c.name} "
                        f"reads at [{r.index}]")
            if r.name in names or r.name == b.name:
                p = by_name[r.name]
                if kernel.level[c.name] == "outer" and kernel.level[p.name] == "inner":
                    return f"{c.name} is per-row but reads the per-element {p.name}"
                if r.index != kernel.store_index(p):
                    return f"{c.name} reads {p.name} at [{r.index}] but it is written at [{kernel.store_index(p)}]"
    g.kernel = kernel
    return None


def _shares_a_load(kernel: FusedKernel, b) -> bool:
    """A member that reads nothing a reduction kernel computes joins it to load a shared input
    once. When no read of ``b`` lands on an element another member loads in the same iteration
    (a LayerNorm backward's input gradient, a row map, laid out in the loops of its weight
    gradient, a sum down the columns), it saves no memory traffic and bends one of the two
    loops: the column sums lose their blocked layout, or the row map its unit stride. Pointwise
    kernels keep such members (q, k and v split from one matmul: one loop nest, three slices);
    so does any kernel a single-element member (an optimizer's step counter) joins."""
    if _single_element(b):
        return True
    loads = [(r.name, r.index) for c in kernel.nodes if c is not b for r in kernel.reads(c)]
    return any((r.name, r.index) in loads for r in kernel.reads(b))


def _checks_first(buffers, symbols, computed, deps) -> None:
    """A run-time check on sizes the graph computes (``_assert_scalar(Eq(u5, u3))``) runs before
    every later buffer that uses one of them: lowering took the sizes as equal there
    (``GraphLowering.same_size``), so a kernel must not read ``u3`` elements over ``u5`` first."""
    numbers = {b.name for b in buffers if isinstance(b, ExternKernel) and b.layout is None}
    for k, b in enumerate(buffers):
        if isinstance(b, ExternKernel) and b.op is torch.ops.aten._assert_scalar.default:
            checked, todo = set(), set(symbols[b.name])
            while todo:      # and the numbers its condition was computed from
                checked |= todo
                todo = {s for n in todo if computed.get(n) in numbers for s in symbols[computed[n]]} - checked
            for later in buffers[k + 1:]:
                if symbols[later.name] & checked:
                    deps[later.name].add(b.name)


def _group_order(groups, group_of, deps):
    graph = nx.DiGraph()
    for g in groups:
        graph.add_node(g.index)
    for name, ds in deps.items():
        for d in ds:
            a, b = group_of[d].index, group_of[name].index
            if a != b:
                graph.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(graph), "fusion created a cycle"
    return [groups[i] for i in nx.lexicographical_topological_sort(graph)]


def _is_random(buffer) -> bool:
    op = getattr(buffer, "op", None)
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


def _build_stages(kernel: FusedKernel, deps):
    stages, loop_reductions = [], set()
    for n in kernel.nodes:
        lvl = kernel.level[n.name]
        if lvl == "outer":
            if not stages or stages[-1].kind != "scalar":
                stages.append(Stage("scalar", []))
            stages[-1].nodes.append(n)
            loop_reductions = set()
            continue
        if not stages or stages[-1].kind != "loop" or deps[n.name] & loop_reductions:
            stages.append(Stage("loop", []))
            loop_reductions = set()
        stages[-1].nodes.append(n)
        if lvl == "reduction":
            loop_reductions.add(n.name)
    kernel.stages = stages


def _mark_locals(kernel: FusedKernel, readers_of: dict, output_names, row_scratch: bool):
    stage_of = {n.name: k for k, st in enumerate(kernel.stages) for n in st.nodes}
    for n in kernel.nodes:
        if n.name in output_names or n.mutates:
            continue
        readers = readers_of.get(n.name, [])
        if not all(r in stage_of for r in readers):
            continue
        if kernel.level[n.name] == "inner" and any(stage_of[r] != stage_of[n.name] for r in readers):
            if row_scratch and is_static([kernel.inner_numel]) and 0 < kernel.inner_numel <= ROW_SCRATCH_LIMIT:
                kernel.scratch.add(n.name)
            continue
        kernel.local.add(n.name)


def _kernel_name(k, nodes) -> str:
    kinds = []
    for n in nodes:
        if isinstance(n.data, Reduction):
            kinds.append(n.data.reduction_type)
    tag = "_".join(dict.fromkeys(kinds)) if kinds else "pointwise"
    return f"kernel{k}_{tag}"


def _edge_reason(gp, gc, consumer, failures) -> str:
    for g, role in ((gp, "producer"), (gc, "consumer")):
        if isinstance(g.nodes[0], (FlexAttention, FlexStat)):
            return f"{role} is flex_attention's fused kernel, generated whole"
    if gp.is_extern:
        return "producer is an extern call"
    if gc.is_extern:
        return "consumer is an extern call"
    if not config.fusion:
        return "fusion is turned off (config.fusion)"
    return failures.get((gp.index, consumer.name), "consumer joined another kernel first")
