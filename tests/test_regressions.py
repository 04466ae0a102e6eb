"""Regression tests for miscompilations and crashes found by the OpInfo sweep and the fuzzer.

Each test names what broke; ``check`` compiles through the real pipeline and compares with
eager exactly as the sweep does (make_fx over fake tensors, compare's per-dtype tolerances).
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from minicompile.config import patch
from minicompile.testing.compare import TOLERANCES
from tests import helpers

check = functools.partial(helpers.check, trace="fake", tolerances=TOLERANCES)


def test_reductions_over_empty_tensors():
    # scheduler/kernel.py unflatten divided by a zero-size range (ZeroDivisionError in Expr.__mod__)
    def fn(x):
        return torch.var(x, unbiased=False), x.sum(-1), x.sum(0)
    for shape in [(0,), (0, 3), (3, 0)]:
        check(fn, torch.randn(shape))


def test_reshape_of_empty_tensor():
    # lowering/views.py view() took an index modulo a zero-size dimension
    check(lambda x: x.reshape(-1) * 2, torch.randn(3, 0, 9))


def test_empty_pointwise_beside_reduction_over_empty_dim():
    # scheduler/kernel.py plan_kernel divided by an empty reduction's inner size when fusing
    def fn(x, m):
        return x * m, torch.all(m, 0), torch.logical_not(m)
    check(fn, torch.randint(-5, 5, (0, 1, 5, 2)), torch.rand(0, 1, 5, 1) < 0.5)


def test_normalization_over_empty_dim():
    def fn(x):
        return (x - x.mean(0, keepdim=True)) * torch.rsqrt(x.var(0, keepdim=True, unbiased=False) + 1e-5)
    check(fn, torch.randn(0, 9, dtype=torch.bfloat16))


def test_as_strided_of_input_with_storage_offset():
    # as_strided counts from the storage start; an input's kernel pointer already includes its
    # offset, so the view read the wrong elements (OpInfo as_strided.partial_views)
    base = torch.randn(20)
    x = base[5:15]
    compiled = check(lambda x: torch.as_strided(x, (2, 2), (1, 2), 0) * 2, x)
    assert any("as_strided" in e.reason for e in compiled.externs)


def test_softmax_of_transposed_input_has_eager_strides():
    # the softmax decomposition kept the input's permuted strides; eager returns contiguous
    x = torch.randn(9, 6).t()
    check(lambda x: (torch.softmax(x, 1), torch.log_softmax(x, 0)), x)


def test_softmax_over_empty_tensor():
    # the decomposition's amax over an empty dim raised where eager returns an empty tensor
    x = torch.randn(0, 5, 7)
    check(lambda x: (torch.softmax(x, 0), torch.log_softmax(x, 1)), x)


def test_bf16_intermediate_is_rounded_before_a_float32_op():
    # sin(bf16) fused into maximum(float32, .) used the unrounded float32 sine (fuzzer seed 100318)
    x = torch.randn(1, 7, 1, 7).to(torch.bfloat16)
    y = torch.randn(1, 7, 1, 7)
    check(lambda x, y: (torch.maximum(y, torch.sin(x)), torch.sin(x).sum(-1, dtype=torch.float32)), x, y)


def test_layer_norm_of_transposed_input_is_contiguous_like_eager():
    # fuzzer seed 100349: eager's layer_norm kernel writes a contiguous output
    x = torch.randn(9, 6, dtype=torch.float64).t()
    check(lambda v: torch.nn.functional.layer_norm(v, v.shape[-1:]), x)


def test_no_fused_multiply_add_changes_exact_cancellation():
    # fuzzer seed 100504: with FMA contraction x*y - round(x*y) is not 0, so the variance of one
    # element came out finite instead of NaN
    x = torch.randn(6, 1, 7, 4, dtype=torch.float64)
    fn = lambda v: torch.var((v - v.mean(0, keepdim=True)) * torch.rsqrt(v.var(0, keepdim=True, unbiased=False) + 1e-5), 1, keepdim=True)
    check(fn, x)


def test_value_realized_for_an_extern_keeps_eager_strides():
    # fuzzer seed 102003 (batched): an output also read by an extern call was given memory with
    # contiguous strides instead of eager's
    a = torch.randn(6, 1).to(torch.bfloat16).expand(6, 4)
    b = torch.randn(4, 6).to(torch.bfloat16).t()
    check(lambda v0, v1: (lambda s: (s, torch.cumsum(s, 0)))(torch.add(v1, v0)), a, b)


def test_constant_row_normalizes_to_exact_zero():
    # fuzzer seed 103623: an expanded (constant) row must have mean exactly its value, as eager's
    # Welford kernel gives; floor() then sees 0, not -1e-8
    x = torch.randn(1).expand(7)
    check(lambda v: torch.floor(torch.nn.functional.layer_norm(v, v.shape[-1:])), x)


def test_bf16_add_of_expanded_and_transposed_has_eager_strides():
    # fake tensors run bf16 add through a float32 conversion that made the expanded input
    # contiguous: the output got strides (4, 1) where eager's TensorIterator gives (1, 6)
    a = torch.randn(4, 6, dtype=torch.bfloat16).t()
    b = torch.randn(6, 1, dtype=torch.bfloat16).expand(6, 4)
    c = check(lambda x, y: (torch.add(y, x), torch.sub(x, y), torch.mul(x, y)), a, b)
    assert c(a, b)[0].stride() == torch.add(b, a).stride() == (1, 6)


def test_fuzzer_stride_seeds():
    # the four output-stride mismatches of the 10,000-program run (docs/testing.md)
    from minicompile.testing.fuzz import check_batch, generate
    for seed in (100256, 102003, 103812, 109758):
        assert check_batch([generate(seed)]) is None, seed


def test_extern_result_is_conformed_to_the_layout_kernels_read():
    # kernels index an extern's result with the traced strides; if eager picks others at
    # run time the wrapper copies it into the traced layout instead of misreading it
    c = check(lambda x: torch.cumsum(x, 0) * 2, torch.randn(4, 3).t())
    assert "conform(" in c.wrapper_source
    ns: dict = {}
    exec(c.wrapper_source, ns)
    t = torch.randn(4, 3).t()
    fixed = ns["conform"](t, (3, 4), (4, 1))
    assert fixed.stride() == (4, 1) and torch.equal(fixed, t)
    assert ns["conform"](t, (3, 4), (1, 3)) is t


def test_float_to_int_of_nan_and_out_of_range_matches_eager():
    # fuzzer seed 205468: var of an empty tensor is NaN; NaN * 4 cast to int64 was folded to
    # 0 by the C++ compiler (undefined behaviour) where eager gives the type's minimum
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e19, -1e19, 2.7, -2.7, -2147483648.0])
    check(lambda v: (v.to(torch.int64), v.to(torch.int32), v.double().to(torch.int32)), x)
    check(lambda v: (torch.var(v, 0, keepdim=True) * 4).to(torch.int64), torch.randn(0))


def test_exp_special_values_and_range_match_eager():
    # codegen's inline mc_exp: -inf -> 0, inf -> inf, NaN -> NaN, overflow, denormal results
    special = torch.tensor([-float("inf"), float("inf"), float("nan"), 88.72, 88.73, -87.5, -103.5, -110.0, 0.0, -0.0])
    x = torch.cat([special, torch.linspace(-105, 89, 4001), torch.randn(1000) * 10])
    check(lambda v: (torch.exp(v), torch.sigmoid(v), torch.softmax(v.view(-1, 5011), -1)), x)


def test_causal_softmax_with_masked_rows_matches_eager():
    # half the exp inputs are -inf; a fully masked row gives NaN in eager and here
    s = torch.randn(2, 16, 16)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    mask[3] = False
    check(lambda v, m: torch.softmax(v.masked_fill(~m, float("-inf")), -1), s, mask)


def test_division_by_a_constant_is_not_a_reciprocal_multiply():
    # fuzzer seed 201828: the mean of a constant float64 row became sum * (1/3), not sum / 3,
    # so x - mean was 3.5e-14 instead of 0 and a later `> 0` picked the other branch
    from minicompile.testing.fuzz import check_batch, generate
    assert check_batch([generate(201828)]) is None
    x = torch.full((3,), 0.1, dtype=torch.float64)
    check(lambda v: (v - v.mean(0, keepdim=True), v / 3, torch.softmax(v.view(1, 3), -1)), x)


def test_inline_sin_cos_match_eager_in_and_beyond_their_range():
    # codegen's mc_sin_fast/mc_cos_fast reduce with a short pi/2: a row holding an argument
    # beyond MC_TRIG_MAX (131072) is redone with the library's sin/cos
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e30, -3e5, 131071.9, 131072.5])
    x = torch.cat([special, torch.linspace(-2e5, 2e5, 20001), torch.randn(5000) * 10])
    fn = lambda v: ((torch.sin(v) * 2.0 + 1.0).relu() * torch.cos(v), torch.sin(v), torch.cos(v))
    c = check(fn, x)
    assert "= mc_sin_fast(" in c.kernel_source and "> MC_TRIG_MAX" in c.kernel_source
    check(lambda v: 1 / torch.sin(v), torch.tensor([-0.0, 0.0, 1.0]))  # sin(-0) is -0: -inf here
    rows = torch.randn(4, 300) * 4
    rows[2, 7] = 5e6  # only this row takes the library path
    check(fn, rows.t())
    check(fn, x.to(torch.bfloat16))


def test_sin_in_reductions_uses_the_library_and_in_place_sin_matches_eager():
    # the redo is only sound for a pure map: a reduction loop keeps std::sin
    x = torch.randn(8, 64) * 1e6
    c = check(lambda v: torch.sin(v).sum(-1), x)
    assert "= mc_sin_fast(" not in c.kernel_source and "std::sin(" in c.kernel_source
    check(lambda v: v.sin_() * 2, x.clone())


def test_softmax_keeps_its_exp_row_in_the_output_and_matches_eager():
    # codegen/cpp.py _output_row: the scratch row lives in the output row when that is sound
    x = torch.randn(64, 300)
    c = check(lambda v: torch.softmax(v, -1), x)
    assert "the output row, written over in place" in c.kernel_source
    c = check(lambda v: (torch.softmax(v, -1), torch.log_softmax(v, -1), torch.softmax(v.t(), -1)), x)
    c = check(lambda v: torch.softmax(v, -1).to(torch.bfloat16), x)  # other type: its own array
    assert "the output row, written over in place" not in c.kernel_source
    mask = torch.rand(64, 300) > 0.5
    check(lambda v, m: torch.softmax(v.masked_fill(m, float("-inf")), -1) * 2 + v, x, mask)


def test_negated_negative_infinity_constant_compiles():
    # cpp_ops.literal wrote -inf as "-std::numeric_limits<float>::infinity()", and neg's template
    # "(-{0})" made it "--std::..." (a C++ syntax error)
    check(lambda x: x + torch.full_like(x, float("-inf")).neg(), torch.randn(8))


def test_eval_batch_norm_of_a_permuted_input_has_eagers_strides():
    # eager allocates batch_norm's output in the input's suggested memory format; the
    # decomposition's elementwise ops followed the permuted input's strides instead
    aten = torch.ops.aten
    x = torch.randn(3, 5, 2).permute(2, 1, 0)
    stats = (torch.randn(5), torch.rand(5) + 0.5, torch.randn(5), torch.randn(5))
    check(lambda x, m, v, w, b: aten.native_batch_norm.default(x, w, b, m, v, False, 0.1, 1e-5)[0], x, *stats)


def test_fusion_never_closes_a_cycle_through_other_kernels():
    # fuzzer seed 600369: a buffer joined a kernel it shares only an input with, while a kernel it
    # reads from already depended on that kernel (a cycle between kernels, not between buffers)
    def fn(v0, v1):
        return (v1[0::2], torch.nn.functional.layer_norm(v0, v0.shape[-1:]), v1.unsqueeze(0),
                v0.expand(3, *v0.shape), torch.log_softmax(v0, 0))
    check(fn, torch.randn(2, 8).to(torch.bfloat16), torch.randint(-5, 6, (1,)))


@pytest.mark.parametrize("exponent", [2.0, 3.0, 3, -1.0, -2.0])
def test_pow_by_the_exponents_eager_special_cases_is_bit_equal_and_multiplies(exponent):
    # decomp/pointwise.py: x*x*x, not a vector powf (25 ns a float in GPT-2's tanh GELU)
    x = torch.randn(4096) * 10
    x[:5] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])
    c = helpers.compile_fn(lambda t: torch.pow(t, exponent) + 1, x)
    assert torch.equal(c(x).nan_to_num(7.0), (torch.pow(x, exponent) + 1).nan_to_num(7.0))
    assert "pow" not in c.kernel_source


def test_sums_over_expanded_dimensions_are_one_multiply():
    # training fuzzer seed 7200129: the mean of an expanded (stride 0) row was a chain of float32
    # additions, 1 ulp off the row's value where eager's is exact; normalising the row then gave
    # rounding noise instead of zeros, and minimum() routed its gradient differently (252 apart)
    from minicompile.testing.fuzz_train import check_inputs

    def program(v0, v1):
        v4 = (v1 - v1.mean(1, keepdim=True)) * torch.rsqrt(v1.var(1, keepdim=True, unbiased=False) + 1e-5)
        return (torch.minimum(torch.ge(v0, v1), v4),)
    g = torch.Generator().manual_seed(0)
    row = torch.randn(5, 1, generator=g, dtype=torch.float64).float()
    assert check_inputs(program, [torch.randn(5, 8, generator=g), row.expand(5, 8)]) is None

    def sums(x, b, i):
        return (x - x.mean(1, keepdim=True), x.sum((0, 1)), x.sum(1), b.sum(-1), i.sum(0, keepdim=True),
                x.sum(-1, keepdim=True))
    x = (torch.randn(1, 1, 7, generator=g) * 3).expand(6, 24, 7)
    b, i = torch.randn(4, 1, generator=g).bfloat16().expand(4, 9), torch.randint(-9, 9, (1, 3), generator=g).expand(11, 3)
    got, eager = torch.compile(sums, backend="minicompile")(x, b, i), sums(x, b, i)
    wide = sums(x.double(), b.double(), i)
    for k, (a, e, w) in enumerate(zip(got, eager, wide)):   # as close to float64 as eager, or closer
        assert a.dtype == e.dtype and ((a.double() - w).abs() <= (e.double() - w).abs()).all(), k
    assert not got[0].any()   # a row minus its own mean
    empty = torch.randn(6, 1, 1, 1).expand(6, 1, 1, 0)   # fuzz_dynamic seed 7110196: read past an empty row
    torch.testing.assert_close(torch.compile(lambda e: (e.mean(3), e.sum(3)), backend="minicompile")(empty),
                               (empty.mean(3), empty.sum(3)), equal_nan=True)
    # copies of -0.0 sum to +0.0, as a sum from +0.0 does
    signs = torch.compile(lambda z: (1 / z.sum(1), 1 / z.mean(1)), backend="minicompile", dynamic=True)
    for n in (5, 7):
        z = torch.tensor([[-0.0]]).expand(3, n)
        assert all((s == torch.inf).all() for s in signs(z)), n


def test_embedding_rejects_a_negative_index_as_eager_does():
    # decomp/indexing.py lowered embedding to index.Tensor, which wraps -1 to the last row: the
    # compiled lookup returned a row where eager's embedding (index_select) raises IndexError
    emb = torch.nn.Embedding(10, 4)
    fn = torch.compile(lambda ids: emb(ids) * 2, backend="minicompile")
    with torch.no_grad():
        ids = torch.tensor([[1, 2], [3, 9]])
        assert torch.equal(fn(ids), emb(ids) * 2)
        for bad in ([[1, -1], [3, 9]], [[1, 10], [3, 9]]):
            with pytest.raises(IndexError):
                emb(torch.tensor(bad))
            with pytest.raises(IndexError):
                fn(torch.tensor(bad))


def test_gathers_at_computed_positions_are_index_math():
    # lowering/gathers.py: Hugging Face's masks index a tensor with aranges (x[batch_idx, q_idx]);
    # those read x at an index expression, no extern call; indices from memory, or ones that may
    # be out of bounds, are read and checked by the kernel as eager checks them (tests/test_gathers_memory.py)
    def masks(x, cs):
        b, q, k = torch.arange(4)[:, None, None, None], torch.arange(8)[None, None, :, None], torch.arange(8)
        pos = torch.arange(8).unsqueeze(0).expand(4, -1)
        return ((pos[b, k] <= pos[b, q]) & (cs[b, q] == cs[b, k]), x[:, torch.arange(3) * 2 + 1],
                x.index_select(1, torch.arange(5) + 1), x[:, :, torch.arange(3) - 5],
                x[torch.arange(4)[:, None], :, torch.arange(2)], x[None, 1:3, torch.arange(2) * -1 + 1])
    x, cs = torch.randn(4, 6, 5), torch.randint(0, 3, (4, 8)).cumsum(-1)
    c = check(masks, x, cs)
    assert not c.externs, c.explain()
    c = check(lambda x: (x[:, torch.arange(5) // 2], x[torch.where(torch.arange(4) > 1, torch.arange(4), 0)]), x)
    assert not c.externs, c.explain()   # floor division, where: not index expressions, read from memory
    check(lambda s: s.index_select(0, torch.arange(1)), torch.tensor(3.0))   # a 0-d input (OpInfo's sample)
    c = check(lambda x, i: (x[:, i], x.index_select(2, i + 2)), x, torch.tensor([0, -1, 2]))
    assert not c.externs, c.explain()
    for past_the_end in (lambda x: x[:, torch.arange(6) + 1], lambda x: x.index_select(2, torch.arange(5) - 5)):
        with pytest.raises(IndexError):
            past_the_end(x)
        with pytest.raises(IndexError):
            torch.compile(past_the_end, backend="minicompile")(x)


def test_extern_index_put_with_a_none_index():
    # runtime/extern_args.fast_call called torch's binding for index_put, which rejects a None in
    # its index list; the op takes it. x[:, i]'s backward is index_put(g, [None, i]) (Falcon's rotary)
    check(lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, True) * 2,
          torch.randn(4, 6), torch.tensor([1, 3]), torch.randn(4, 2))
    x, i = torch.randn(4, 6, requires_grad=True), torch.tensor([1, 3, 1])
    torch.compile(lambda x: x[:, i].sin(), backend="minicompile")(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ops.aten.index_put(torch.zeros(4, 6), [None, i], x.detach()[:, i].cos(), True))


def test_an_extern_whose_binding_defaults_differ_from_its_schema_gets_the_schema_defaults():
    """torch._C._nn.soft_margin_loss(a, b) reduces nothing; the op's schema default is the mean. The
    wrapper calls the binding with the schema's defaults spelled out (training: the forward and backward
    of a mean and an unreduced loss in one graph raised 'an extern returned size (5,), compiled for ()')."""
    def f(a, b, c, d):
        return F.soft_margin_loss(a, b, reduction="none"), F.soft_margin_loss(c, d), F.smooth_l1_loss(c, d)
    args = [torch.randn(5, requires_grad=True), torch.randn(5), torch.randn(5, requires_grad=True), torch.randn(5)]
    with patch(fallback_on_error=False):
        got = torch.compile(f, backend="minicompile")(*args)
    expected = f(*args)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and torch.allclose(g, e)
    sum(o.sum() for o in got).backward()
