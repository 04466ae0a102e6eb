"""The innermost loop cut where a clamped load changes piece: a concatenation's readers.

A concatenation is a lazy value (lowering/misc.py ``cat``): each element loads every piece
at a clamped index, ``min(max(x - start, 0), length - 1)``, and a chain of ``where(x < end)``
picks one. Along the concatenated dimension that is a gather per piece and per element, and
in channels-last layout that dimension is the innermost loop: DenseNet's BatchNorm-ReLU over
the concatenation of 5 pieces ran ten times slower than Inductor's, which writes the pieces
into one buffer first. Cut that loop at the pieces' edges (one loop per range, the same body)
and, in each, the C++ compiler knows the range of the loop variable: the clamps of the other
pieces fold to constants, their comparisons to true or false, their loads and selects go
away, and the one piece left is a unit-stride load it vectorises. In NCHW it is an outer loop.
"""
from __future__ import annotations

from minicompile.codegen.cpp_loops import nest
from minicompile.ir.expr import Clamp, Expr, Var

MAX_RANGES = 16   # a loop cut into more copies than this is left whole (code size)


def cut_at_pieces(headers: list, dims: list, body: list, indices) -> list | None:
    """A pointwise nest (``headers[d]``: loop d's pragmas and for-line) with its innermost loop that
    has edges cut there (None: none has); an outer loop by a copy of the whole nest per piece, so a
    parallel loop collapsing it stays a perfect nest. A flat loop is left whole."""
    for d in reversed(range(len(dims)) if len(dims) > 1 else ()):
        (var, size), inner = dims[d], d == len(dims) - 1
        edges = piece_edges(indices, var, size) if isinstance(size, int) else []
        bounds, out = [0, *edges, size], []
        for lo, hi in zip(bounds, bounds[1:]) if edges else ():
            loop = headers[d][:-1] + [f"for (int64_t {var.name} = {lo}; {var.name} < {hi}; ++{var.name})"]
            out += nest([loop], body) if inner else nest(headers[:d] + [loop] + headers[d + 1:], body)
        if out:
            return nest(headers[:d], out) if inner else out


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
