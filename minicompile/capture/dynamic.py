"""Automatic dynamic shapes in our front end, as Dynamo's ``automatic_dynamic_shapes``.

The first trace of a frame is static. Every trace records the sizes of its tensor inputs
(``FrameSizes``, one per code object and offset); a dimension whose size differs from an
earlier trace's becomes *symbolic* in the traces after it (sizes 0 and 1 stay specialised,
parameters stay static). A symbolic input is a fake tensor with symbols for those sizes on the
trace's ShapeEnv; ops propagate the symbols, a size read in Python is a ``SymInt``, a branch
on it records a guard in the ShapeEnv, and a SymInt passed to an op becomes ``sym_size`` /
``operator`` nodes in the graph. The entry's size guards are the ShapeEnv's own
(``produce_guards_expression``: static sizes, strides, ranges, relations like ``s0 == s1``),
produced after the backend compiled, so what the pipeline relied on is guarded too.

Where the symbolic trace cannot be used (a size reaching Python code we do not model: a
returned size, a graph break holding one, any error), the frame is traced static again and
from then on specialises per size, with the reason in ``report.dynamic``.
"""
from __future__ import annotations

import logging
import operator
import re
from dataclasses import dataclass

import sympy
import torch
from torch._dynamo.source import ConstantSource, LocalSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod

log = logging.getLogger("minicompile.capture")

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_CONCRETE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
# sympy heads a SymInt expression may have, and the Python operator that folds its arguments.
_FOLD = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv,
         Mod: operator.mod, PythonMod: operator.mod}

# ... and the calls that compute the rest in a graph (torch.sym_max: no guard on which is larger).
_GRAPH_CALLS = {sympy.Max: torch.sym_max, Max: torch.sym_max, sympy.Min: torch.sym_min, Min: torch.sym_min,
                sympy.Abs: operator.abs}


class SymbolicUnsupported(Exception):
    """This symbolic trace cannot become an entry: trace the frame static instead."""


@dataclass
class DynamicRecord:
    code_name: str
    offset: int
    what: str             # "dynamic" (a dimension became symbolic) or "static" (symbolic gave up)
    detail: str

    def __str__(self):
        return f"{self.code_name}@{self.offset}: {self.what}: {self.detail}"


class FrameSizes:
    """The tensor sizes the traces of one frame (code object, offset) saw, per source; ``None``
    marks a dimension that changed between two traces (symbolic from then on)."""

    def __init__(self, code_name: str, offset: int, report, mode: bool | None = None):
        self.code_name, self.offset, self.report = code_name, offset, report
        self.mode = mode              # compile(dynamic=...): None automatic, True all sizes, False none
        self.sizes: dict[str, list] = {}
        self.pinned: set[tuple[str, int]] = set()   # dimensions a symbolic trace specialised
        self.ints: dict[str, int | None] = {}        # ints in the frame at a resume point (.item()'s)
        self.static_reason: str | None = None if mode is not False else "compile(dynamic=False)"

    def wants_symbolic(self, L: tuple = ()) -> bool:
        """Trace on a ShapeEnv: a recompile (a size may have changed), ``dynamic=True``, or an
        argument with ``mark_dynamic`` dimensions; unless this frame gave up on symbols."""
        return self.static_reason is None and (bool(self.sizes) or bool(self.ints) or self.mode is True or any(
            hasattr(v, "_dynamo_dynamic_indices") for v in L if isinstance(v, torch.Tensor)))

    def dynamic_dims(self, source: str, t: torch.Tensor) -> tuple:
        """Record ``t``'s sizes; the dimensions this trace makes symbolic."""
        seen = self.sizes.get(source)
        if seen is None or len(seen) != t.dim():
            seen = self.sizes[source] = list(t.shape)
        marked = set(getattr(t, "_dynamo_dynamic_indices", ())) | (set(range(t.dim())) if self.mode else set())
        for d, n in enumerate(t.shape):
            if d in marked:
                seen[d] = None
            if seen[d] is not None and seen[d] != n and (source, d) not in self.pinned:
                seen[d] = None
                self._note("dynamic", f"{source}.shape[{d}] changed ({n}): symbolic from now on")
        if self.static_reason is not None or isinstance(t, torch.nn.Parameter) or not t.is_contiguous():
            return ()
        return tuple(d for d, n in enumerate(t.shape) if seen[d] is None and n >= 2 and (source, d) not in self.pinned)

    def dynamic_int(self, source: str, value: int) -> bool:
        """Record an int in the frame at a resume point; True where it changed since an earlier
        trace (a symbolic int input from then on, as Dynamo's automatic dynamic makes it)."""
        seen = self.ints.setdefault(source, value)
        if seen is not None and seen != value and (source, None) not in self.pinned:
            self.ints[source] = None
            self._note("dynamic", f"int {source} changed ({value}): symbolic from now on")
        return self.ints[source] is None and self.static_reason is None and (source, None) not in self.pinned

    def give_up(self, reason: str) -> None:
        self.static_reason = reason
        self._note("static", f"symbolic sizes not used, specialising per size: {reason}")

    def pin(self, source: str, d: int | None, why: str) -> None:
        """Keep dimension ``d`` of ``source`` (the int at ``source`` for ``d=None``) static."""
        self.pinned.add((source, d))
        self._note("static", f"{source if d is None else f'{source}.shape[{d}]'} specialised: {why}")

    def _note(self, what: str, detail: str) -> None:
        self.report.dynamic.append(DynamicRecord(self.code_name, self.offset, what, detail))
        log.info("%s@%d: %s", self.code_name, self.offset, detail)


def shape_env_mode(fake_mode_cls):
    """The fake mode of a symbolic trace: no duck sizing (equal sizes are not assumed equal
    symbols; a relation the trace uses is a guard instead), and data-dependent output sizes
    (``nonzero``) still refused, a graph break as in a static trace."""
    env = ShapeEnv(duck_shape=False, allow_dynamic_output_shape_ops=False, allow_scalar_outputs=False)
    return fake_mode_cls(allow_non_fake_inputs=False, shape_env=env)


def symbolic_fake(fake_mode, t: torch.Tensor, dims: tuple):
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
                                                  for d in range(t.dim())])
    return fake_mode.from_tensor(t, symbolic_context=ctx)


def symbolic_int(fake_mode, value: int, source: str) -> torch.SymInt:
    """An int input of a symbolic trace: a backed symbol with ``value`` as its hint."""
    return fake_mode.shape_env.create_unspecified_symint_and_symbol(value, ConstantSource(source), DimDynamic.DYNAMIC)


def concrete(v):
    """A Python value for ``v``: a SymInt read as an int (the ShapeEnv guards its value)."""
    if isinstance(v, SYM_TYPES):
        return _CONCRETE[type(v)](v)
    if isinstance(v, (tuple, list)) and type(v) in (tuple, list, torch.Size):
        return type(v)([concrete(x) for x in v])   # a torch.Size stays one: str() shows it
    return v


class SymNodes:
    """SymInts as graph values: each symbol is a ``sym_size`` of the input it came from, or an
    int input (its placeholder made when the graph first uses it); and as Python text over
    ``L`` (``L[0].shape[1]``, ``L[3]``) where generated code hands one back to Python."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph
        self.origin: dict = {}      # sympy symbol -> (placeholder node, dim), or a callable making an int input
        self.nodes: dict = {}       # sympy expression -> fx node
        self.texts: dict = {}       # sympy symbol -> its Python text over L

    def add_input(self, node: torch.fx.Node, fake: torch.Tensor, source: str) -> None:
        for d, s in enumerate(fake.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                self.origin.setdefault(s.node.expr, (node, d, s))
                self.texts.setdefault(s.node.expr, f"{source}.shape[{d}]")

    def add_int(self, sym: torch.SymInt, source: str, make_placeholder) -> None:
        self.origin[sym.node.expr] = make_placeholder
        self.texts[sym.node.expr] = source

    def reads_int_input(self, v) -> bool:
        """``v`` (a SymInt/SymBool) depends on an int input (an ``.item()`` int made symbolic)."""
        return isinstance(v, SYM_TYPES) and any(callable(self.origin.get(s)) for s in v.node.expr.free_symbols)

    def text(self, v) -> str | None:
        """Python source computing the SymInt or SymBool ``v`` from ``L``; None where it has
        other terms (a SymFloat: always None)."""
        if isinstance(v, torch.SymFloat):
            return None
        return _text(v.node.shape_env.replace(v.node.expr), self.texts)

    def node_of(self, v):
        """An FX argument computing ``v`` from the inputs' sizes (an int where it is one)."""
        if not isinstance(v, torch.SymInt):
            return concrete(v)
        shape_env = v.node.shape_env
        expr = shape_env.replace(v.node.expr)
        built = self._build(expr)
        return concrete(v) if built is None else built

    def _build(self, expr):
        if expr.is_Integer:
            return int(expr)
        if expr in self.nodes:
            return self.nodes[expr]
        if isinstance(expr, sympy.Symbol):
            if expr not in self.origin:
                return None
            if callable(self.origin[expr]):   # an int input
                out = self.origin[expr]()
            else:
                node, d, sym = self.origin[expr]
                out = self.graph.call_function(torch.ops.aten.sym_size.int, (node, d))
                out.meta["example_value"] = sym
        else:
            fold = _FOLD.get(type(expr)) or _GRAPH_CALLS.get(type(expr))
            parts = [self._build(a) for a in expr.args] if fold else [None]
            if any(p is None for p in parts):
                return None
            out = parts[0] if len(parts) > 1 else self.graph.call_function(fold, (parts[0],))
            for p in parts[1:]:
                out = self.graph.call_function(fold, (out, p))
        self.nodes[expr] = out
        return out


_COMPARE_TEXT = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_CALLS = {sympy.Abs: "abs", sympy.Max: "max", sympy.Min: "min", Max: "max", Min: "min"}


def _text(expr, texts: dict) -> str | None:
    if expr.is_Integer:
        return str(int(expr))
    if expr in (sympy.true, sympy.false):
        return str(bool(expr))
    if isinstance(expr, sympy.core.relational.Relational) and expr.rel_op in _COMPARE_TEXT:
        lhs, rhs = _text(expr.lhs, texts), _text(expr.rhs, texts)
        return None if lhs is None or rhs is None else f"({lhs} {_COMPARE_TEXT[expr.rel_op]} {rhs})"
    if isinstance(expr, sympy.Symbol):
        return texts.get(expr)
    fold, call = _FOLD.get(type(expr)), _CALLS.get(type(expr))
    parts = [_text(a, texts) for a in expr.args] if fold or call else [None]
    if any(p is None for p in parts):
        return None
    if call:
        return f"{call}({', '.join(parts)})"
    op = {operator.add: " + ", operator.mul: " * ", operator.floordiv: " // ", operator.mod: " % "}[fold]
    return "(" + op.join(parts) + ")"


def produce_guards(fakes: list, sources: list) -> list[str]:
    """The ShapeEnv's guards over the symbolic inputs (tensors and ints), as Python
    expressions over ``L``, one per guard so a failure names the one that failed."""
    syms = [s for f in fakes for s in (f.shape if isinstance(f, torch.Tensor) else (f,)) if isinstance(s, torch.SymInt)]
    if not syms:
        return []
    local = [f"t{i}" for i in range(len(fakes))]
    guards = syms[0].node.shape_env.produce_guards(fakes, [LocalSource(n) for n in local],
                                                   ignore_static=False)
    # sources are subscript/attribute chains (``L[3]``, ``L[0].x``): no parentheses needed
    return [re.sub(r"L\['t(\d+)'\]", lambda m: sources[int(m.group(1))], g) for g in guards]


def specialised(fake) -> list:
    """The dimensions of a symbolic input whose symbol the trace pinned to one value (``None``
    for an int input)."""
    if isinstance(fake, torch.SymInt):
        expr = fake.node.shape_env.replace(fake.node.expr)
        return [(None, int(expr))] if expr.is_number else []
    out = []
    for d, s in enumerate(fake.shape):
        if isinstance(s, torch.SymInt) and s.node.shape_env.replace(s.node.expr).is_number:
            out.append((d, int(s.node.shape_env.replace(s.node.expr))))
    return out
