"""Index expressions simplify without changing their value at any point of the loop ranges."""
import itertools
import random

from minicompile.ir.expr import Expr, PythonRenderer, Var


def value(e: Expr, env: dict) -> int:
    return eval(PythonRenderer().render(e), {"min": min, "max": max}, env)


def test_row_index_divided_by_a_multiple_of_the_row_length_drops_the_inner_variable():
    # a (4, 256, 1024) buffer read as (1024, 1024): the block GELU's load index
    i, j = Var("i", 1024), Var("j", 1024)
    flat = Expr.of(i) * 1024 + j
    assert str(flat // (1024 * 256)) == "((i) // 256)"
    assert str(flat % (1024 * 256)) == "1024*((i) % 256) + j"
    assert str((flat * 3 + 7) // 6) == "((j) // 2) + 512*i + 1"


def test_division_and_modulo_match_python_on_random_linear_indices():
    """Also over variables narrowed to part of their loop (``start``: a loop cut at a
    concatenation's pieces), where a quotient can be one constant over the whole range."""
    rng = random.Random(0)
    for _ in range(600):
        sizes = [rng.choice([1, 2, 3, 4, 6, 8, 16]) for _ in range(rng.randint(1, 3))]
        starts = [rng.choice([0, 0, s // 2, s - 1]) for s in sizes]
        vs = [Var(f"v{k}", s, st) for k, (s, st) in enumerate(zip(sizes, starts))]
        coefs = [rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, -1, -4]) for _ in vs]
        const = rng.randint(0, 40)
        d = rng.choice([2, 3, 4, 6, 8, 12, 16, 32, 64, 96, 128])
        e = Expr.of(const)
        for v, c in zip(vs, coefs):
            e = e + Expr.of(v) * c
        if e.range()[0] < 0:
            e = e - e.range()[0]  # loop indices are non-negative
        q, r = e // d, e % d
        d2 = rng.choice([2, 3, 4])
        qq, qr = q // d2, r % d2   # a quotient or remainder divided again (a view of a view)
        for point in itertools.product(*(range(st, s) for s, st in zip(sizes, starts))):
            env = {v.name: p for v, p in zip(vs, point)}
            x = value(e, env)
            assert value(q, env) == x // d, (e, d, q, env)
            assert value(r, env) == x % d, (e, d, r, env)
            assert value(qq, env) == x // d // d2 and value(qr, env) == x % d % d2, (e, d, d2, env)


def test_a_clamp_over_a_narrowed_variable_is_the_identity_inside_and_one_end_outside():
    """A loop variable narrowed to part of its range (a loop cut at a concatenation's pieces,
    codegen/cpp_pieces.py) makes the clamp of the piece it covers the identity and the clamps of
    the pieces it misses the end they always take; each agrees with min(max(.)) at every value."""
    x = Var("x", 16)
    for lo, hi in [(0, 8), (8, 12), (12, 16)]:
        piece = Expr.of(Var("x", hi, lo))
        for start, length in [(0, 8), (8, 4), (12, 4)]:
            clamped = (Expr.of(x) - start).clamp(0, length - 1).substitute({x: piece})
            inside = start <= lo and hi <= start + length
            outside = hi <= start or lo >= start + length
            assert clamped.is_const == outside and (clamped == piece - start) == inside, (lo, hi, start, clamped)
            for v in range(lo, hi):
                got = eval(PythonRenderer().render(clamped), {"x": v, "min": min, "max": max})
                assert got == min(max(v - start, 0), length - 1)
