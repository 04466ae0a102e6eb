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
so a parallel loop collapsing it stays a perfect nest). Along the innermost loop, consecutive
pieces of one width planned alike, whose bodies differ only in the piece they load (a kernel
argument, at the same index relative to the piece's start), are one loop over a table of their
pointers (``piece_runs``): a dense block's k-th layer writes two loops, not k.
"""
from __future__ import annotations

from minicompile.codegen.cpp_loops import nest
from minicompile.codegen.cpp_ops import CTYPE
from minicompile.ir.expr import Clamp, Expr, Var, atoms_of

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


def piece_runs(plan, ck, loads: list) -> list:
    """(first, last + 1, buffer per piece) for each run of two or more consecutive pieces of
    ``plan.pieces`` (the innermost loop's) that one loop over a table of pointers computes;
    ``loads``: per piece, its plan walk's (buffer, index, level) list (cpp_plan.py)."""
    runs, k = [], 0
    while k < len(plan.pieces):
        j, at = k + 1, None
        while j < len(plan.pieces) and (same := _alike(plan, ck, loads, j - 1, j)) is not None and at in (None, same):
            at, j = same, j + 1
        if j - k >= 2:
            runs.append((k, j, [loads[m][at][0] for m in range(k, j)]))
        k = j
    return runs


def _alike(plan, ck, loads: list, a: int, b: int) -> int | None:
    """The position in the load lists of pieces ``a`` and ``b`` of the one load that differs (each
    piece's own: element level, from a kernel argument of the same type that the body loads nowhere
    else, at the same index relative to its piece's start), when everything else is the same:
    width, plan, other loads; else None."""
    (va, ca), (vb, cb) = plan.pieces[a], plan.pieces[b]
    if va.size - va.start != vb.size - vb.start or len(loads[a]) != len(loads[b]) or _shape(ca) != _shape(cb):
        return None
    local, cut = Var("piece_c", va.size - va.start), Expr.of(plan.cut)
    differ = []
    for i, ((na, ia, la), (nb, ib, lb)) in enumerate(zip(loads[a], loads[b])):
        if na == nb and la == lb and ia.substitute({va: cut}) == ib.substitute({vb: cut}):
            continue
        own = ia.substitute({va: Expr.of(local) + va.start})
        pa, pb = ck.pointer(na) if na else None, ck.pointer(nb) if nb else None
        if (la != "element" or lb != "element" or pa not in ck.arg_of or pb not in ck.arg_of or pa == pb
                or ck.arg_of[pa].dtype != ck.arg_of[pb].dtype or own != ib.substitute({vb: Expr.of(local) + vb.start})
                or any(v.name == plan.cut.name for v in atoms_of(own))):
            return None
        differ.append(i)
    if len(differ) != 1 or [n for n, _, _ in loads[a]].count(loads[a][differ[0]][0]) > 1 \
            or [n for n, _, _ in loads[b]].count(loads[b][differ[0]][0]) > 1:
        return None   # (a piece loaded again elsewhere in the body is not read through the table)
    return differ[0]


def _shape(calls: dict) -> dict:
    """A piece's plan without its buffer names: per node, each call's level, form, type and literal."""
    return {n: [(p.level, p.form, p.dtype, p.key if p.level == "literal" else None) for p in ps]
            for n, ps in calls.items()}


def table_loop(ck, pragmas: list, first: int, end: int, buffers: list, tables: list) -> list:
    """Pieces ``first`` .. ``end - 1`` of ``ck``'s (a CppKernel's) cut loop as one loop over a table of
    their pointers (appended to ``tables``) around the first one's body, which reads its piece
    through ``piece_in`` at the index relative to the piece (CppOps.piece)."""
    var, (piece, _) = ck.plan.cut, ck.plan.pieces[first]
    width, table = piece.size - piece.start, f"pieces_{var.name}_{piece.start}"
    pointers = [ck.pointer(b) for b in buffers]
    ctype = CTYPE[ck.arg_of[pointers[0]].dtype]
    tables.append(f"const {ctype}* const {table}[{end - first}] = {{{', '.join(pointers)}}};")
    ck.piece = (buffers[0], {piece: Expr.of(Var("piece_c", width)) + piece.start})
    body = ck.point_body()
    ck.piece = None
    if ck.channel:   # the first piece's values, filled over every piece of the run
        ck.channel.widen(var.name, (piece.start, piece.size), [(p.start, p.size) for p, _ in ck.plan.pieces[first + 1:end]])
    start = [f"const int64_t {var.name} = {piece.start} + {width}*piece + piece_c;"]
    inner = pragmas + [f"for (int64_t piece_c = 0; piece_c < {width}; ++piece_c)"]
    return nest([[f"for (int64_t piece = 0; piece < {end - first}; ++piece)"]],
                [f"const {ctype}* piece_in = {table}[piece];"] + nest([inner], start + body))
