import os
import tempfile

import pytest
import torch

# Tests see compiler errors instead of the eager fallback users get.
os.environ.setdefault("MINICOMPILE_FALLBACK", "0")
# Every test run builds into its own cache directory unless one is given.
os.environ.setdefault("MINICOMPILE_CACHE_DIR", os.path.join(tempfile.gettempdir(), "minicompile-test-cache"))
# Eager's first OpenMP parallel region in a process sometimes computes its second thread's share
# of sin/cos/exp ~1e-4 off (torch 2.13 CPU build, about 1 fresh process in 10; docs/testing.md):
# run one before any test takes an eager reference.
torch.exp(torch.randn(1 << 17))


def assert_close_like_eager(out, ref, atol=1e-5, rtol=1e-5):
    """Same structure, dtype, shape, values (NaN where eager has NaN) and, for dense outputs, strides."""
    if isinstance(ref, (list, tuple)):
        assert isinstance(out, (list, tuple)) and len(out) == len(ref)
        for o, r in zip(out, ref):
            assert_close_like_eager(o, r, atol, rtol)
        return
    if not isinstance(ref, torch.Tensor):
        assert out == ref
        return
    assert isinstance(out, torch.Tensor), type(out)
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if ref.numel() and ref.is_contiguous() or ref.is_contiguous(memory_format=torch.channels_last):
        assert out.stride() == ref.stride(), (out.stride(), ref.stride())
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, equal_nan=True)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
