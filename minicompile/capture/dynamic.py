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
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

log = logging.getLogger("minicompile.capture")

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_CONCRETE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
# sympy heads a SymInt expression may have, and the Python operator that folds its arguments.
_FOLD = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv,
         Mod: operator.mod, PythonMod: operator.mod}


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
        self.static_reason: str | None = None if mode is not False else "compile(dynamic=False)"

    def wants_symbolic(self, L: tuple = ()) -> bool:
        """Trace on a ShapeEnv: a recompile (a size may have changed), ``dynamic=True``, or an
        argument with ``mark_dynamic`` dimensions; unless this frame gave up on symbols."""
        return self.static_reason is None and (bool(self.sizes) or self.mode is True or any(
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

    def give_up(self, reason: str) -> None:
        self.static_reason = reason
        self._note("static", f"symbolic sizes not used, specialising per size: {reason}")

    def pin(self, source: str, d: int, why: str) -> None:
        self.pinned.add((source, d))
        self._note("static", f"{source}.shape[{d}] specialised: {why}")

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


def concrete(v):
    """A Python value for ``v``: a SymInt read as an int (the ShapeEnv guards its value)."""
    if isinstance(v, SYM_TYPES):
        return _CONCRETE[type(v)](v)
    if isinstance(v, (tuple, list)) and type(v) in (tuple, list, torch.Size):
        return type(v)([concrete(x) for x in v])   # a torch.Size stays one: str() shows it
    return v


class SymNodes:
    """SymInts as graph values: each symbol is a ``sym_size`` of the input it came from."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph
        self.origin: dict = {}      # sympy symbol -> (placeholder node, dim)
        self.nodes: dict = {}       # sympy expression -> fx node

    def add_input(self, node: torch.fx.Node, fake: torch.Tensor) -> None:
        for d, s in enumerate(fake.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                self.origin.setdefault(s.node.expr, (node, d, s))

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
            node, d, sym = self.origin[expr]
            out = self.graph.call_function(torch.ops.aten.sym_size.int, (node, d))
            out.meta["example_value"] = sym
        else:
            fold = _FOLD.get(type(expr))
            parts = [self._build(a) for a in expr.args] if fold else [None]
            if any(p is None for p in parts):
                return None
            out = parts[0]
            for p in parts[1:]:
                out = self.graph.call_function(fold, (out, p))
        self.nodes[expr] = out
        return out


def produce_guards(fakes: list, sources: list) -> str | None:
    """The ShapeEnv's guards over the symbolic inputs, as one Python expression over ``L``."""
    if not fakes:
        return None
    shape_env = next(s.node.shape_env for f in fakes for s in f.shape if isinstance(s, torch.SymInt))
    text = shape_env.produce_guards_expression(fakes, ignore_static=False)
    if not text:
        return None
    return re.sub(r"L\['t(\d+)'\]", lambda m: f"({sources[int(m.group(1))]})", text)


def specialised(fake: torch.Tensor) -> list:
    """The dimensions of a symbolic input whose symbol the trace pinned to one value."""
    out = []
    for d, s in enumerate(fake.shape):
        if isinstance(s, torch.SymInt) and s.node.shape_env.replace(s.node.expr).is_number:
            out.append((d, int(s.node.shape_env.replace(s.node.expr))))
    return out
