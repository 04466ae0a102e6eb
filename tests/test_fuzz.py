"""CI run of the random-program fuzzer (the long run: docs/testing.md)."""
from __future__ import annotations

import os

import pytest

from minicompile.codegen import BACKENDS
from minicompile.config import patch
from minicompile.testing.fuzz import generate, run, shrink

pytestmark = pytest.mark.two_threads   # parallel code under test: two threads on a test worker too (conftest.py)

CI_PROGRAMS = int(os.environ.get("MINICOMPILE_FUZZ_N", "200"))


def test_fuzzed_programs_match_eager(tmp_path):
    failures = run(seed=0, n=CI_PROGRAMS, batch=25, repro_dir=str(tmp_path), log=lambda *a: None)
    assert not failures, "fuzzed programs disagree with eager; reproducers:\n" + "\n".join(
        open(p).read() for p in failures[:3])


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
def test_fuzzed_programs_match_eager_through_triton(tmp_path):
    # the Triton generator in its interpreter: a slice of the run in docs/triton.md (other seeds)
    with patch(cpu_backend="triton"):
        failures = run(seed=900000, n=40, batch=20, repro_dir=str(tmp_path), log=lambda *a: None)
    assert not failures, "fuzzed programs disagree with eager through Triton; reproducers:\n" + "\n".join(
        open(p).read() for p in failures[:3])


def test_generation_is_deterministic():
    assert generate(123).function_source() == generate(123).function_source()
    assert generate(123).reproducer() == generate(123).reproducer()


def test_reproducer_is_standalone_python():
    src = generate(7).reproducer("example")
    compile(src, "repro.py", "exec")
    assert "def make_input" in src and "def program" in src


def test_shrink_returns_passing_program_unchanged():
    prog = generate(5)
    small, msg = shrink(prog)
    assert msg is None and small is prog


def test_a_value_computed_in_float32_is_judged_at_float32s_tolerance():
    """Seed 7020615 reads float64 but takes erf in float32 (1 ulp from eager's there) and returns
    it widened: the judge's floor is the least precise dtype the program computes, not only reads.
    A program computing in float64 keeps float64's tolerance."""
    import torch

    from minicompile.testing.fuzz import _precision_floor, check_batch
    assert check_batch([generate(7020615)]) is None
    x = [torch.randn(3, dtype=torch.float64)]
    assert _precision_floor(x) is torch.float64
    assert _precision_floor(x, lambda v: torch.erf(v.float()).double()) is torch.float32
    assert _precision_floor(x, lambda v: torch.erf(v) + 1) is torch.float64
