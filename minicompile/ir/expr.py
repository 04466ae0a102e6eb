"""Integer index expressions: the arithmetic of views, broadcasts and loops.

An index expression is a linear combination of *atoms* with integer coefficients plus a
constant. Atoms are loop variables, ``a // d``, ``a % d``, a clamp, or an index read from
memory at run time. Expressions are immutable, hashable and simplified on construction,
using the range of each loop variable: ``(x // 8) * 8 + x % 8`` folds back to ``x`` and
``(64*i + j) // 64`` to ``i`` when ``j < 64``. That keeps fused kernels' indices linear
(so C++ loops vectorize) without a symbolic algebra package.

Sizes may be *symbols* (``Sym``, e.g. Dynamo's ``s77``): a size that changes between calls,
at least 2 (sizes 0 and 1 are specialised) and passed to kernels at run time. A symbolic
stride makes an index a polynomial (``Prod`` atoms such as ``s77*i0``). Every
simplification above is a range argument, and a symbol's range (2 .. SYM_MAX) is a true
bound, so they stay valid for every size. Dividing by a symbol is only done where the
quotient is exact by construction (``split_by``); anything else raises NotSymbolic, and the
graph is compiled per shape instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union


SYM_MAX = 1 << 40  # the largest size a symbol is assumed to take (a bound for range arguments)


class NotSymbolic(Exception):
    """This graph (an op, an index, a loop plan) cannot be compiled with symbolic sizes."""


class Atom:
    """A non-linear leaf of an index expression."""

    def range(self) -> tuple[int, int]:  # inclusive bounds
        raise NotImplementedError


@dataclass(frozen=True, order=True)
class Var(Atom):
    name: str
    size: Union[int, "Expr"]  # the variable runs over start .. size-1 (an Expr when symbolic)
    start: int = 0            # > 0: a loop cut into ranges (a concatenation's pieces, codegen/cpp_plan.py)

    def range(self):
        if isinstance(self.size, Expr):
            return (self.start, self.size.range()[1] - 1)
        return (self.start, max(self.size - 1, self.start))

    def render(self, r: "Renderer") -> str:
        return self.name


@dataclass(frozen=True, order=True)
class Sym(Atom):
    """A symbolic size: known only when the compiled graph is called."""
    name: str

    def range(self):
        # Dynamo never makes sizes 0 and 1 symbols; a data-dependent ("unbacked") symbol, the
        # size nonzero() returns or a value .item() reads (torch's names start with "u"), may be
        # either. A value .item() read may also be negative: it is only divided where the trace's
        # value ranges prove it is not (nodes._nonnegative)
        return (0, SYM_MAX) if self.name.startswith("u") else (2, SYM_MAX)

    def render(self, r: "Renderer") -> str:
        return self.name


@dataclass(frozen=True)
class Prod(Atom):
    """A product of two or more atoms (sorted): ``s77*i0`` where a stride is symbolic."""
    factors: tuple

    def range(self):
        lo, hi = 1, 1
        for f in self.factors:
            flo, fhi = f.range()
            if flo < 0:
                raise NotSymbolic(f"a product with a factor that may be negative: {f}")
            lo, hi = lo * flo, min(hi * fhi, SYM_MAX * SYM_MAX)
        return (lo, hi)

    def render(self, r: "Renderer") -> str:
        return "*".join(r.render(Expr.of(f)) if not isinstance(f, (Var, Sym)) else f.render(r) for f in self.factors)


def _times(a: Atom, b: Atom) -> Atom:
    fa = a.factors if isinstance(a, Prod) else (a,)
    fb = b.factors if isinstance(b, Prod) else (b,)
    return Prod(tuple(sorted(fa + fb, key=_atom_key)))


@dataclass(frozen=True)
class FloorDiv(Atom):
    """``arg // divisor``; a symbolic divisor (an Expr, at least 2) only with ``arg >= 0``."""
    arg: "Expr"
    divisor: Union[int, "Expr"]

    def range(self):
        lo, hi = self.arg.range()
        if isinstance(self.divisor, Expr):
            m = _quotient_bound(self.arg, self.divisor)
            return (0, hi // 2 if m is None else m - 1)
        return (lo // self.divisor, hi // self.divisor)

    def render(self, r):
        return r.floordiv(r.render(self.arg), _divisor(r, self.divisor))


@dataclass(frozen=True)
class Mod(Atom):
    arg: "Expr"
    divisor: Union[int, "Expr"]

    def range(self):
        if isinstance(self.divisor, Expr):
            return (0, min(self.arg.range()[1], self.divisor.range()[1] - 1))
        return (0, self.divisor - 1)

    def render(self, r):
        return r.mod(r.render(self.arg), _divisor(r, self.divisor))


def _divisor(r, d):
    return d if isinstance(d, int) else f"({r.render(d)})"


@dataclass(frozen=True)
class Clamp(Atom):
    """min(max(arg, lo), hi): keeps a load in bounds where a mask selects another value.
    ``hi`` is an Expr where it is the last index of a symbolic size."""
    arg: "Expr"
    lo: int
    hi: Union[int, "Expr"]

    def range(self):
        return (self.lo, self.hi if isinstance(self.hi, int) else self.hi.range()[1])

    def render(self, r):
        return r.clamp(r.render(self.arg), self.lo, _divisor(r, self.hi))


@dataclass(frozen=True)
class Indirect(Atom):
    """An index read from memory, ``buffer[index]`` (of integer ``dtype``), into ``size`` elements. ``check``:
    0, checked before (in bounds); 2, a negative one wrapped (``x[idx]``, whose IndexError names the index
    tensor's position ``dim``); 1 and 3, a negative one refused (index_select: IndexError, dim 1's RuntimeError)."""
    buffer: str
    index: "Expr"
    dtype: object
    size: Union[int, "Expr"]
    dim: int
    check: int

    def range(self):
        return (0, (self.size.range()[1] if isinstance(self.size, Expr) else self.size) - 1)

    def render(self, r):
        return r.indirect(self)


def _atom_key(a: Atom):
    """The order of an Expr's terms. Each atom's key is kept on it: rendering a nested atom's repr
    for every sort was most of the scheduler's time."""
    key = a.__dict__.get("_key")
    if key is None:
        key = (type(a).__name__, repr(a))
        object.__setattr__(a, "_key", key)   # frozen dataclasses: not a field, not in eq or hash
    return key


@dataclass(frozen=True)
class Expr:
    terms: tuple  # ((atom, coef), ...) sorted, no zero coefficients
    const: int = 0

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def of(x: Union["Expr", Atom, int]) -> "Expr":
        if isinstance(x, Expr):
            return x
        if isinstance(x, Atom):
            return Expr(((x, 1),), 0)
        return Expr((), int(x))

    @staticmethod
    def _make(coefs: dict, const: int) -> "Expr":
        if any(type(a) is Mod for a in coefs):
            coefs, extra = _fold_div_mod_pairs(coefs)
            const += extra
        terms = [(a, c) for a, c in coefs.items() if c != 0]
        if len(terms) > 1:
            terms.sort(key=lambda t: _atom_key(t[0]))
        return Expr(tuple(terms), const)

    def _coefs(self) -> dict:
        return dict(self.terms)

    # -- arithmetic ---------------------------------------------------------------------
    def __add__(self, other) -> "Expr":
        other = Expr.of(other)
        coefs = self._coefs()
        for a, c in other.terms:
            coefs[a] = coefs.get(a, 0) + c
        return Expr._make(coefs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "Expr":
        return self * -1

    def __sub__(self, other) -> "Expr":
        return self + (-Expr.of(other))

    def __rsub__(self, other) -> "Expr":
        return Expr.of(other) - self

    def __mul__(self, k) -> "Expr":
        if isinstance(k, Expr):
            if k.is_const:
                k = k.const
            elif self.is_const:
                return k * self.const
            else:
                return self._poly_mul(k)
        k = int(k)
        return Expr._make({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    def _poly_mul(self, other: "Expr") -> "Expr":
        """A product where both sides vary: legal when it stays a polynomial in symbols (a
        symbolic stride times a loop variable), never for two loop variables."""
        coefs: dict = {}
        for a, c in self.terms + ((None, self.const),):
            for b, d in other.terms + ((None, other.const),):
                key = a if b is None else b if a is None else _times(a, b)
                if key is None:
                    continue
                coefs[key] = coefs.get(key, 0) + c * d
        if any(sum(isinstance(f, Var) for f in (k.factors if isinstance(k, Prod) else ())) > 1 for k in coefs):
            raise TypeError("index expressions are linear in loop variables: cannot multiply two variables")
        return Expr._make(coefs, self.const * other.const)

    def __floordiv__(self, d) -> "Expr":
        if isinstance(d, Expr) and not d.is_const:
            return self.divmod_symbol(d)[0]
        d = int(d)
        if d == 1:
            return self
        assert d > 0, d
        exact, rest = {}, {}
        for a, c in self.terms:
            (exact if c % d == 0 else rest)[a] = c // d if c % d == 0 else c
        q = Expr._make(exact, self.const // d)
        r = Expr._make(rest, self.const % d)
        lo, hi = r.range()
        if lo // d == hi // d:   # one quotient over r's whole range (0 when 0 <= r < d)
            return q + lo // d
        if r.is_const:
            return q + r.const // d
        if len(r.terms) == 1 and r.const == 0 and isinstance(r.terms[0][0], FloorDiv) and r.terms[0][1] == 1:
            inner = r.terms[0][0]
            return q + Expr.of(FloorDiv(inner.arg, inner.divisor * d))
        split = _split_below(r, d)
        if split:
            m, big, _ = split
            return q + big // (d // m)
        return q + Expr.of(FloorDiv(r, d))

    def __mod__(self, d) -> "Expr":
        if isinstance(d, Expr) and not d.is_const:
            return self.divmod_symbol(d)[1]
        d = int(d)
        if d == 1:
            return Expr.of(0)
        rest = {a: c for a, c in self.terms if c % d != 0}
        r = Expr._make(rest, self.const % d)
        lo, hi = r.range()
        if lo // d == hi // d:   # one quotient over r's whole range: r itself when 0 <= r < d
            return r - (lo // d) * d
        if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], Mod):
            inner = r.terms[0][0]
            if inner.divisor % d == 0:
                return Expr.of(Mod(inner.arg, d))
        split = _split_below(r, d)
        if split:
            m, big, small = split
            return (big % (d // m)) * m + small
        return Expr.of(Mod(r, d))

    def divmod_symbol(self, d: "Expr") -> tuple:
        """(self // d, self % d) for a symbolic ``d = k*M`` (k an int, M a product of symbols),
        for ``self >= 0``: exact terms where ``split_by`` proves them, else FloorDiv/Mod atoms
        over M after the integer division by k (``e // kM == (e // k) // M`` and
        ``e % kM == k*((e // k) % M) + e % k``)."""
        for split in (self.split_by, self.split_by_polynomial):
            try:
                return split(d)
            except NotSymbolic:
                pass
        if len(d.terms) != 1 or d.const != 0 or d.terms[0][1] <= 0 or self.range()[0] < 0:
            raise NotSymbolic(f"division of {self} by {d}")
        atom, k = d.terms[0]
        e, monomial = self // k, Expr.of(atom)
        try:
            q, r = e.split_by(monomial)
        except NotSymbolic:
            q, r = Expr.of(0), e
        if not r.is_const:
            q, r = q + Expr.of(FloorDiv(r, monomial)), Expr.of(Mod(r, monomial))
        return q, r * k + self % k

    def split_by(self, d: "Expr") -> tuple:
        """(self // d, self % d) for a symbolic ``d``, when exact by construction: the terms
        that are multiples of ``d`` form the quotient and the rest provably lies in [0, d)
        (its largest value, a sum of loop variables' ``size - 1``, is at most ``d - 1``)."""
        if len(d.terms) != 1 or d.const != 0 or d.terms[0][1] <= 0:
            raise NotSymbolic(f"division by {d}")
        div, k = d.terms[0]
        dfs = div.factors if isinstance(div, Prod) else (div,)
        quot, rest = {}, {}
        for a, c in self.terms:
            fs = list(a.factors if isinstance(a, Prod) else (a,))
            if c % k == 0 and all(f in fs and not fs.remove(f) for f in dfs):
                key = None if not fs else fs[0] if len(fs) == 1 else Prod(tuple(fs))
                quot[key] = quot.get(key, 0) + c // k
            else:
                rest[a] = c
        q = Expr._make({k: c for k, c in quot.items() if k is not None}, quot.get(None, 0))
        r = Expr._make(rest, self.const)
        if not _below(r, d):
            raise NotSymbolic(f"cannot prove 0 <= {r} < {d}")
        return q, r

    def split_by_polynomial(self, d: "Expr") -> tuple:
        """(self // d, self % d) for ``d = k*P``, P a polynomial such as ``s0 + 1`` (a KV cache
        one token longer than the past), when ``self == A*P + r`` with ``0 <= r < P`` provable:
        then ``self // d == A // k`` and ``self % d == (A % k)*P + r``. A collects the terms
        that are multiples of P's leading monomial. A low part below a divisor m of k comes off
        first: ``(m*big + small) // (k*P) == big // ((k/m)*P)``."""
        k = math.gcd(d.const, *(c for _, c in d.terms))
        split = _split_below(self, k) if k > 1 else None
        if split:
            m, big, small = split
            q, r = big.split_by_polynomial(Expr._make({a: c // m for a, c in d.terms}, d.const // m))
            return q, r * m + small
        P = Expr._make({a: c // k for a, c in d.terms}, d.const // k)
        lead, lead_c = max(P.terms, key=lambda t: len(t[0].factors) if isinstance(t[0], Prod) else 1)
        lfs = lead.factors if isinstance(lead, Prod) else (lead,)
        quot = {}
        for a, c in self.terms:
            fs = list(a.factors if isinstance(a, Prod) else (a,))
            if c % lead_c == 0 and all(f in fs and not fs.remove(f) for f in lfs):
                key = None if not fs else fs[0] if len(fs) == 1 else Prod(tuple(fs))
                quot[key] = quot.get(key, 0) + c // lead_c
        A = Expr._make({a: c for a, c in quot.items() if a is not None}, quot.get(None, 0))
        r = self - A * P
        if P.range()[0] < 1 or A.range()[0] < 0 or not _below(r, P):
            raise NotSymbolic(f"division of {self} by {d}")
        return A // k, (A % k) * P + r

    def clamp(self, lo: int, hi) -> "Expr":
        hi = size_value(hi)
        rlo, rhi = self.range()
        if rlo >= lo and (rhi <= hi if isinstance(hi, int) else _below(self, hi + 1)):
            return self
        if isinstance(hi, int) and lo <= hi and (rhi <= lo or rlo >= hi):   # always clamped: one end
            return Expr.of(lo if rhi <= lo else hi)
        return Expr.of(Clamp(self, lo, hi))

    # -- queries ------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    def range(self) -> tuple[int, int]:
        lo = hi = self.const
        for a, c in self.terms:
            alo, ahi = a.range()
            lo += min(c * alo, c * ahi)
            hi += max(c * alo, c * ahi)
        return lo, hi

    def coefficient(self, var: Var):
        """The coefficient of ``var`` if it appears only linearly, else None."""
        coef = 0
        for a, c in self.terms:
            if a == var:
                coef = c
            elif var in atoms_of(Expr.of(a)) and not isinstance(a, Var):
                return None
        return coef

    def substitute(self, mapping: dict) -> "Expr":
        """Replace variables by expressions (``mapping: Var -> Expr``) and re-simplify."""
        out = Expr.of(self.const)
        for a, c in self.terms:
            out = out + _subst_atom(a, mapping) * c
        return out

    def __str__(self) -> str:
        return PythonRenderer().render(self)

    __repr__ = __str__


def _below(r: Expr, d: Expr) -> bool:
    """0 <= r < d for every size: r's terms are loop variables, or products of loop variables
    and symbols (``s1*j``), with non-negative coefficients, and d - 1 - max(r) is a constant >= 0."""
    top = _largest(r)
    if top is None:
        return False
    slack = d - 1 - top
    return slack.is_const and slack.const >= 0


def _largest(r: Expr) -> Expr | None:
    """r's largest value over its loop variables, as an Expr over symbols, where r >= 0 is plain."""
    top = Expr.of(r.const)
    for a, c in r.terms:
        factors = a.factors if isinstance(a, Prod) else (a,)
        if c < 0 or not all(isinstance(f, (Var, Sym)) for f in factors) or not any(isinstance(f, Var) for f in factors):
            return None
        high = Expr.of(c)
        for f in factors:  # a variable's largest value is its size - 1, a symbol's is itself
            high = high * (Expr.of(f.size) - 1 if isinstance(f, Var) else Expr.of(f))
        top = top + high
    return top if r.const >= 0 else None


def _quotient_bound(arg: Expr, d: Expr) -> int | None:
    """An int m with arg < m*d for every size (so arg // d < m): x0 < 2*s0 over s0 gives 2."""
    top = _largest(arg)
    if top is None or not top.terms or len(d.terms) != len(top.terms):
        return None
    m = -(-top.terms[0][1] // d.terms[0][1])
    return m if m > 0 and _below(arg, d * m) else None


def _subst_atom(a: Atom, mapping: dict) -> Expr:
    if isinstance(a, Var):
        return Expr.of(mapping.get(a, a))
    if isinstance(a, Sym):
        return Expr.of(a)
    if isinstance(a, Prod):
        out = Expr.of(1)
        for f in a.factors:
            out = out * _subst_atom(f, mapping)
        return out
    if isinstance(a, FloorDiv):
        return a.arg.substitute(mapping) // a.divisor
    if isinstance(a, Mod):
        return a.arg.substitute(mapping) % a.divisor
    if isinstance(a, Clamp):
        return a.arg.substitute(mapping).clamp(a.lo, a.hi)
    if isinstance(a, Indirect):   # replaced (by the name of its checked value), or read elsewhere
        return Expr.of(mapping[a]) if a in mapping else \
            Expr.of(Indirect(a.buffer, a.index.substitute(mapping), a.dtype, a.size, a.dim, a.check))
    return Expr.of(a)


def atoms_of(e: Expr) -> set:
    """Every Var that ``e`` depends on, at any depth (an Indirect: those its index reads at)."""
    out = set()
    for a, _ in e.terms:
        if isinstance(a, Var):
            out.add(a)
        elif isinstance(a, Prod):  # factors: Vars, Syms and atoms over an index ((x0 // s1) * s1)
            for f in a.factors:
                out |= {f} if isinstance(f, Var) else set() if isinstance(f, Sym) else atoms_of(Expr.of(f))
        elif not isinstance(a, Sym):
            out |= atoms_of(a.index if isinstance(a, Indirect) else a.arg)
    return out


def symbols_of(e) -> set:
    """Every size symbol (Sym) that ``e`` (an Expr, or an int) depends on, at any depth."""
    if not isinstance(e, Expr):
        return set()
    out = set()
    for a, _ in e.terms:
        if isinstance(a, Sym):
            out.add(a)
        elif isinstance(a, Prod):
            out |= set().union(*(symbols_of(Expr.of(f)) for f in a.factors))
        elif isinstance(a, Var):
            out |= symbols_of(a.size)
        elif isinstance(a, Indirect):
            out |= symbols_of(a.index) | symbols_of(a.size)
        else:
            out |= symbols_of(a.arg) | symbols_of(getattr(a, "divisor", None))
    return out


def size_value(s) -> Union[int, Expr]:
    """A size as the IR keeps it: a python int when it is one, else a symbolic Expr."""
    if isinstance(s, Expr):
        return s.const if s.is_const else s
    return int(s)


def _split_below(e: Expr, d: int):
    """``e == m*big + small`` with ``m`` dividing ``d``, ``m > 1`` and ``0 <= small < m``, or None.

    Then ``e // d == big // (d/m)`` and ``e % d == m*(big % (d/m)) + small``: a row index
    ``1024*i + j`` (``j < 1024``) divided by ``1024*256`` is ``i // 256``, with no division of
    the inner loop variable left for the vectoriser to trip over."""
    terms = sorted(e.terms, key=lambda t: -abs(t[1]))
    for k in range(1, len(terms) + 1):
        m = d
        for _, c in terms[:k]:
            m = math.gcd(m, c)
        if m <= 1:
            return None
        small = Expr._make(dict(terms[k:]), e.const % m)
        lo, hi = small.range()
        if lo >= 0 and hi < m:
            big = Expr._make({a: c // m for a, c in terms[:k]}, e.const // m)
            return m, big, small
    return None


def _fold_div_mod_pairs(coefs: dict) -> tuple[dict, int]:
    """k*d*(e // d) + k*(e % d) == k*e: undo the split a flattened loop index went through."""
    const = 0
    changed = True
    while changed:
        changed = False
        for a, c in list(coefs.items()):
            if not isinstance(a, Mod) or c == 0:
                continue
            if isinstance(a.divisor, Expr):  # d*(e // d) is the product atom, with coefficient k
                partner, want = _times(FloorDiv(a.arg, a.divisor), a.divisor.terms[0][0]), c
            else:
                partner, want = FloorDiv(a.arg, a.divisor), c * a.divisor
            if coefs.get(partner, 0) == want:
                del coefs[a], coefs[partner]
                for b, cb in a.arg.terms:
                    coefs[b] = coefs.get(b, 0) + cb * c
                const += a.arg.const * c
                changed = True
                break
    return {a: c for a, c in coefs.items() if c != 0}, const


class Renderer:
    """Turns an Expr into source text; backends override the operator spellings."""

    def render(self, e: Expr) -> str:
        parts = []
        for a, c in e.terms:
            s = a.render(self)
            if c == 1:
                parts.append(s)
            elif c == -1:
                parts.append(f"-{s}")
            else:
                parts.append(f"{c}*{s}")
        if e.const or not parts:
            parts.append(str(e.const))
        out = " + ".join(parts).replace("+ -", "- ")
        return out

    def floordiv(self, a: str, d: int) -> str:
        return f"(({a}) // {d})"

    def mod(self, a: str, d: int) -> str:
        return f"(({a}) % {d})"

    def clamp(self, a: str, lo: int, hi: int) -> str:
        return f"min(max({a}, {lo}), {hi})"

    def indirect(self, a: Indirect) -> str:   # a kernel names the value it checked (codegen/cpp.py)
        raise NotSymbolic(f"an index read from {a.buffer}, not checked where the kernel reads it")


class PythonRenderer(Renderer):
    def indirect(self, a: Indirect) -> str:
        return f"{a.buffer}[{self.render(a.index)}]"


def flat_index(index: list, strides) -> Expr:
    """sum(i * s): one Expr made for the sum, not one per term (most of the scheduler's time is
    building index expressions); a symbolic stride multiplies as usual."""
    coefs, const = {}, 0
    for i, s in zip(index, strides):
        term = Expr.of(i)
        if isinstance(s, Expr) and not s.is_const:
            term, s = term * s, 1
        s = int(s.const if isinstance(s, Expr) else s)
        for a, c in term.terms:
            coefs[a] = coefs.get(a, 0) + c * s
        const += term.const * s
    return Expr._make(coefs, const)


def make_vars(prefix: str, sizes) -> list[Var]:
    return [Var(f"{prefix}{k}", size_value(s)) for k, s in enumerate(sizes)]
