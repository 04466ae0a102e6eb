"""aot/strides.py: our copy of TensorIterator's output-stride rule, checked against eager."""
from __future__ import annotations

import itertools

import pytest
import torch

from minicompile.aot.strides import eager_elementwise_strides


def layouts(shape):
    """The same values of ``shape`` viewed contiguous, transposed, stepped, expanded and channels_last."""
    n = len(shape)
    yield torch.randn(shape)
    if n >= 2:
        yield torch.randn(shape[::-1]).permute(*reversed(range(n)))
        yield torch.randn(shape[:-1] + (1,)).expand(shape)
        yield torch.randn(shape[:-1] + (2 * shape[-1],))[..., ::2]
        yield torch.randn((1,) + shape[1:]).expand(shape)
    if n == 4:
        yield torch.randn(shape).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("shape", [(5,), (6, 4), (3, 1, 4), (2, 3, 4, 5), (2, 1, 1, 3)])
def test_binary_strides_match_eager(shape):
    for a, b in itertools.product(list(layouts(shape)), repeat=2):
        expected = torch.add(a, b).stride()
        assert eager_elementwise_strides(shape, [a, b]) == expected, (a.stride(), b.stride())


def test_broadcast_of_lower_rank_and_ternary():
    x = torch.randn(4, 3).t()
    row = torch.randn(4)
    cond = torch.rand(3, 4) > 0.5
    assert eager_elementwise_strides((3, 4), [x, row]) == torch.add(x, row).stride()
    assert eager_elementwise_strides((3, 4), [cond, row, x]) == torch.where(cond, row, x).stride()
