"""The bug classes of testing/fuzz_classes.py on a real GPU (marked ``gpu``, skipped without one):
what the first CUDA run of that fuzzer found, each as a minimal program compared with eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minicompile.backend import minicompile_backend
from minicompile.config import patch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend=minicompile_backend)


def test_attention_mask_rows_keep_eager_padding():
    """Eager pads a float mask's rows to 16 elements before CUDA's memory-efficient attention,
    which rejects other strides; the extern gets the padded layout (fuzz seed 500000)."""
    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = (torch.randn(1, 4, n, 8, device="cuda") for n in (1, 3, 3))
    for mask in (torch.randn(1, 4, 1, 3, device="cuda"), torch.randn(2, 1, 5, 3, device="cuda")[:1, :, :1]):
        with patch(fallback_on_error=False):
            torch.testing.assert_close(_compiled(f)(q, k, v, mask), f(q, k, v, mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_draws_on_a_permuted_tensor_are_eager_draws(dtype):
    """CUDA's bernoulli_ fills a dense tensor in memory order, as the CPU's does: alpha dropout and
    empty_like(x.t()).bernoulli_ give eager's numbers and strides (fuzz seeds 500015, 500018)."""
    def f(x):
        y = x.permute(0, 3, 2, 1)
        return torch.empty_like(y).bernoulli_(0.7), F.alpha_dropout(y, 0.7, True)
    x = torch.randn(8, 3, 8, 4, device="cuda", dtype=dtype)
    torch.manual_seed(0)
    expected = f(x)
    compiled = _compiled(f)
    with patch(fallback_on_error=False):
        torch.manual_seed(0)
        got = compiled(x)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()


def test_item_equal_to_one_feeds_a_kernel():
    """Triton passes an int argument equal to 1 as a constexpr; a kernel reading a .item() size as a
    value must still compile (fuzz seed 500008: at call 2 the count was 1)."""
    def f(x):
        return x * (x > 0).sum().item() + x.max().item()
    with torch._dynamo.config.patch(capture_scalar_outputs=True), patch(fallback_on_error=False):
        compiled = _compiled(f)
        for data in ([[1.0, -2.0, -3.0]], [[1.0, 2.0, -3.0]], [[-1.0, -2.0, 0.5]]):
            x = torch.tensor(data, device="cuda")
            torch.testing.assert_close(compiled(x), f(x))


def test_a_kernel_writing_a_buffer_with_gaps_is_autotuned_on_a_copy_with_its_strides():
    """GPT-2's query: the bias add writes q into eager's strides for the attention extern, with
    gaps (a view of the fused qkv projection). Autotuning timed the kernel on a ``clone()``,
    contiguous, which the kernel wrote past its end: an illegal address, or wrong logits under
    CUDA_LAUNCH_BLOCKING (bench_gpu.py's GPT-2 rows, 2026-11-27)."""
    def f(x, w, b):
        q, k, v = (x @ w + b).split(64, dim=-1)
        q, k, v = (t.view(8, 128, 2, 32).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x, w, b = torch.randn(8, 128, 64, device="cuda"), torch.randn(64, 192, device="cuda"), torch.randn(192, device="cuda")
    with patch(fallback_on_error=False, triton_autotune=True):
        torch.testing.assert_close(_compiled(f)(x, w, b), f(x, w, b), atol=1e-4, rtol=1e-4)
