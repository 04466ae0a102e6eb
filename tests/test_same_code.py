"""Kernels with the same code are built once (codegen/same_code.py): a repeated layer's kernels
refer to the first layer's (C++: forwarders; Triton: the same function), and the results stay
eager's. Kernels that differ in anything but their buffers (a constant, a size) keep their own code."""
import pytest
import torch

from minicompile.codegen import BACKENDS
from minicompile.config import patch

from tests.helpers import check, compile_fn


def layers(x, w0, w1, w2):
    """Three product-LayerNorm-ReLU-residual layers (a block's shape): the product is a library
    call, so each layer's LayerNorm-ReLU is a kernel, the same loop nest on other buffers."""
    for w in (w0, w1, w2):
        x = torch.relu(torch.nn.functional.layer_norm(x @ w, x.shape[-1:])) * 2 + x
    return x


def test_a_repeated_layer_is_built_once_and_matches_eager():
    torch.manual_seed(0)
    c = check(layers, torch.randn(8, 64), *(torch.randn(64, 64) / 8 for _ in range(3)))
    source = c.kernel_source
    assert c.num_kernels == 3, c.explain()
    assert source.count("// the same code as kernel0") == 2, source
    assert source.count("#pragma omp") == source.split("kernel1")[0].count("#pragma omp"), \
        "the forwarders have loops of their own"


def scaled_layers(x, w):
    """The same layer three times with another constant each: nothing to share."""
    for scale in (2.0, 3.0, 4.0):
        x = torch.relu(torch.nn.functional.layer_norm(x @ w, x.shape[-1:])) * scale + x
    return x


def test_kernels_that_differ_in_a_constant_or_a_size_keep_their_own_code():
    torch.manual_seed(0)
    c = check(scaled_layers, torch.randn(8, 64), torch.randn(64, 64) / 8)
    assert "the same code as" not in c.kernel_source, c.kernel_source

    def two_sizes(a, b):
        return torch.relu(a) * 2, torch.relu(b) * 2   # one kernel each: 64 and 96 elements
    c = check(two_sizes, torch.randn(64), torch.randn(96))
    assert "the same code as" not in c.kernel_source, c.kernel_source


def test_a_repeated_kernel_over_symbolic_sizes_passes_its_own_sizes(compiles, fresh_dynamo):
    """With symbolic sizes the forwarder passes its size arguments on, in its own order."""
    torch.manual_seed(0)
    ws = [torch.randn(40, 40) / 6 for _ in range(3)]
    compiled = torch.compile(layers, backend="minicompile", dynamic=True)
    for rows in (6, 11, 3):
        y = torch.randn(rows, 40)
        torch.testing.assert_close(compiled(y, *ws), layers(y, *ws))
    assert len(compiles) == 1 and "int64_t s" in compiles[0].kernel_source, compiles
    assert "the same code as" in compiles[0].kernel_source, compiles[0].kernel_source


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
def test_triton_binds_a_repeated_kernel_to_the_first_function():
    """In the interpreter (CPU tensors): one @triton.jit function for the three layers."""
    torch.manual_seed(0)
    with patch(cpu_backend="triton"):
        c = check(layers, torch.randn(4, 16), *(torch.randn(16, 16) / 4 for _ in range(3)))
        source = c.kernel_source
        assert c.backend == "triton" and c.num_kernels == 3, c.explain()
        assert source.count("@triton.jit\ndef kernel") == 1 and source.count("= kernel0_sum  # the same code as kernel0_sum") == 2, source
        c = check(scaled_layers, torch.randn(4, 16), torch.randn(16, 16) / 4)
        assert c.kernel_source.count("@triton.jit\ndef kernel") == 3, c.kernel_source
