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

Each copy's body is folded here first (``fold_in_range``): the selects whose comparison the range
decides become copies of the value they pick, and the loads no kept line reads are dropped. So
a copy holds one piece's load, not all of them: layer k of a dense block was k copies of a
body of k loads and selects, and g++ spent most of DenseNet's compile parsing and folding them.
"""
from __future__ import annotations

import re

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
            folded = fold_in_range(body, var.name, lo, hi)
            out += nest([loop], folded) if inner else nest(headers[:d] + [loop] + headers[d + 1:], folded)
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


# The statements CppOps writes that the fold reads: a definition, the loop variable's value, a
# comparison of it with a constant, a select (cpp_ops.py: "lt", "where", literal of an int64).
_DEFINITION = re.compile(r"(?P<type>[\w:<>]+) (?P<name>tmp\d+) = (?P<expr>.*);")
_LESS = re.compile(r"\((?P<a>tmp\d+) < INT64_C\((?P<c>-?\d+)\)\)")
_SELECT = re.compile(r"mc_where\((?P<c>tmp\d+), (?P<a>tmp\d+), (?P<b>tmp\d+)\)|\((?P<c2>tmp\d+) \? (?P<a2>tmp\d+) : (?P<b2>tmp\d+)\)")
_NAME = re.compile(r"\btmp\d+\b")


def fold_in_range(body: list, var: str, lo: int, hi: int) -> list:
    """``body`` (a loop body CppOps wrote) for ``var`` in [lo, hi): a comparison ``var < c`` that
    the range decides becomes ``true``/``false``, a select on it the value it picks (its name,
    read in its place, when of the same type), and the definitions nothing kept reads any more
    (the other pieces' loads) are dropped. Lines of other forms are kept as they are; g++ folds
    the same, from many more lines."""
    is_var, known, ctype, alias, out = set(), {}, {}, {}, []
    for line in body:
        line = _NAME.sub(lambda n: alias.get(n[0], n[0]), line) if alias else line
        m = _DEFINITION.fullmatch(line)
        if m:
            name, expr = m["name"], m["expr"]
            ctype[name] = m["type"]
            less, select = _LESS.fullmatch(expr), _SELECT.fullmatch(expr)
            if expr == var:
                is_var.add(name)
            elif less and less["a"] in is_var and (hi <= int(less["c"]) or lo >= int(less["c"])):
                known[name] = hi <= int(less["c"])
                line = f"{m['type']} {name} = {'true' if known[name] else 'false'};"
            elif select:
                c, a, b = (select["c"], select["a"], select["b"]) if select["c"] else select.group("c2", "a2", "b2")
                if c in known:
                    picked = a if known[c] else b
                    if ctype.get(picked) == m["type"]:
                        alias[name] = picked
                        continue
                    line = f"{m['type']} {name} = {picked};"
        out.append(line)
    return _without_dead(out)


def _without_dead(lines: list) -> list:
    """``lines`` less the definitions of temporaries no later kept line reads (loads and
    arithmetic: nothing CppOps defines has a side effect)."""
    used, kept = set(), []
    for line in reversed(lines):
        m = _DEFINITION.fullmatch(line)
        if m and m["name"] not in used:
            continue
        used.update(_NAME.findall(m["expr"] if m else line))
        kept.append(line)
    return kept[::-1]
