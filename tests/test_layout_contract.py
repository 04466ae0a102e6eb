"""Layouts are a contract (DESIGN.md): what observes a buffer's layout sees eager's.

An op that reads storage (``as_strided``, ``as_strided_scatter``) on a value computed from a
convolution sees eager's layout for it, though the channels-last passes would change it
(aot/layout_readers.py); every output has eager's strides."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.aot.layout_readers import relaid_storage_reader
from tests.helpers import assert_matches_eager

TOL = dict(rtol=1e-4, atol=1e-4)


class PaddedWindows(nn.Module):
    """Overlapping windows of a padded convolution output by two ``as_strided`` views, with
    strides that only eager's NCHW layout gives these values."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 24, 1, bias=False)

    def forward(self, x):
        y = F.pad(self.conv(x), [2, 2, 2, 2])                    # [2, 24, 20, 20], NCHW in eager
        a = torch.as_strided(y, (2, 24, 2, 20, 12), (24 * 400, 400, 160, 1, 20))
        return torch.as_strided(a, (2, 24, 2, 2, 12, 12), (24 * 400, 400, 160, 8, 20, 1)).clone()


class ScatterIntoConv(nn.Module):
    """``as_strided_scatter`` into a convolution's result: it writes elements by storage offset."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 24, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.as_strided_scatter(y, torch.ones(5), (5,), (3,), 7) * 2


class StridedConvMethod(nn.Module):
    """The method form, ``y.as_strided``, on a residual sum after a convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        y = self.conv(x) + x
        return y.as_strided((2, 16, 8, 8), (16 * 256, 256, 32, 2)).sigmoid()


MODELS = [PaddedWindows, ScatterIntoConv, StridedConvMethod]


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
def test_storage_reads_after_a_convolution_see_eager_layout_inference(model_cls, fresh_dynamo):
    torch.manual_seed(0)
    model, x = model_cls(), torch.randn(2, 16, 16, 16)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="minicompile")(x)
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
def test_storage_reads_after_a_convolution_see_eager_layout_training(model_cls, fresh_dynamo):
    torch.manual_seed(0)
    model, x = model_cls(), torch.randn(2, 16, 16, 16)

    def step(fn):
        xg = x.clone().requires_grad_(True)
        out = fn(xg)
        (out * torch.linspace(0, 1, out.numel()).view(out.shape)).sum().backward()
        grads = [xg.grad] + [p.grad for p in model.parameters()]
        model.zero_grad()
        return out, grads

    ref, ref_grads = step(model)
    out, grads = step(torch.compile(model, backend="minicompile"))
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()
    for g, r in zip(grads, ref_grads):
        assert_matches_eager(g, r, **TOL)
        assert g.stride() == r.stride()


def test_storage_readers_found_only_downstream_of_a_convolution():
    class InputWindows(nn.Module):   # as_strided of the graph's input, before the convolution
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 1)

        def forward(self, x):
            return self.conv(torch.as_strided(x, (2, 16, 8, 8), (16 * 256, 256, 32, 2)))

    assert relaid_storage_reader(torch.fx.symbolic_trace(InputWindows())) is None
    for model_cls in MODELS:
        reader = relaid_storage_reader(torch.fx.symbolic_trace(model_cls()))
        assert reader is not None and "as_strided" in str(reader.target), model_cls
