"""aot/strides.py: our copy of TensorIterator's output-stride rule, checked against eager."""
from __future__ import annotations

import itertools

import pytest
import torch

from minicompile.aot.strides import _promoted, eager_elementwise_strides


def layouts(shape, dtype=torch.float32):
    """Values of ``shape`` viewed contiguous, transposed, stepped, expanded and channels_last."""
    n = len(shape)

    def make(s):
        return (torch.randn(s) * 3).to(dtype)
    yield make(shape)
    if n >= 2:
        yield make(shape[::-1]).permute(*reversed(range(n)))
        yield make(shape[:-1] + (1,)).expand(shape)
        yield make(shape[:-1] + (2 * shape[-1],))[..., ::2]
        yield make((1,) + shape[1:]).expand(shape)
    if n == 4:
        yield make(shape).contiguous(memory_format=torch.channels_last)


def predicted(out, *operands, skip_first=False):
    return eager_elementwise_strides(tuple(out.shape), _promoted(list(operands), out.dtype, skip_first))


@pytest.mark.parametrize("shape", [(5,), (6, 4), (3, 1, 4), (2, 3, 4, 5), (2, 1, 1, 3)])
def test_binary_strides_match_eager(shape):
    for a, b in itertools.product(list(layouts(shape)), repeat=2):
        assert predicted(torch.add(a, b), a, b) == torch.add(a, b).stride(), (a.stride(), b.stride())


BINARY = [torch.add, torch.mul, torch.div, torch.lt, torch.eq, torch.maximum, torch.atan2, torch.pow,
          torch.logical_and, torch.fmod, torch.remainder]
DTYPES = [(torch.float32, torch.float64), (torch.bfloat16, torch.float32), (torch.int64, torch.float32),
          (torch.bfloat16, torch.bfloat16), (torch.int64, torch.int64)]


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_mixed_dtype_strides_match_eager(dtypes):
    # on CPU an input of another dtype is converted first, and the copy of a non-dense input
    # is contiguous: that decides the output's order
    for shape in [(6, 4), (3, 1, 5)]:
        for a, b in itertools.product(list(layouts(shape, dtypes[0])), list(layouts(shape, dtypes[1]))):
            for op in BINARY:
                try:
                    out = op(a, b)
                except RuntimeError:  # e.g. an integer op refusing a dtype: nothing to compare
                    continue
                assert predicted(out, a, b) == out.stride(), (op.__name__, a.stride(), b.stride())


def test_unary_of_integer_input_and_ternary():
    for x in layouts((6, 4), torch.int64):
        assert predicted(torch.sin(x), x) == torch.sin(x).stride()
    x = torch.randn(4, 3).t()
    row = torch.randn(4, dtype=torch.float64)
    cond = torch.rand(3, 4) > 0.5
    assert predicted(torch.add(x, row), x, row) == torch.add(x, row).stride()
    out = torch.where(cond, row, x)
    assert predicted(out, cond, row, x, skip_first=True) == out.stride()


@pytest.mark.parametrize("device, expected", [("cpu", (3, 1)), ("cuda", (1, 8))])
def test_mixed_dtype_strides_follow_the_device(device, expected):
    # CPU converts an input of another dtype into a contiguous copy first; CUDA converts inside
    # its kernel, so the expanded input keeps stride 0 and the transposed one decides the order
    # (measured on an H200: (1, 8); fuzzer seed 223). Fake tensors need no GPU.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicompile.aot.strides import restride_elementwise
    mode = FakeTensorMode()
    with mode:
        a = torch.empty(8, 1, device=device).expand(8, 3)
        b = torch.empty(3, 8, dtype=torch.float64, device=device).t()
    gm = make_fx(lambda a, b: a * b, tracing_mode="fake")(a, b)
    restride_elementwise(gm, mode)
    (out,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert out.meta["val"].stride() == expected


_SEEN_STRIDES = []


@torch.library.custom_op("minicompile_test::record_strides", mutates_args=())
def record_strides(x: torch.Tensor) -> torch.Tensor:
    _SEEN_STRIDES.append(x.stride())
    return x * 2


@record_strides.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@pytest.mark.parametrize("pad", [13, 5])
def test_an_extern_gets_eager_padded_strides(pad):
    """An extern reads its input with the strides eager gave it, gaps included: CUDA's attention
    kernels reject a mask that is not padded to 16 elements per row, as eager pads it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicompile.pipeline import compile_graph

    def f(x):
        return record_strides(torch.nn.functional.pad(x.sin(), (0, pad))[..., :3])

    x = torch.randn(2, 4, 3)
    gm = make_fx(f, tracing_mode="fake")(x)
    compiled = compile_graph(gm, [x])
    _SEEN_STRIDES.clear()
    got = compiled(x)
    eager = f(x)
    torch.testing.assert_close(got, eager)
    assert _SEEN_STRIDES[0] == _SEEN_STRIDES[1] == ((3 + pad) * 4, 3 + pad, 1), _SEEN_STRIDES


def test_attention_bias_rows_are_aligned_as_eager_pads_them():
    """CUDA's memory-efficient attention needs bias strides that are multiples of 16 bytes; the
    wrapper passes its bias through aligned_rows (the same tensor when aligned, else a padded copy)."""
    from minicompile.runtime.extern_args import aligned_rows

    compact = torch.randn(1, 4, 1, 3)
    got = aligned_rows(compact)
    assert got.stride() == (16, 4, 4, 1) and torch.equal(got, compact)
    aligned = torch.randn(2, 3, 8)
    assert aligned_rows(aligned) is aligned
    half = torch.randn(2, 5, dtype=torch.float16)
    assert aligned_rows(half).stride() == (8, 1) and torch.equal(aligned_rows(half), half)
    broadcast = torch.randn(1, 1, 8).expand(2, 4, 8)
    assert aligned_rows(broadcast) is broadcast
