"""The prelude's inline float32 math (runtime/include/minicompile_prelude.h) against float64.

mc_erf replaces glibc's vector erff in generated kernels; it must stay within a couple of ulp
of the exact value everywhere and keep eager's -0 / inf / NaN results. The sweeps run the
compiled kernel (so the vectorised code is what is measured) over float32 bit patterns and
compare with torch's float64 erf, in ulps of the float32 result.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from minicompile.testing.compare import TOLERANCES
from tests import helpers

check = functools.partial(helpers.check, trace="fake", tolerances=TOLERANCES)
aten = torch.ops.aten
MAX_ERF_ULP = 1.5  # measured 1.456 over every float32 (near |x| = 1.5, where the halves meet)


def _float32_sweep(stride: int, start: int = 0) -> torch.Tensor:
    """Every ``stride``-th finite positive float32 bit pattern (denormals included), both signs."""
    bits = torch.arange(start, 0x7F800000, stride, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    return torch.cat([x, -x])


def _max_ulp_error(got: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """Largest |got - erf(x)| in ulps of the float32 nearest erf(x), and the x where it is."""
    ref = torch.erf(x.double())
    _, exp = torch.frexp(ref)
    ulp = torch.ldexp(torch.ones_like(ref), (exp - 24).clamp_min(-149))
    err = (got.double() - ref).abs() / ulp
    i = int(err.argmax())
    return float(err[i]), float(x[i])


def _compiled_erf(x: torch.Tensor):
    compiled = helpers.compile_fn(lambda v: torch.erf(v), x, trace="fake")
    return compiled, compiled(x)


def test_erf_is_inline_and_within_two_ulp_on_a_dense_sweep():
    x = torch.cat([_float32_sweep(4099), torch.linspace(-5, 5, 200001)])
    compiled, got = _compiled_erf(x)
    assert "mc_erf(" in compiled.kernel_source
    err, where = _max_ulp_error(got, x)
    assert err <= MAX_ERF_ULP, f"{err:.3f} ulp at x={where!r}"


@pytest.mark.slow
def test_erf_within_two_ulp_on_every_61st_float():
    for start in range(0, 61 * 8, 61):  # in eight parts, to bound the memory
        x = _float32_sweep(61 * 8, start)
        err, where = _max_ulp_error(_compiled_erf(x)[1], x)
        assert err <= MAX_ERF_ULP, f"{err:.3f} ulp at x={where!r}"


def test_erf_special_values_match_eager():
    tiny = torch.finfo(torch.float32).tiny
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, tiny / 3, -tiny,
                            1.5, -1.5, 1.5000001, 3.9, 3.95, 3.96, 10.0, -1e30, 3.4e38, -3.4e38])
    _, got = _compiled_erf(special)
    want = torch.erf(special)
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok].signbit(), want[ok].signbit())  # erf(-0) is -0
    assert torch.equal(got[ok][2:4], want[ok][2:4])  # +-inf -> +-1 exactly
    err, where = _max_ulp_error(got[ok], special[ok])
    assert err <= MAX_ERF_ULP, f"{err:.3f} ulp at x={where!r}"
    check(torch.erf, special)


def test_gelu_forward_and_backward_with_inline_erf_match_eager():
    # not +inf: eager's gelu gives NaN there (its erf is 1 - t p(t) exp(-x^2) with t = 1/inf)
    x = torch.cat([torch.randn(4000) * 3, torch.tensor([0.0, -0.0, -math.inf, math.nan, -30.0, 30.0, -5.6, 5.6])])
    g = torch.randn_like(x)
    c = check(lambda v: F.gelu(v), x)
    assert "mc_erf(" in c.kernel_source
    assert torch.equal(c(x)[-4:-2], F.gelu(x)[-4:-2]) and c(x)[-4].signbit()  # gelu(-30) is -0
    check(lambda v, w: aten.gelu_backward(w, v), x, g)
    check(lambda v: F.gelu(v), x.to(torch.bfloat16))
    check(lambda v: torch.erf(v), x.double())  # float64 stays with the library


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_by_3_and_minus_1_and_2_are_eager_products_bit_for_bit(dtype):
    x = torch.cat([torch.randn(5000, dtype=torch.float64) * torch.exp(torch.randn(5000, dtype=torch.float64) * 4),
                   torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e-40, -1e-40, 1e20, -1e20])]).to(dtype)
    for exponent in (3, 3.0, -2, -1, -1.0):
        c = helpers.compile_fn(functools.partial(torch.pow, exponent=exponent), x, trace="fake")
        assert "std::pow" not in c.kernel_source
        assert torch.equal(c(x), torch.pow(x, exponent)), exponent
