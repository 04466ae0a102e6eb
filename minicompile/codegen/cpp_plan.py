"""The C++ kernel plan: where each value of a kernel is computed, decided before C++ is spelled.

LevelOps, an ``ops`` handler (ir/ops.py), runs the kernel's bodies in the stage walk the emitter
will follow, over levels instead of text. A value's level: ``kernel``, once before the loops (a
load at a fixed index of a buffer the kernel does not write, and what is computed from such
loads and literals: AdamW's bias corrections; g++ cannot hoist them, as any store may alias the
load); ``channel``, an array per index of one loop variable (cpp_channels.py); ``row``, once per
outer point before a loop (a read-only load whose index misses the loop's variables: left in
the loop, it keeps g++ from vectorising it); ``element``, where used. Two spellings are chosen
too: a division by a value known before the loop as a multiplication by its reciprocal, and
inline sin/cos with a redo of the row through the library when an argument is out of range.
The plan keeps per node one Planned per ops call, in call order; CppOps (codegen/cpp.py) takes
them in that order and only spells. ``str(plan)`` is printed with the schedule.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from minicompile.codegen.common import KernelRenderer
from minicompile.codegen.cpp_channels import channel_sizes
from minicompile.codegen.cpp_columns import column_var
from minicompile.codegen.cpp_ops import literal
from minicompile.codegen.cpp_pieces import piece_edges, piece_runs
from minicompile.ir.expr import Expr, Var, atoms_of
from minicompile.ir.nodes import Reduction
from minicompile.ir.ops import compute_dtype, indirect_atoms

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_HALF = (torch.bfloat16, torch.float16)


@dataclass(eq=False)
class Planned:
    """One ops call's result. level: kernel, channel (of loop variable ``var``), row, element; or
    same (the call returns its operand), known (kept in registers), literal. form: "",
    reciprocal, inline trig. ``key`` names the value as its C++ text would (a literal by its
    text: two equal literals are one value)."""
    what: str
    level: str
    var: object = None
    form: str = ""
    dtype: torch.dtype | None = None
    key: object = None

    def __str__(self):
        return f"{self.what} as {self.form}" if self.form else f"{self.what} at {self.level} {getattr(self.var, 'name', '')}"


@dataclass
class KernelPlan:
    """The plan of one C++ kernel: its loop form and, per node, its Planned ops calls."""
    form: str                  # "columns over x1" | "one row on threads" | "loops"
    hoist: bool                # kernel-level values allowed (no empty loop)
    channels: dict             # loop variable -> range, for each that may have per-channel arrays
    trig: bool                 # inline sin/cos allowed (a pointwise map, no in-place write)
    column: object = None      # the column form's variable (cpp_columns.py), or None
    calls: dict = field(default_factory=dict)   # node name -> [Planned], in call order
    symbols: set = field(default_factory=set)   # the size symbols it names (FusedKernel.named_symbols)
    cut: object = None         # the loop variable cut at a concatenation's pieces (cpp_pieces.py), or None
    pieces: list = field(default_factory=list)  # per range of ``cut``: (the variable over it, its calls)
    runs: list = field(default_factory=list)    # (first piece, last + 1, buffer per piece): one loop over a pointer table

    @property
    def inline_trig(self) -> bool:
        return any(p.form == "inline trig" for ps in self.calls.values() for p in ps)

    def __str__(self) -> str:
        form = self.form + (", inline sin/cos with a row redo" if self.inline_trig else "")
        if self.cut is not None:
            form += f", {self.cut.name} cut in {len(self.pieces)} pieces at {', '.join(str(v.start) for v, _ in self.pieces[1:])}"
            form += "".join(f" (pieces {a}-{b - 1} over a pointer table)" for a, b, _ in self.runs)
        lines = [f"plan: {form}"]
        for name, ps in self.calls.items():
            shown = [str(p).rstrip() for p in ps if p.level in ("kernel", "channel", "row") or p.form]
            lines += [f"{name}: {', '.join(dict.fromkeys(shown))}"] if shown else []
        return "\n".join(lines)


class LevelOps:
    """Runs bodies over levels, one per stage as CppOps. ``known``: values kept in registers; in
    a loop stage, ``loop_vars`` its variables and ``invariant`` the values known before it."""

    def __init__(self, plan: KernelPlan, ck, known: dict, loop_vars=None, invariant=(), loads=None):
        self.plan, self.ck, self.known, self.loop_vars = plan, ck, known, loop_vars
        self.loads = loads if loads is not None else []   # (buffer, index, level) of every load in memory
        self.invariant = {v.key for v in invariant}
        self.constants, self.literals, self.exact = set(), set(), {}
        self.steps: list = []
        self.keys = itertools.count()

    def _new(self, dtype, level, var=None, *, what, form="", key=None) -> Planned:
        self.steps.append(value := Planned(what, level, var, form, dtype, key or ("v", next(self.keys))))
        return value

    def _where(self, *args) -> tuple:
        """A value from values of one channel and kernel-level ones and literals is per channel;
        from kernel-level ones and literals (at least one of the first), kernel-level."""
        outside = all(a.level in ("channel", "kernel") or a.key in self.literals for a in args)
        found = {a.var for a in args if a.level == "channel"}
        if outside and len(found) == 1:
            return "channel", found.pop()
        kernel = self.plan.hoist and outside and not found and any(a.level == "kernel" for a in args)
        return ("kernel" if kernel else "element"), None

    def _same_every_iteration(self, result: Planned, *args) -> Planned:
        if all(a.key in self.invariant for a in args):
            self.invariant.add(result.key)
            if all(a.key in self.constants for a in args):
                self.constants.add(result.key)
        return result

    def _checks(self, index) -> list:
        """Each index read from memory in ``index`` (expr.Indirect): read, then checked, where it was read (as
        cpp_ops.checked_index); a per-row one this kernel stored before the loop is read before the loop too."""
        checks = []
        for a in indirect_atoms(index):   # known: in registers
            known, level = a.buffer in self.known, self.load(a.buffer, a.index, a.dtype, stored_per_row=True).level
            checks.append(self._new(torch.int64, level if level in ("kernel", "row") and not known else "element", what="check"))
        return checks

    def load(self, name, index, dtype, stored_per_row=False):
        checks = self._checks(index)
        in_loop = any(c.level == "element" for c in checks)
        if name in self.known:
            self.steps.append(Planned(f"load {name}", "known"))
            return self.known[name]
        what, ct = f"load {name}", compute_dtype(dtype)
        if name in self.ck.k.scratch:
            self.loads.append((name, index, "element"))
            return self._new(ct, "element", what=what)
        ptr = self.ck.pointer(name)
        read_only, atoms = ptr in self.ck.read_only, atoms_of(index)
        if self.plan.hoist and read_only and not atoms and not in_loop and all(c.level == "kernel" for c in checks):
            value = self._new(ct, "kernel", what=what)
        elif dtype in _FLOATS and read_only and not checks and len(atoms) == 1 and next(iter(atoms)) in self.plan.channels:
            # read where used, named by its text: two such loads are one value
            value = self._new(ct, "channel", next(iter(atoms)), what=what, key=("raw", ptr, index))
        elif self.loop_vars is not None and (read_only or stored_per_row and self.ck.k.level.get(name) == "outer") \
                and not atoms & self.loop_vars and not in_loop:
            value = self._new(ct, "row", what=what)
        else:
            value = self._new(ct, "element", what=what)
        self.loads.append((name, index, value.level))
        return self._exact(value, dtype)

    def _exact(self, value: Planned, dtype) -> Planned:
        if dtype in _HALF:
            self.exact[value.key] = dtype
        return value

    def constant(self, value, dtype):
        v = self._new(compute_dtype(dtype), "literal", what="constant", key=literal(value, compute_dtype(dtype)))
        for known_as in (self.invariant, self.constants, self.literals):
            known_as.add(v.key)
        return v

    def index_expr(self, expr, dtype):
        self._checks(expr)
        self.loads.append((None, expr, "element"))   # compared as a load is (cpp_pieces.piece_runs)
        return self._new(dtype, "element", what="index")

    def to_dtype(self, x, dtype):
        level, var = self._where(x)
        what = f"to {str(dtype).replace('torch.', '')}"
        if (dtype in _HALF and self.exact.get(x.key) == dtype) or (dtype not in _HALF and x.dtype == dtype):
            self.steps.append(Planned(what, "same"))
            return x
        if dtype in _HALF:
            return self._exact(self._new(torch.float32, level, var, what=what), dtype)
        return self._same_every_iteration(self._new(dtype, level, var, what=what), x)

    def pointwise(self, op, *args, dtype):
        ct = compute_dtype(dtype)
        level, var = self._where(*args)
        if level == "kernel":
            return self._same_every_iteration(self._new(ct, level, what=op), *args)
        if level == "channel":
            return self._new(ct, level, var, what=op)
        # (not for a compile-time constant: x * (1/3) is not x / 3, and eager divides there)
        if (op == "truediv" and args[1].key in self.invariant and args[1].key not in self.constants
                and ct.is_floating_point):
            return self._new(ct, "element", what=op, form="reciprocal")
        if op in ("sin", "cos") and self.plan.trig and ct == torch.float32:
            return self._same_every_iteration(self._new(ct, "element", what=op, form="inline trig"), *args)
        return self._same_every_iteration(self._new(ct, "element", what=op), *args)


def plan_kernel(ck) -> KernelPlan:
    """Walk ``ck``'s (a CppKernel's) stages as it will render them, over levels.

    Kernel-level values need a loop that runs (in an empty one, a load at a fixed index may be of
    an empty buffer); per-channel arrays, static sizes (cpp_channels.py); inline sin/cos, a
    pointwise map that writes no buffer it reads, as the row's redo rewrites every element."""
    k, column = ck.k, column_var(ck)
    form = (f"columns over {column.name}" if column is not None else
            "one row on threads" if ck.inner_parallel else "loops")
    hoist = 0 not in (*k.outer_ranges, *k.inner_ranges)
    in_place = any(a.read and a.written for a in ck.args)
    plan = KernelPlan(form, hoist, channel_sizes(k) if ck.static and hoist else {},
                      bool(k.outer_ranges) and not k.is_reduction and not in_place, column)
    if k.outer_numel == 0:   # nothing to compute, nothing named
        plan.form = "empty"
        return plan
    plan.symbols = k.named_symbols()
    cut = _piece_cut(plan, ck, [index for _, index, _ in _walk(plan, ck, plan.calls)])
    if cut is not None:
        plan.cut, ranges = cut
        loads = []
        for lo, hi in ranges:   # each range planned on its own: the concatenation reads one piece there
            piece = Var(plan.cut.name, hi, lo)
            if plan.cut in plan.channels:
                plan.channels[piece] = plan.channels[plan.cut]
            ck.narrow = {plan.cut: Expr.of(piece)}
            plan.pieces.append((piece, {}))
            loads.append(_walk(plan, ck, plan.pieces[-1][1]))
        ck.narrow = {}
        if plan.cut == ck.k.outer_vars[-1]:
            plan.runs = piece_runs(plan, ck, loads)
    return plan


def _walk(plan: KernelPlan, ck, calls: dict) -> list:
    """The stages, over levels, into ``calls``; (buffer, index, level) of every load in memory, and
    (None, expression, "element") of every index value."""
    column, known, loads = plan.column, {}, []
    for i, stage in enumerate(ck.k.stages):
        if column is not None and i == 0:
            _loop(plan, ck, calls, stage, known, {}, {column}, (), loads)
        elif stage.kind == "scalar":
            ops = LevelOps(plan, ck, known, loads=loads)
            for n in stage.nodes:
                _keep(ck, n, _evaluate(calls, ck, ops, n), known)
        else:
            _loop(plan, ck, calls, stage, known, dict(known), set(ck.k.inner_vars), known.values(), loads)
    return loads


def _piece_cut(plan: KernelPlan, ck, indices: list):
    """(variable, ranges) of the loop a pointwise map cuts where a concatenation it reads changes
    piece (cpp_pieces.py): the innermost with such edges, else an outer one; None for none, a flat
    loop, a reduction, rows kept in arrays, inline sin/cos."""
    k = ck.k
    if plan.form != "loops" or k.is_reduction or k.scratch or plan.inline_trig or len(k.outer_ranges) < 2:
        return None
    for var, size in reversed(list(zip(k.outer_vars, k.outer_ranges))):
        edges = piece_edges(indices, var, size) if isinstance(size, int) else []
        if edges:
            return var, list(zip([0, *edges], [*edges, size]))
    return None


def _loop(plan, ck, calls: dict, stage, known: dict, loop_known: dict, loop_vars: set, invariant, loads) -> None:
    """A loop stage: its values; each local reduction's result is a value per outer point after it."""
    ops = LevelOps(plan, ck, loop_known, loop_vars, invariant, loads)
    for n in stage.nodes:
        value = _evaluate(calls, ck, ops, n)
        if not isinstance(n.data, Reduction):
            _keep(ck, n, value, loop_known)
        elif n.name in ck.k.local:
            known[n.name] = Planned("result", "row", dtype=compute_dtype(n.dtype), key=("result", n.name))


def _keep(ck, n, value, known: dict) -> None:
    if n.name in ck.k.local or n.name in ck.k.scratch:
        known[n.name] = value


def _evaluate(calls: dict, ck, ops: LevelOps, n):
    ops.steps = calls.setdefault(n.name, [])
    return KernelRenderer.evaluate(ck, ops, n)   # (CppKernel.evaluate spells the plan)
