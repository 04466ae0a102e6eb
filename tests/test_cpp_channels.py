"""Per-channel values of C++ pointwise kernels computed once before the loops (codegen/cpp_channels.py)."""
import pytest
import torch

from minicompile.config import patch
from tests.helpers import check

pytestmark = pytest.mark.two_threads   # parallel code under test: two threads on a test worker too (conftest.py)


def batch_norm_silu(x, mean, var, weight, bias):
    """Inference BatchNorm of NHWC data (channels innermost), then SiLU."""
    y = (x - mean) * (weight / torch.sqrt(var + 1e-5)) + bias
    return y * torch.sigmoid(y)


def _channels(c: int):
    torch.manual_seed(0)
    return [torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)]


def test_batch_norm_scale_and_shift_are_computed_per_channel_not_per_element():
    with patch(cpu_backend="cpp"), torch.no_grad():
        src = check(batch_norm_silu, torch.randn(2, 6, 5, 24), *_channels(24)).kernel_source
    kernel = src[src.index("extern"):]
    assert "float tmp" in kernel and "_c[24];" in kernel
    loops = kernel[kernel.index("#pragma omp"):]        # the kernel's own loops: no sqrt left there
    assert "sqrt" not in loops and "_c[x" in loops


def test_short_or_once_run_loops_keep_their_values_inline():
    with patch(cpu_backend="cpp"), torch.no_grad():
        flat = check(batch_norm_silu, torch.randn(2, 24), *_channels(24)).kernel_source   # 2 repeats
        assert "_c[" not in flat
        wide = check(batch_norm_silu, torch.randn(4, 4096), *_channels(4096)).kernel_source  # 4096 > max
        assert "_c[" not in wide


def test_a_channel_buffer_the_kernel_writes_is_not_read_ahead():
    def scale_in_place(x, s):
        s.mul_(2)                      # the kernel writes s: its loads cannot move before the loops
        return x * torch.sqrt(s)
    with patch(cpu_backend="cpp"), torch.no_grad():
        check(scale_in_place, torch.randn(8, 16), torch.rand(16) + 0.1)


def nchw_batch_norm_relu(x, mean, var, weight, bias):
    """Inference BatchNorm of NCHW data (channels in the middle loop), then ReLU."""
    def ch(t):
        return t.view(1, -1, 1, 1)
    return torch.relu((x - ch(mean)) * (ch(weight) / torch.sqrt(ch(var) + 1e-5)) + ch(bias))


def test_values_per_channel_of_nchw_data_are_computed_once_per_channel():
    # the channel is an outer loop's variable here: the sqrt still runs once per channel
    with patch(cpu_backend="cpp"), torch.no_grad():
        src = check(nchw_batch_norm_relu, torch.randn(2, 24, 6, 40), *_channels(24)).kernel_source
    kernel = src[src.index("extern"):]
    assert "_c[24];" in kernel
    loops = kernel[kernel.index("#pragma omp"):]
    assert "sqrt" not in loops and "_c[x1]" in loops


def test_bfloat16_values_are_per_channel_and_not_rounded_twice():
    # a bf16 graph converts every op's result to bf16 (to(bf16) then relu's own rounding): a
    # value rounded once is not rounded again, and the bf16 channel loads move out of the loops
    channels = [t.to(torch.bfloat16) for t in _channels(24)]
    x = torch.randn(2, 6, 5, 24).to(torch.bfloat16)

    def bn_relu(x, mean, var, weight, bias):
        return torch.relu(torch.nn.functional.batch_norm(x.permute(0, 3, 1, 2), mean, var, weight, bias,
                                                         False, 0.0, 1e-5))
    with patch(cpu_backend="cpp"), torch.no_grad():
        src = check(bn_relu, x, *channels, atol=1e-2, rtol=1e-2).kernel_source
    loops = src[src.index("#pragma omp"):]
    assert "sqrt" not in loops and "_c[x" in loops
    assert loops.count("mc_round_bf16") == 2      # batch_norm's result and relu's (it was 3)
