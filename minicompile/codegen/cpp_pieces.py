"""Where a concatenation's readers cut their loop: one loop per piece.

A concatenation is a lazy value (lowering/misc.py ``cat``): each element loads every piece
at a clamped index, ``min(max(x - start, 0), length - 1)``, and a chain of ``where(x < end)``
picks one. Along the concatenated dimension that is a gather per piece and per element, and
in channels-last layout that dimension is the innermost loop: DenseNet's BatchNorm-ReLU over
the concatenation of 5 pieces ran ten times slower than Inductor's, which writes the pieces
into one buffer first.

The kernel's plan (cpp_plan.py) cuts that loop at the pieces' edges, the values of the loop
variable where a clamp in a load index starts or stops clamping, and plans each range on its
own, with the loop variable narrowed to it (``Var(name, hi, start=lo)``). Over a range, the
concatenation knows its position's range and reads only the piece there (``cat`` skips the
others: no load, no select), and that piece's clamp is the identity (``Expr.clamp``), so the
body is one unit-stride load the C++ compiler vectorises. The plan prints the cut; the C++
kernel writes one loop per range (innermost) or one copy of the nest per range (an outer loop,
so a parallel loop collapsing it stays a perfect nest).
"""
from __future__ import annotations

from minicompile.ir.expr import Clamp, Expr, Var

MAX_RANGES = 64   # a loop with more pieces than this is left whole (code size of an outer loop's copies)


def piece_edges(indices, var: Var, size: int) -> list:
    """The values of ``var`` in (0, size) where a clamp of ``var + c`` in one of the load
    ``indices`` starts or stops clamping; [] when there are none or too many."""
    edges = set()
    for index in indices:
        for clamp in _clamps(index):
            rest = clamp.arg - Expr.of(var)
            if clamp.arg.coefficient(var) != 1 or not rest.is_const or not isinstance(clamp.hi, int):
                continue
            edges.update(e for e in (clamp.lo - rest.const, clamp.hi - rest.const + 1) if 0 < e < size)
    return sorted(edges) if 0 < len(edges) < MAX_RANGES else []


def _clamps(e: Expr):
    for atom, _ in e.terms:
        if isinstance(atom, Clamp):
            yield atom
            yield from _clamps(atom.arg)
