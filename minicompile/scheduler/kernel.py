"""FusedKernel: a group of buffers computed by one loop nest, and how its loops are laid out.

A kernel iterates an *outer* space (one point per output row; for a pointwise kernel, one
point per element) and, when it reduces, an *inner* space per row. Every member buffer's own
index is expressed in the kernel's loop variables through the flattened element number:
``var_k = (flat // stride_k) % size_k``, which the index simplifier turns back into linear
arithmetic whenever the members' shapes refine each other.

Stages run in order inside each outer point: a "scalar" stage computes per-row values
(pointwise members over the outer space), a "loop" stage runs one inner loop that computes
inner-space pointwise members and accumulates reductions.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from minicompile.ir.expr import Expr, FloorDiv, Mod, Var, flat_index, size_value, symbols_of
from minicompile.ir.nodes import Buffer, ComputedBuffer, Reduction, is_static, prod
from minicompile.ir.ops import RecordOps


class CannotFuse(Exception):
    pass


def suffix_products(sizes) -> set:
    out, acc = set(), 1
    for s in reversed([int(s) for s in sizes if int(s) != 1]):
        acc *= s
        out.add(acc)
    return out


def chain(boundaries: set, total: int) -> list:
    """Sorted boundaries 1 = b0 < b1 < ... < total if each divides the next, else raise."""
    pts = sorted({1, total} | {b for b in boundaries if 1 < b < total}) if total > 1 else [1]
    for a, b in zip(pts, pts[1:]):
        if b % a:
            raise CannotFuse(f"iteration spaces do not refine each other (split points {pts})")
    return pts


def ranges_from_chain(pts) -> tuple:
    return tuple(b // a for a, b in reversed(list(zip(pts, pts[1:]))))


def flat_of(variables, sizes) -> Expr:
    strides, acc = [], 1
    for s in reversed(list(sizes)[:len(variables)]):
        strides.append(acc)
        acc *= s
    return flat_index(variables, strides[::-1])


def unflatten(flat: Expr, sizes) -> list:
    if any(int(s) == 0 for s in sizes):
        return [Expr.of(0) for _ in sizes]  # an empty space: the loop never runs, any index will do
    out, acc = [], 1
    for s in reversed([int(s) for s in sizes]):
        out.append(Expr.of(0) if s <= 1 else (flat // acc) % s)  # size 0: the loop never runs
        acc *= max(s, 1)
    return list(reversed(out))


# The bodies recorded while one schedule() runs (shared_recordings), by node and loops: the
# fusion trials build kernel after kernel over the same nodes and loops, and recording a body
# (building its index expressions) was most of the scheduler's time.
_BODIES: contextvars.ContextVar = contextvars.ContextVar("minicompile_bodies", default=None)


@contextlib.contextmanager
def shared_recordings():
    token = _BODIES.set({})
    try:
        yield
    finally:
        _BODIES.reset(token)


@dataclass
class Stage:
    kind: str   # "scalar" | "loop"
    nodes: list


@dataclass(eq=False)
class FusedKernel:
    name: str
    nodes: list                    # ComputedBuffers in execution order
    outer_ranges: tuple
    inner_ranges: tuple
    stages: list = field(default_factory=list)
    local: set = field(default_factory=set)      # buffer names kept in registers, never stored
    scratch: set = field(default_factory=set)    # per-row values kept in a row-sized scratch array
    level: dict = field(default_factory=dict)    # name -> "outer" | "inner" | "reduction"
    direct: bool = False                         # members index with the loop variables (symbolic sizes)
    values: object = None                        # the backend's plan of its values (BackendCaps.plan)

    def __post_init__(self):
        self.outer_vars = [Var(f"x{k}", s) for k, s in enumerate(self.outer_ranges)]
        self.inner_vars = [Var(f"r{k}", s) for k, s in enumerate(self.inner_ranges)]
        self._reads: dict = {}   # (node name, direct, level) -> its body's RecordOps

    @property
    def is_reduction(self) -> bool:
        return any(isinstance(n.data, Reduction) for n in self.nodes)

    @property
    def outer_numel(self) -> int:
        return prod(self.outer_ranges)

    @property
    def inner_numel(self) -> int:
        return prod(self.inner_ranges)

    def node_index(self, node: ComputedBuffer):
        """(index, rindex) of ``node``'s own loop variables, in this kernel's variables."""
        if self.direct:
            return _direct_index(self, node)
        outer = flat_of(self.outer_vars, self.outer_ranges)
        inner = flat_of(self.inner_vars, self.inner_ranges)
        if isinstance(node.data, Reduction):
            return unflatten(outer, node.data.ranges), unflatten(inner, node.data.reduction_ranges)
        if self.level.get(node.name) == "inner":
            return unflatten(outer * self.inner_numel + inner, node.data.ranges), []
        return unflatten(outer, node.data.ranges), []

    def store_index(self, node: ComputedBuffer) -> Expr:
        index, _ = self.node_index(node)
        return node.store_index(index)

    def in_memory(self, name: str) -> bool:
        """Whether the kernel reads or writes ``name`` in memory (not in registers or a row)."""
        return name not in self.local and name not in self.scratch

    def reads(self, node: ComputedBuffer) -> list:
        """What ``node``'s body reads, at which index (computed once per kernel, node and level:
        planning and code generation ask again and again, and each time ran the whole body)."""
        return self._recorded(node).reads

    def _recorded(self, node: ComputedBuffer) -> RecordOps:
        key = (node.name, self.direct, self.level.get(node.name))
        rec = self._reads.get(key)
        if rec is None:
            shared, same_loops = _BODIES.get(), (node, *key[1:], self.outer_ranges, self.inner_ranges)
            rec = shared.get(same_loops) if shared is not None else None
            if rec is None:
                rec, (index, rindex) = RecordOps(), self.node_index(node)
                if isinstance(node.data, Reduction):
                    node.data.body(rec, index, rindex)
                else:
                    node.data.body(rec, index)
            if shared is not None:
                shared[same_loops] = rec
            self._reads[key] = rec
        return rec

    def named_symbols(self) -> set:
        """The size symbols the kernel's code names, which it takes as arguments (either backend):
        those of its loops, of the indices it stores at and loads from memory at (a value kept
        in registers or a row is read without an index) and of the index expressions it computes."""
        exprs = [*self.outer_ranges, *self.inner_ranges]
        for n in self.nodes:
            exprs += [self.store_index(n)] if self.in_memory(n.name) else []
            exprs += [r.index for r in self.reads(n) if self.in_memory(r.name)] + self._recorded(n).exprs
        return set().union(*map(symbols_of, exprs))

    def checks_indices(self) -> bool:
        """Whether the kernel checks an index read from memory (expr.Indirect)."""
        return any(self._recorded(n).checks_indices() for n in self.nodes)

    def all_indices(self) -> list:
        out = []
        for n in self.nodes:
            out.append(self.store_index(n))
            out.extend(r.index for r in self.reads(n))
        return out


@dataclass(frozen=True)
class KernelArg:
    """One buffer a kernel reads or writes in memory (not one kept in registers or a row)."""
    name: str        # the argument: the buffer's storage name (a mutated input's, for in-place writes)
    buffer: Buffer   # the first buffer seen under that name: its dtype and shape describe the argument
    read: bool
    written: bool

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.dtype

    def describe(self) -> str:
        """``in: float32[64, 1000]``, the comment beside the argument in either language."""
        role = "in/out" if self.read and self.written else "out" if self.written else "in"
        return f"{role}: {str(self.dtype).replace('torch.', '')}{list(self.buffer.layout.size)}"


def kernel_args(kernel, buffers: dict, storage: dict) -> list[KernelArg]:
    """Every buffer ``kernel`` touches in memory, in first-use order (the call order)."""
    seen: dict = {}  # argument name -> [buffer, read, written]
    for n in kernel.nodes:
        for r in kernel.reads(n):
            if kernel.in_memory(r.name):
                seen.setdefault(storage.get(r.name, r.name), [buffers[r.name], False, False])[1] = True
        if kernel.in_memory(n.name):
            seen.setdefault(storage.get(n.name, n.name), [n, False, False])[2] = True
    return [KernelArg(name, b, read, written) for name, (b, read, written) in seen.items()]


def nonlinear_count(exprs) -> int:
    def count(e: Expr) -> int:
        c = 0
        for a, _ in e.terms:
            if isinstance(a, (FloorDiv, Mod)):
                c += 1 + count(a.arg)
        return c
    return sum(count(e) for e in exprs)


def plan_kernel(name: str, nodes: list) -> FusedKernel:
    """Lay out loops for ``nodes`` (in execution order) or raise CannotFuse saying why."""
    reductions = [n for n in nodes if isinstance(n.data, Reduction)]
    if not all(is_static(n.data.ranges) and is_static(n.data.reduction_ranges) for n in nodes):
        return _plan_symbolic(name, nodes, reductions)
    if reductions:
        O, I = prod(reductions[0].data.ranges), prod(reductions[0].data.reduction_ranges)
        for r in reductions[1:]:
            if (prod(r.data.ranges), prod(r.data.reduction_ranges)) != (O, I):
                raise CannotFuse(f"reductions over different spaces: {O}x{I} vs "
                                 f"{prod(r.data.ranges)}x{prod(r.data.reduction_ranges)}")
    else:
        O, I = prod(nodes[0].data.ranges), 1
    level, outer_b, inner_b = {}, set(), set()
    for n in nodes:
        numel = prod(n.data.ranges)
        if isinstance(n.data, Reduction):
            level[n.name] = "reduction"
            outer_b |= suffix_products(n.data.ranges)
            inner_b |= suffix_products(n.data.reduction_ranges)
        elif numel == O:
            level[n.name] = "outer"
            outer_b |= suffix_products(n.data.ranges)
        elif numel == O * I:
            if I == 0:
                raise CannotFuse(f"{n.name} is empty and the reduction's inner space is empty: nothing to share")
            level[n.name] = "inner"
            sp = suffix_products(n.data.ranges)
            if I > 1 and O > 0:
                chain(sp | {I}, O * I)  # the row boundary must fall between the node's dims
            inner_b |= {b for b in sp if b < I}
            outer_b |= {b // I for b in sp if b > I}
        else:
            raise CannotFuse(f"{n.name} has {numel} elements; the kernel iterates {O} x {I}")
    outer = (0,) if O == 0 else _coalesce(ranges_from_chain(chain(outer_b, O)))
    inner = (0,) if I == 0 else _coalesce(ranges_from_chain(chain(inner_b, I))) if I > 1 else ()
    kernel = FusedKernel(name, list(nodes), outer, inner, level=level)
    return _merge_loops(kernel)


def _plan_symbolic(name: str, nodes: list, reductions: list) -> FusedKernel:
    """Symbolic sizes: the members iterate the kernel's ranges, or coarser ones (size-1 dims aside):
    a member dim that is the product of a run of the kernel's (``2*s0`` over ``2, s0``) is indexed
    by ``s0*x0 + x1``, a multiplication; finer member dims would need a division by a symbol."""
    first = reductions[0] if reductions else nodes[0]
    outer, inner = _squeezed(first.data.ranges), _squeezed(first.data.reduction_ranges)
    level = {}
    for n in nodes:
        own = (_squeezed(n.data.ranges), _squeezed(n.data.reduction_ranges))
        if isinstance(n.data, Reduction):
            if _groups(own[0], outer) is not None and _groups(own[1], inner) is not None:
                level[n.name] = "reduction"
        elif _groups(own[0], outer) is not None:
            level[n.name] = "outer"
        elif _splits_at(_groups(own[0], outer + inner), len(outer)):
            level[n.name] = "inner"
        if n.name not in level:
            raise CannotFuse(f"{n.name} iterates {list(n.data.ranges)}; the kernel {list(outer)} x {list(inner)} "
                             "(symbolic sizes fuse only over the same or coarser ranges)")
    return FusedKernel(name, list(nodes), outer, inner, level=level, direct=True)


def _squeezed(ranges) -> tuple:
    return tuple(r for r in ranges if r != 1)


def _groups(own: tuple, dims: tuple) -> list | None:
    """The runs ``(start, end)`` of ``dims`` whose products are ``own``'s sizes, in order, or None."""
    out, k = [], 0
    for size in own:
        start, p = k, 1
        while k < len(dims) and (k == start or p != size):
            p = size_value(Expr.of(p) * dims[k])
            k += 1
        if p != size:
            return None
        out.append((start, k))
    return out if k == len(dims) else None


def _splits_at(runs: list | None, k: int) -> bool:
    """No run crosses position ``k`` (an inner-level member: none of its dims spans the row boundary)."""
    return runs is not None and (k == 0 or any(end == k for _, end in runs))


def _direct_index(kernel: FusedKernel, node: ComputedBuffer):
    """A member's (index, rindex) in direct mode: each of its non-1 dims is a run of loop variables."""
    def fill(sizes, variables, dims):
        runs = iter(_groups(_squeezed(sizes), dims))
        out = []
        for s in sizes:
            index = Expr.of(0)
            if s != 1:
                start, end = next(runs)
                for v, d in zip(variables[start:end], dims[start:end]):
                    index = index * d + v
            out.append(index)
        return out
    outer, inner = tuple(kernel.outer_ranges), tuple(kernel.inner_ranges)
    if isinstance(node.data, Reduction):
        return (fill(node.data.ranges, kernel.outer_vars, outer),
                fill(node.data.reduction_ranges, kernel.inner_vars, inner))
    if kernel.level.get(node.name) == "inner":
        return fill(node.data.ranges, kernel.outer_vars + kernel.inner_vars, outer + inner), []
    return fill(node.data.ranges, kernel.outer_vars, outer), []


def _coalesce(ranges):
    return tuple(r for r in ranges if r != 1) or ((1,) if ranges else ())


def _merge_loops(kernel: FusedKernel) -> FusedKernel:
    """Merge adjacent loops whenever every index stays as linear as before. (Evaluating every
    body's indices is most of the scheduler's time: once per trial, not again for the kernel kept.)"""
    if len(kernel.outer_ranges) < 2 and len(kernel.inner_ranges) < 2:
        return kernel
    before = nonlinear_count(kernel.all_indices())
    for attr in ("outer_ranges", "inner_ranges"):
        k = 0
        while k + 1 < len(getattr(kernel, attr)):
            ranges = getattr(kernel, attr)
            trial = _with_ranges(kernel, attr, ranges[:k] + (ranges[k] * ranges[k + 1],) + ranges[k + 2:])
            after = nonlinear_count(trial.all_indices())
            if after <= before:
                kernel, before = trial, after
            else:
                k += 1
    return kernel


# The innermost loop is the vector loop: a split may not leave it shorter than this.
MIN_VECTOR_LOOP = 16


def split_loops(kernel: FusedKernel) -> FusedKernel:
    """Split a loop where the members' indices divide it: ``x2`` over 192 read as ``x2 // 96``,
    ``(x2 // 48) % 2`` and ``x2 % 48`` (a reshape of a permute: Swin's patch merging, attention's
    head merge) becomes three loops of 2, 2 and 48 whose indices are linear, so the innermost loop
    reads memory at unit stride instead of gathering through divisions. A split is kept only
    where it makes the indices more linear, and never leaves the vector loop shorter than
    ``MIN_VECTOR_LOOP``. The final kernel only: not each fusion trial."""
    if kernel.direct or not is_static(kernel.outer_ranges) or not is_static(kernel.inner_ranges):
        return kernel
    indices = kernel.all_indices()
    before = nonlinear_count(indices)
    if before == 0:
        return kernel
    vector = "outer_ranges" if not kernel.is_reduction else "inner_ranges"
    for attr in ("outer_ranges", "inner_ranges"):
        k = 0
        while k < len(getattr(kernel, attr)):
            ranges = getattr(kernel, attr)
            variables = kernel.outer_vars if attr == "outer_ranges" else kernel.inner_vars
            for d in _split_points(indices, variables[k], ranges[k]):
                if attr == vector and k == len(ranges) - 1 and d < MIN_VECTOR_LOOP:
                    continue
                trial = _with_ranges(kernel, attr, ranges[:k] + (ranges[k] // d, d) + ranges[k + 1:])
                trial_indices = trial.all_indices()
                after = nonlinear_count(trial_indices)
                if after < before:  # kept; the same position again: its outer part may split further
                    kernel, indices, before = trial, trial_indices, after
                    break
            else:
                k += 1
    return kernel


def _with_ranges(kernel: FusedKernel, attr: str, ranges: tuple) -> FusedKernel:
    """``kernel``'s members over other loops: ``ranges`` for its ``attr`` ("outer_ranges" or "inner_ranges")."""
    return FusedKernel(kernel.name, kernel.nodes, ranges if attr == "outer_ranges" else kernel.outer_ranges,
                       ranges if attr == "inner_ranges" else kernel.inner_ranges, level=kernel.level)


def _split_points(indices, var: Var, size: int) -> list:
    """Divisors ``d`` of ``size`` (1 < d < size) by which some index divides ``var``, largest first."""
    found = set()

    def visit(e: Expr):
        for a, _ in e.terms:
            if isinstance(a, (FloorDiv, Mod)):
                coef = dict(a.arg.terms).get(var)
                if coef and isinstance(a.divisor, int) and a.divisor % coef == 0:
                    found.add(a.divisor // coef)
                visit(a.arg)
    for e in indices:
        visit(e)
    return sorted((d for d in found if 1 < d < size and size % d == 0), reverse=True)
