"""The partitioner: a joint forward/backward graph -> a forward graph and a backward graph.

    part = partition(joint, mode, checkpoint)    mode: "min_cut" | "save_all" (config.partitioner)
                                                 checkpoint: "recompute" | "min_cut" (config.checkpoint)
    part.forward:  (*primals) -> (*outputs, *saved)
    part.backward: (*saved_primals, *saved, *tangents) -> the grads that are not None

Backward computes every node that depends on a tangent; what it reads from the forward is
either saved (a forward output) or recomputed from other saved values. ``save_all`` saves
every forward value backward reads. ``min_cut`` chooses by a minimum s-t cut (networkx),
where saving a value costs its bytes (an input costs nothing): each node v is an edge v_in -> v_out of that capacity,
data edges are infinite, the primals and every node that must not be recomputed hang off the
source, the tangent-dependent nodes off the sink. Only cheap native ops (pointwise, views,
copies, creation) may be recomputed, in chains of at most MAX_RECOMPUTE_DEPTH ops; matmuls,
convolutions, reductions, random ops and externs are always computed once, in the forward.
Values computed inside a ``torch.utils.checkpoint`` region are the exception (aot/checkpoint.py):
under the ``recompute`` policy they cannot be saved (no edge of finite capacity) and any op may
be recomputed, whatever its cost or chain length, so backward recomputes the region from what
flowed into it, as eager does; values a selective policy saves (MUST_SAVE, PREFER_SAVE) are
computed once, as the banned ones; the report says what the regions held and what became of it.
The joint's input write-backs (``copy_`` into a mutated input, aot/joint.py) go to the forward
graph, so BatchNorm's running statistics are updated once per forward, as eager does.
(Max pooling's int64 indices were rewritten by the joint trace's last pass, so that one byte per
output is what there is to save: aot/pool_offsets.py.) The partitioner does not rewrite the
joint graph: the halves are copies of its nodes, with their names and meta (source lines);
``part.about("forward")`` (or backward) is a half's title and stamps: the joint graph's passes,
then ``partition, forward half`` with the chooser's time and the split's.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field

import networkx as nx
import torch
import torch.fx
from torch.fx.experimental import symbolic_shapes
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils import _pytree as pytree

from minicompile.aot import checkpoint as ckpt
from minicompile.aot.joint import JointGraph, TrainingUnsupported, is_input_write
from minicompile.decomp.core_ops import NATIVE_OPS, REDUCTIONS

# torch 2.13's name; torch 2.11 (the GPU machines' torch) calls it hint_int
optimization_hint = getattr(symbolic_shapes, "optimization_hint", None) or symbolic_shapes.hint_int

# The longest chain of ops backward may recompute (a layer norm followed by an erf GELU is ~10).
MAX_RECOMPUTE_DEPTH = 16
RECOMPUTABLE = NATIVE_OPS - frozenset(REDUCTIONS)


@dataclass
class SavedValue:
    name: str
    shape: tuple
    dtype: torch.dtype
    nbytes: int


@dataclass
class PartitionReport:
    """What the forward keeps for backward, what backward recomputes, and the saving against save_all."""
    mode: str
    saved: list = field(default_factory=list)          # SavedValue, primals included
    recomputed: list = field(default_factory=list)     # "name = op" of nodes backward recomputes
    save_all_bytes: int = 0
    checkpointed: list = field(default_factory=list)   # names of recomputed nodes a checkpoint region made
    checkpoint: str = ""                               # the checkpoint line (aot/checkpoint.py); "" without regions
    kept: list = field(default_factory=list)           # names of saved values a checkpoint's policy keeps

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    def __str__(self) -> str:
        marked, kept = set(self.checkpointed), set(self.kept)
        saving = self.save_all_bytes - self.saved_bytes
        lines = [f"partition ({self.mode}): {len(self.saved)} saved tensor(s), {self.saved_bytes} bytes; "
                 f"save_all: {self.save_all_bytes} bytes; saving {saving} bytes",
                 *(f"  saved {s.name}: {list(s.shape)} {str(s.dtype).replace('torch.', '')} ({s.nbytes} bytes)"
                   f"{' (checkpoint policy)' if s.name in kept else ''}" for s in self.saved),
                 *(f"  recomputed {r}{' (checkpointed)' if r.split(' = ')[0] in marked else ''}"
                   for r in self.recomputed)]
        return "\n".join(lines + ([self.checkpoint] if self.checkpoint else []))


@dataclass
class Partition:
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    saved_primals: tuple           # positions of the primals backward reads (passed as they are)
    grad_slots: tuple              # per joint grad: its position among backward's outputs, or None
    report: PartitionReport
    stamps: tuple = ()             # the joint graph's (aot/runner.py), then the partition's steps and times

    def about(self, half: str) -> dict:
        """compile_aten's title and constructed_by for the ``half`` ("forward" or "backward") half."""
        *joint, steps = self.stamps
        return {"title": f"{half} half of the joint graph", "constructed_by": (*joint, (f"partition, {half} half", steps))}


def partition(joint: JointGraph, mode: str = "min_cut", checkpoint: str = "recompute") -> Partition:
    if mode not in CHOOSERS:
        raise ValueError(f"minicompile: unknown partitioner {mode!r}; choose one of {sorted(CHOOSERS)}")
    t0 = time.perf_counter()
    view = JointView(joint, checkpoint)
    in_backward = CHOOSERS[mode](view)
    full = view.boundary(view.tangent_dependent)
    t1 = time.perf_counter()
    report = PartitionReport(mode, save_all_bytes=sum(nbytes(n) for n in full))
    part = view.split(in_backward, report)
    if view.region:
        saved = {n for n in view.nodes if n.name in {s.name for s in report.saved}}
        report.checkpointed = [n.name for n in view.region if n in in_backward]
        report.kept = [n.name for n in view.region if n in view.kept and n in saved]
        report.checkpoint = ckpt.summary(checkpoint if mode == "min_cut" else mode, view.region, in_backward, saved,
                                         view.kept if mode == "min_cut" else set())
    steps = [(mode, t1 - t0), ("split", time.perf_counter() - t1)]
    part.stamps = (*joint.constructed_by, tuple(steps))
    return part


class JointView:
    """The joint graph's nodes sorted by role: primals, tangents, outputs, grads."""

    def __init__(self, joint: JointGraph, checkpoint: str = "recompute"):
        self.joint = joint
        self.gm = joint.graph
        self.nodes = list(self.gm.graph.nodes)
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.primals, self.tangents = placeholders[:joint.num_primals], placeholders[joint.num_primals:]
        results = next(n for n in self.nodes if n.op == "output").args[0]
        self.outputs, self.grads = list(results[:joint.num_outputs]), list(results[joint.num_outputs:])
        self.writes = [n for n in self.nodes if n.op == "call_function" and is_input_write(n)]
        self.tangent_dependent = self._descendants(self.tangents)
        self.needed = self._ancestors([g for g in self.grads if isinstance(g, torch.fx.Node)])
        forward = set(self.nodes) - self.tangent_dependent
        self.region = ckpt.regions(self.nodes, forward)       # checkpointed node -> region id
        backward_made = ckpt.made_by_backward(self.nodes, self.tangent_dependent) if self.region else set()
        self.always_recomputed = ckpt.always_recomputed(self.region, forward, checkpoint, backward_made)
        self.kept = ckpt.kept(self.region, checkpoint)             # a selective policy's saves

    def _descendants(self, roots) -> set:
        seen = set(roots)
        for n in self.nodes:
            if any(a in seen for a in n.all_input_nodes) and n.op != "output":
                seen.add(n)
        return seen

    def _ancestors(self, roots) -> set:
        seen, stack = set(), list(roots)
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(n.all_input_nodes)
        return seen

    def boundary(self, in_backward: set) -> list:
        """The values backward reads but does not compute (tangents excluded), in graph order."""
        read = {a for n in in_backward for a in n.all_input_nodes}
        read |= {g for g in self.grads if isinstance(g, torch.fx.Node)}
        return [n for n in self.nodes if n in read and n not in in_backward
                and n not in self.tangents and n.op != "get_attr"]

    def split(self, in_backward: set, report: PartitionReport) -> Partition:
        inputs = self.boundary(in_backward)
        inputs += [p for p in self.symbols_for(in_backward, inputs) if p not in inputs]
        saved_primals = [n for n in inputs if n in self.primals]
        written = [w.args[0].name for w in self.writes if w.args[0] in saved_primals]
        if written:
            raise TrainingUnsupported(f"backward reads input(s) {written} that the forward writes")
        saved = [n for n in inputs if n not in self.primals]
        report.saved = [saved_value(n) for n in inputs]
        report.recomputed = [f"{n.name} = {n.target}" for n in self.nodes
                             if n in in_backward and n not in self.tangent_dependent]
        grads = [g for g in self.grads if isinstance(g, torch.fx.Node)]
        slots, k = [], 0
        for g in self.grads:
            slots.append(k if isinstance(g, torch.fx.Node) else None)
            k += isinstance(g, torch.fx.Node)
        forward = extract(self.gm, self.primals, self.outputs + saved, self.writes)
        backward = extract(self.gm, saved_primals + saved + self.tangents, grads)
        return Partition(forward, backward, tuple(self.primals.index(p) for p in saved_primals), tuple(slots), report)

    def symbols_for(self, in_backward: set, inputs: list) -> list:
        """The size primals (Dynamo's int inputs, ``s56``) whose symbol backward's values name: a
        symbol no backward input has as a size (a stride of a strided input, ``(s10,)`` with
        stride ``(s56,)``) reaches the backward's wrapper as that int."""
        named = set()
        for n in [*in_backward, *inputs]:
            for v in pytree.tree_leaves(n.meta.get("val")):
                if isinstance(v, (torch.Tensor, torch.SymInt)):
                    named |= free_symbols(v)
        return [p for p in self.primals if isinstance(p.meta.get("val"), torch.SymInt)
                and p.meta["val"].node.expr in named]


# A symbolic number saved for backward (a size) is reported as a 0-d value of its kind.
_SYM_DTYPES = {torch.SymInt: torch.int64, torch.SymFloat: torch.float64, torch.SymBool: torch.bool}


def saved_value(node: torch.fx.Node) -> SavedValue:
    val = node.meta["val"]
    if isinstance(val, torch.Tensor):
        return SavedValue(node.name, tuple(val.shape), val.dtype, nbytes(node))
    return SavedValue(node.name, (), _SYM_DTYPES.get(type(val), torch.int64), nbytes(node))


def nbytes(node: torch.fx.Node) -> int:
    """The value's bytes; with symbolic sizes, at the sizes of the example it was traced with (the
    symbols' hints, read without a guard): the cut chosen there serves every size."""
    val = node.meta.get("val")
    return optimization_hint(val.numel(), fallback=1) * val.element_size() if isinstance(val, torch.Tensor) else 8


def extract(gm: torch.fx.GraphModule, inputs: list, outputs: list, effects: list = ()) -> torch.fx.GraphModule:
    """A new graph: ``inputs`` become placeholders, and it computes ``outputs`` from them (and
    runs ``effects``, nodes nothing reads: the input write-backs)."""
    graph = torch.fx.Graph()
    env = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)
    needed, stack = set(), [o for o in [*outputs, *effects] if isinstance(o, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n not in needed and n not in env:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    for n in gm.graph.nodes:
        if n in needed:
            if n.op == "placeholder":
                raise ValueError(f"partition: {n.name} is needed but not an input of this graph")
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs))
    return torch.fx.GraphModule(gm, graph)


def save_all(view: JointView) -> set:
    """Backward computes only what depends on a tangent; every forward value it reads is saved."""
    return view.needed & view.tangent_dependent


def min_cut(view: JointView) -> set:
    """Backward computes the sink side of a minimum cut that prices each saved value by its bytes."""
    must_compute_once = _banned(view)
    # computed once (compared bit for bit, or not recomputable), so saved: and so are the parts of
    # such a node's tuple (a checkpointed flash attention's output and logsumexp)
    parts = {u for n in must_compute_once for u in n.users if u.target is operator.getitem}
    view.always_recomputed -= must_compute_once | parts
    g = nx.DiGraph()
    for n in view.needed:
        if n.op in ("get_attr", "output"):
            continue
        if n in view.tangent_dependent:
            g.add_edge(("in", n), "sink")
        else:
            g.add_edge(("in", n), ("out", n), **_capacity(n, view))
        if n in view.primals or n in must_compute_once:
            g.add_edge("source", ("in", n))
        for a in n.all_input_nodes:
            if a.op != "get_attr":
                g.add_edge(("out", a) if a not in view.tangent_dependent else ("in", a), ("in", n))
    if "source" not in g or "sink" not in g:
        return save_all(view)
    _, (_, sink_side) = nx.minimum_cut(g, "source", "sink")
    recomputed = {n for n in view.needed - view.tangent_dependent if ("in", n) in sink_side}
    return (view.needed & view.tangent_dependent) | recomputed


def _capacity(node: torch.fx.Node, view: JointView) -> dict:
    """Saving a tensor costs its bytes, a symbolic number (a size: ``sym_size``, SymInt arithmetic)
    8, an input nothing (the caller holds it anyway); a node that is not one tensor or number (a
    tuple), or that a checkpoint region recomputes, cannot be saved. Where a checkpoint's policy
    keeps values, a cut of the same bytes that saves them is preferred (its value, not a view of it
    or what the backward makes of it: the value eager's checkpoint keeps)."""
    if (not isinstance(node.meta.get("val"), (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))
            or node in view.always_recomputed):
        return {}
    if node in view.primals:
        return {"capacity": 0}
    return {"capacity": 2 * nbytes(node) + (node not in view.kept) if view.kept else nbytes(node)}


# Comparisons whose answer depends on every bit of both operands.
EXACT_COMPARISONS = frozenset({torch.ops.aten.eq.Tensor, torch.ops.aten.ne.Tensor})


def _banned(view: JointView) -> set:
    """Forward nodes that must not be recomputed: expensive or random ops, externs, nodes that
    would end a recompute chain longer than MAX_RECOMPUTE_DEPTH, and values compared bit for bit
    with another tensor (amin's gradient marks ``x == amin(x)``): recomputed by another kernel,
    a transcendental can round another way (glibc's vector and scalar log1p differ in the last
    bit), and the tie mask then lost elements (training-fuzz seed 732317: gradient 0, not 0.38)."""
    banned, depth = set(), {}
    for n in view.nodes:
        if n.op == "call_function" and n.target in EXACT_COMPARISONS and len(n.all_input_nodes) == 2:
            banned.update(a for a in n.all_input_nodes if a.op == "call_function" and a not in view.tangent_dependent)
    for n in view.nodes:
        if n.op != "call_function" or n in view.tangent_dependent or n in view.always_recomputed:
            depth[n] = 0    # a checkpointed value is recomputed whatever it costs
            continue
        if n in view.kept:  # a checkpoint's policy saves it: computed once
            banned.add(n)
            depth[n] = 0
            continue
        cheap = n.target in RECOMPUTABLE and not (isinstance(n.target, torch._ops.OpOverload)
                                                  and torch.Tag.nondeterministic_seeded in n.target.tags)
        d = 1 + max((depth.get(a, 0) for a in n.all_input_nodes), default=0)
        if not cheap or d > MAX_RECOMPUTE_DEPTH:
            banned.add(n)
            d = 0
        depth[n] = d
    return banned


CHOOSERS = {"min_cut": min_cut, "save_all": save_all}
