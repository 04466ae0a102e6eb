"""Dynamic shapes: one symbolic build serves every batch size (docs/dynamic.md).

Each workload runs through torch.compile at batch sizes 2..64 in three ways: Dynamo's
automatic dynamic (the second size recompiles with a symbolic batch), ``mark_dynamic`` on
the batch dim, and ``dynamic=True`` (every size symbolic). Every result is compared with
eager, and the pipeline compiles are counted: at most 2, 1, 1.
"""
import itertools
import logging
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.ir.expr import Expr, NotSymbolic, Sym, Var, symbols_of
from minicompile.tools.workloads import Block

from minicompile.config import patch
from tests.helpers import assert_matches_eager

BATCHES = range(2, 65)
torch.manual_seed(0)
_MLP = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()
_LN_W, _LN_B = torch.randn(32), torch.randn(32)
_BLOCK = Block(16, 2).eval()


def pointwise_chain(x):
    return (torch.sin(x) * 2.0 + 1.0).relu() * torch.cos(x)


WORKLOADS = {  # name -> (function, input of batch size b)
    "pointwise": (pointwise_chain, lambda b: torch.randn(b, 32)),
    "softmax": (lambda x: torch.softmax(x, -1), lambda b: torch.randn(b, 32)),
    # eps as a literal: dynamic=True would make a module's float eps a graph input
    "layer_norm": (lambda x: F.layer_norm(x, (32,), _LN_W, _LN_B, 1e-5), lambda b: torch.randn(b, 32)),
    "mlp": (_MLP, lambda b: torch.randn(b, 32)),
    "sum_over_batch": (lambda x: x.sum(0) + x.mean(), lambda b: torch.randn(b, 32)),
}
MODES = {"automatic": 2, "mark_dynamic": 1, "dynamic=True": 1}  # mode -> most pipeline compiles allowed


def run_batches(fn, make_input, mode: str, batches=BATCHES):
    compiled = torch.compile(fn, backend="minicompile", dynamic=True if mode == "dynamic=True" else None)
    with torch.no_grad():
        for b in batches:
            x = make_input(b)
            if mode == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            assert_matches_eager(compiled(x), fn(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", WORKLOADS)
def test_batch_sizes_2_to_64_share_one_symbolic_build(name, mode, compiles, fresh_dynamo, caplog):
    fn, make_input = WORKLOADS[name]
    with caplog.at_level(logging.INFO, logger="minicompile"):
        run_batches(fn, make_input, mode)
    assert 1 <= len(compiles) <= MODES[mode], [c.schedule for c in compiles]
    assert "per shape" not in caplog.text
    symbolic = compiles[-1]
    assert "int64_t s" in symbolic.kernel_source  # the batch size is a kernel argument


@pytest.mark.parametrize("mode", ["automatic", "mark_dynamic"])
def test_gpt2_block_over_batch_sizes(mode, compiles, fresh_dynamo):
    run_batches(_BLOCK, lambda b: torch.randn(b, 8, 16), mode, batches=range(2, 12))
    assert len(compiles) <= MODES[mode]


def test_gpt2_block_over_sequence_lengths(compiles, fresh_dynamo):
    # attention over t tokens: (b, t, c) rows flattened to (b*t, c) and back, scores t x t
    run_batches(_BLOCK, lambda t: torch.randn(2, t, 16), "automatic", batches=range(2, 12))
    assert len(compiles) <= 2
    assert "int64_t s" in compiles[-1].kernel_source


def test_sizes_0_and_1_stay_specialised(compiles, fresh_dynamo):
    fn, make_input = WORKLOADS["softmax"]
    run_batches(fn, make_input, "automatic", batches=[2, 3, 1, 5, 0])
    sources = [c.kernel_source for c in compiles]
    assert len(compiles) == 4  # 2, then symbolic for 3 and 5, then 1 and 0 on their own
    assert sum("int64_t s" in s for s in sources) == 1


def test_symbols_show_in_the_loop_ir_the_kernel_and_the_wrapper(compiles, fresh_dynamo):
    fn, make_input = WORKLOADS["softmax"]
    run_batches(fn, make_input, "mark_dynamic", batches=[3, 7])
    (c,) = compiles
    (sym,) = {s.name for b in c.loop_graph.inputs for s in symbols_of(Expr.of(b.layout.size[0]))}
    assert f"f32[{sym}, 32]" in str(c.loop_graph)
    assert f"int64_t {sym}" in c.kernel_source
    assert f"for (int64_t x0 = 0; x0 < {sym}; ++x0)" in c.kernel_source
    assert f"#pragma omp parallel for if(32*{sym} >= " in c.kernel_source  # threads decided at run time
    assert "#pragma omp simd" in c.kernel_source                       # the inner loop stays vectorised
    assert f"{sym}, arg1 = args" in c.wrapper_source            # Dynamo passes the size itself
    assert f"pooled_if_large(({sym}, 32), (32, 1)" in c.wrapper_source  # buffers sized at call time


def test_unprovable_index_math_compiles_per_shape_with_correct_results(compiles, fresh_dynamo, caplog):
    # (s0*s1) elements viewed as rows of 8: the division by 8 of a product of two symbols
    # is no polynomial, so this graph is not compiled symbolically
    def fn(x):
        return (x.reshape(-1, 8) * 2).sum(-1)
    with caplog.at_level(logging.INFO, logger="minicompile"):
        run_batches(fn, lambda b: torch.randn(b, 32), "dynamic=True", batches=[2, 3, 4, 5])
    assert "compiled per shape (not supported symbolically" in caplog.text
    assert len(compiles) == 4
    assert not any("int64_t s" in c.kernel_source for c in compiles)


def test_a_symbolic_size_that_broadcast_at_the_traced_size_compiles_per_shape(compiles, fresh_dynamo):
    # x[2::3] has s0 // 3 rows: 1 at the traced size, so ``x - x[2::3]`` broadcast it there.
    # Read as "same size as x", the kernel indexed rows beyond it (fuzzer seed 131, dynamic mode).
    def fn(x):
        return x - x[2::3]
    run_batches(fn, lambda b: torch.arange(b * 2.0).view(b, 2), "dynamic=True", batches=[3, 4, 5])
    assert not any("int64_t s" in c.kernel_source for c in compiles)


def test_a_static_size_kernel_indexed_by_a_symbolic_stride(compiles, fresh_dynamo, caplog):
    # a[..., :1] of a (4, 5, s) tensor: static sizes, stride s. Its load depends on the loop
    # index through (x0 // 5) * 5 * s, a product the loop-invariant hoisting once missed (the
    # load went before the loop), and the kernel needs s, which a horizontal group did not pass.
    def fn(a, b, c):
        return torch.maximum(a[..., :1], b) == b, c * 2
    compiled = torch.compile(fn, backend="minicompile")
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        for n in (3, 6, 7):
            a, b, c = (torch.randint(-5, 5, size) for size in ((4, 5, n), (4, 5, 1), (4, 5, 1)))
            torch._dynamo.mark_dynamic(a, 2)
            for got, want in zip(compiled(a, b, c), fn(a, b, c)):
                assert torch.equal(got, want)
    assert "failed" not in caplog.text
    assert len(compiles) == 1 and "int64_t s" in compiles[0].kernel_source


# -- the index algebra over symbols ------------------------------------------------------------

def value(e: Expr, env: dict) -> int:
    return eval(str(e), {}, env)


def test_division_by_a_symbol_is_exact_where_the_remainder_is_provably_below_it():
    s0, s1 = Expr.of(Sym("s0")), Expr.of(Sym("s1"))
    i, j, k = Var("i", s0), Var("j", s1), Var("k", 16)
    flat = Expr.of(i) * s1 * 16 + Expr.of(j) * 16 + k
    assert str(flat // (s1 * 16)) == "i" and str(flat % (s1 * 16)) == "16*j + k"
    assert str(flat // 16 % s1) == "j" and str(flat // 16 // s1) == "i"
    for n0, n1 in itertools.product([2, 3, 5], [2, 7]):
        for vi, vj, vk in itertools.product(range(n0), range(n1), range(16)):
            env = {"s0": n0, "s1": n1, "i": vi, "j": vj, "k": vk}
            assert value(flat // 16 % s1, env) == (value(flat, env) // 16) % n1


def test_division_by_a_symbol_matches_python_on_random_indices():
    rng = random.Random(0)
    syms = {"s0": Expr.of(Sym("s0")), "s1": Expr.of(Sym("s1"))}
    sizes = [2, 3, 16, syms["s0"], syms["s1"], syms["s0"] * 2]
    coefs = [1, 2, 3, 16, syms["s0"], syms["s1"], syms["s0"] * 4]
    divisors = [syms["s0"], syms["s1"], syms["s0"] * 8, syms["s0"] * syms["s1"], syms["s0"] * 3]
    checked = 0
    for trial in range(300):
        vs = [Var(f"v{k}", rng.choice(sizes)) for k in range(rng.randint(1, 3))]
        e = Expr.of(rng.randint(0, 5))
        for v in vs:
            e = e + Expr.of(v) * rng.choice(coefs)
        d = rng.choice(divisors)
        try:
            q, r = e // d, e % d
        except (NotSymbolic, TypeError):  # two loop variables multiplied, or unprovable
            continue
        for s0, s1 in [(2, 3), (5, 2)]:
            env = {"s0": s0, "s1": s1}
            ranges = [range(v.size if isinstance(v.size, int) else value(v.size, env)) for v in vs]
            for point in itertools.islice(itertools.product(*ranges), 100):
                env.update({v.name: p for v, p in zip(vs, point)})
                assert value(q, env) == value(e, env) // value(d, env), (e, d, q, env)
                assert value(r, env) == value(e, env) % value(d, env), (e, d, r, env)
                checked += 1
    assert checked > 10000


def test_division_by_a_polynomial_is_exact_where_the_remainder_is_provably_below_it():
    # a KV cache one token longer than the past (s + 1 rows of 16) flattened, divided by 32*(s + 1)
    s = Expr.of(Sym("s0"))
    v0, v1, v2 = Var("v0", 4), Var("v1", 16), Var("v2", s + 1)
    e = Expr.of(v0) * 16 * s + Expr.of(v1) * s + Expr.of(v0) * 16 + v1 + v2
    d = s * 32 + 32
    q, r = e // d, e % d
    assert str(q) == "((v0) // 2)"
    for n in (2, 3, 7):
        for point in itertools.product(range(4), range(16), range(n + 1)):
            env = {"s0": n, **dict(zip(("v0", "v1", "v2"), point))}
            assert (value(q, env), value(r, env)) == divmod(value(e, env), value(d, env))
    e2 = Expr.of(v0) * 16 * s + Expr.of(v0) * 16 + Expr.of(Var("v3", s + 1)) * 16 + Var("v4", 16)
    assert str(e2 // d) == "((v0) // 2)"  # the low 16 come off first, then v3 < s + 1
    with pytest.raises(NotSymbolic):  # v2 may reach s + 1: no exact split
        (Expr.of(v0) * s + Var("v3", s + 2)) // (s + 1)


def test_division_by_a_symbol_that_is_no_monomial_or_of_a_negative_value_raises_not_symbolic():
    s0, s1 = Expr.of(Sym("s0")), Expr.of(Sym("s1"))
    i, j = Var("i", s0), Var("j", s1)
    assert str(Expr.of(i) // (s0 + 1)) == "0"  # i < s0 + 1: exact
    with pytest.raises(NotSymbolic):  # not a product of symbols, and no exact split
        Expr.of(Var("k", s0 + 2)) // (s0 + 1)
    with pytest.raises(NotSymbolic):  # may be negative
        (Expr.of(i) - j) // s1
    assert str((Expr.of(i) + j) // s1) == "((i + j) // (s1))"  # exact where unprovable: an atom
    assert symbols_of(Expr.of(i) * s1) == {Sym("s1"), Sym("s0")}


@pytest.mark.parametrize("gemm", ["onednn", "auto"])
def test_linear_layers_with_a_symbolic_batch_run_as_the_chosen_library(gemm, compiles, fresh_dynamo):
    # cpu/claims.py: the product's library is chosen at the size hint and serves every size
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()
    f = torch.compile(mlp, backend="minicompile", dynamic=True)
    with patch(cpu_gemm=gemm), torch.no_grad():
        for batch in (5, 1, 8, 33):
            x = torch.randn(batch, 32)
            assert_matches_eager(f(x), mlp(x), atol=1e-5, rtol=1e-4)
    assert len(compiles) <= 2    # size 1 is specialised
    if gemm == "onednn":
        assert all("mkldnn._linear_pointwise" in c.wrapper_source for c in compiles)
