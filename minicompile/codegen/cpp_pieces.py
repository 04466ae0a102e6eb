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
decides become the value they pick, and the loads no kept line reads are dropped, so a copy
holds its own piece's load only (layer k of a dense block was k copies of a body of k loads
and selects: g++ spent most of DenseNet's compile folding them). Along the innermost loop, the
pieces of one width laid out alike are then one loop over a table of their pointers
(``piece_runs``): a dense block's k-th layer writes two loops, not k.
"""
from __future__ import annotations

import re

from minicompile.codegen.cpp_loops import nest
from minicompile.codegen.cpp_ops import CppRenderer
from minicompile.ir.expr import Clamp, Expr, Var, atoms_of

_R = CppRenderer()

MAX_RANGES = 64   # a loop with more pieces than this is left whole (code size of an outer loop's copies)


def cut_at_pieces(headers: list, dims: list, body: list, indices, pointer_types: dict) -> list | None:
    """A pointwise nest (``headers[d]``: loop d's pragmas and for-line) with its innermost loop that
    has edges cut there (None: none has); an outer loop by a copy of the whole nest per piece, so a
    parallel loop collapsing it stays a perfect nest. A flat loop is left whole. ``pointer_types``:
    the kernel's pointers' element types (C++), for the tables of ``piece_runs``."""
    for d in reversed(range(len(dims)) if len(dims) > 1 else ()):
        (var, size), inner = dims[d], d == len(dims) - 1
        edges = piece_edges(indices, var, size) if isinstance(size, int) else []
        ranges = list(zip([0, *edges], [*edges, size])) if edges else []
        if ranges and inner:
            tables, loops = piece_runs(headers[d][:-1], var, ranges, body, indices, pointer_types)
            return tables + nest(headers[:d], loops)
        out = []
        for lo, hi in ranges:
            loop = headers[d][:-1] + [f"for (int64_t {var.name} = {lo}; {var.name} < {hi}; ++{var.name})"]
            out += nest(headers[:d] + [loop] + headers[d + 1:], fold_in_range(body, var.name, lo, hi))
        if out:
            return out


def piece_runs(pragmas: list, var: Var, ranges: list, body: list, indices, pointer_types: dict) -> tuple:
    """The innermost loop over ``ranges``: ``(tables, loops)``. Consecutive pieces of one width
    whose folded bodies differ only in the pointer they load from (DenseNet's growth-rate
    channels: every layer adds one) are one loop over a table of those pointers, around the same
    innermost loop of a constant trip count; a piece of its own is its own loop."""
    at = {_R.render(ix): ix for ix in indices}
    folded = [fold_in_range(body, var.name, lo, hi) for lo, hi in ranges]
    shapes = [_one_piece(f, var, lo, hi, at, pointer_types) for f, (lo, hi) in zip(folded, ranges)]
    tables, loops, k = [], [], 0
    while k < len(ranges):
        (lo, hi), j = ranges[k], k + 1
        while j < len(ranges) and shapes[k] and shapes[j] and shapes[j][1:] == shapes[k][1:] \
                and ranges[j][1] - ranges[j][0] == hi - lo:
            j += 1
        if j - k < 2:
            loops += nest([pragmas + [f"for (int64_t {var.name} = {lo}; {var.name} < {hi}; ++{var.name})"]], folded[k])
        else:
            _, ctype, piece_body = shapes[k]
            table = f"pieces_{var.name}_{lo}"
            tables.append(f"const {ctype}* const {table}[{j - k}] = {{{', '.join(s[0] for s in shapes[k:j])}}};")
            inner = pragmas + [f"for (int64_t piece_c = 0; piece_c < {hi - lo}; ++piece_c)"]
            start = [f"const int64_t {var.name} = {lo} + {hi - lo}*piece + piece_c;"]
            loops += nest([[f"for (int64_t piece = 0; piece < {j - k}; ++piece)"]],
                          [f"const {ctype}* piece_in = {table}[piece];"] + nest([inner], start + piece_body))
        k = j
    return tables, loops


def _one_piece(folded: list, var: Var, lo: int, hi: int, at: dict, pointer_types: dict) -> tuple | None:
    """``(pointer, element type, body)`` where ``folded`` loads from one piece, a pointer argument: its body
    for ``var = lo + piece_c``, that load read through ``piece_in`` at an index without ``var``
    (in the piece's range its clamp is the identity), the same for every piece laid out alike.
    None for any other body."""
    loads = [(k, m) for k, line in enumerate(folded) for m in _LOAD.finditer(line) if _piece_load(m, var, at)]
    if len(loads) != 1 or loads[0][1]["pointer"] not in pointer_types or not _DEFINITION.fullmatch(folded[loads[0][0]]):
        return None
    (k, m), c = loads[0], Var("piece_c", hi - lo)
    index = at[m["index"]].substitute({var: Expr.of(c) + lo})
    if var in atoms_of(index):
        return None
    line = folded[k][:m.start()] + f"piece_in[{_R.render(index)}]" + folded[k][m.end():]
    value = _DEFINITION.fullmatch(folded[k])["name"]
    body = [re.sub(rf"\b{value}\b", "piece_value", ln) for ln in folded[:k] + [line] + folded[k + 1:]]
    return m["pointer"], pointer_types[m["pointer"]], body


def _piece_load(m: re.Match, var: Var, at: dict) -> bool:
    """``pointer[index]`` loads at an index clamped on ``var``: a piece of the concatenation."""
    return m["index"] in at and any(var in atoms_of(c.arg) for c in _clamps(at[m["index"]]))


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
_LOAD = re.compile(r"(?P<pointer>\w+)\[(?P<index>[^\[\]]*)\]")
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
