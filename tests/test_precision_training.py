"""Training reductions as accurate as eager's: distance to a float64 run, ours against eager's.

A BatchNorm, LayerNorm or GroupNorm backward and a convolution's bias and weight gradients sum
over N*H*W; summed one float32 at a time into one accumulator (a channels-last column sum over
8192 rows) they drift far more than eager's blocked sums (codegen/cpp_sums.py).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from minicompile.testing.precision import float64_distances


def _compiled(m):
    torch._dynamo.reset()
    return torch.compile(m, backend="minicompile")


class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


def conv_bn_relu_stack(c=16):
    """A stem conv-BN-ReLU, a depthwise conv-BN-ReLU, squeeze-excite and a pointwise conv-BN."""
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.ReLU(),
                         SqueezeExcite(c), nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))


class Norms(nn.Module):
    def __init__(self, c=16, w=32):
        super().__init__()
        self.bn, self.gn, self.ln = nn.BatchNorm2d(c), nn.GroupNorm(4, c), nn.LayerNorm(w)

    def forward(self, x):
        return self.ln(self.gn(self.bn(x) * 1.5 + 0.5))


CASES = {   # model, input: N*H*W = 4096 per channel, offset inputs (a sum's hard case)
    "conv_bn_relu": (conv_bn_relu_stack, (4, 3, 32, 32), torch.contiguous_format),
    "conv_bn_relu_channels_last": (conv_bn_relu_stack, (4, 3, 32, 32), torch.channels_last),
    "norms_channels_last": (Norms, (4, 16, 32, 32), torch.channels_last),
}


@pytest.mark.parametrize("case", [c if c == "conv_bn_relu" else pytest.param(c, marks=pytest.mark.slow)
                                  for c in sorted(CASES)])   # slow: two more training compiles, ~10 s each
def test_training_gradients_as_close_to_float64_as_eager(case):
    make, shape, layout = CASES[case]
    torch.manual_seed(0)
    model = make().train()
    if layout is torch.channels_last:
        model = model.to(memory_format=layout)
    x = (torch.randn(shape) + 2.0).contiguous(memory_format=layout)
    dist = float64_distances(model, x, _compiled)
    assert dist["ours"] <= 1.5 * dist["eager"] + 1e-7, dist


def test_channels_last_batch_norm_bias_gradient_sums_in_blocks():
    # MobileNetV2's symptom, minimal: a BatchNorm's bias gradient over 8192 channels-last rows
    # summed into one float per channel was 1e-6 from float64 (eager: 3e-8)
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(16).train()
    x = torch.randn(8, 16, 32, 32).contiguous(memory_format=torch.channels_last) + 3.0
    g = torch.rand(8, 16, 32, 32).contiguous(memory_format=torch.channels_last) + 0.5

    def bias_grad(fn, dtype):
        b = bn.to(dtype)
        b.zero_grad()
        fn(x.to(dtype)).backward(g.to(dtype))
        return b.bias.grad.double().clone()

    exact = bias_grad(bn, torch.float64)
    eager = bias_grad(bn, torch.float32)
    ours = bias_grad(_compiled(bn), torch.float32)
    err = lambda t: ((t - exact).norm() / exact.norm()).item()
    assert err(ours) <= 2 * err(eager) + 1e-8, (err(ours), err(eager))


def test_sum_fused_with_a_channels_last_operand_stays_close_to_float64():
    # the loop gathers y across its layout, so it does not vectorise: one float32 chain per block
    t = torch.linspace(-1, 1, 65536, dtype=torch.float64).view(4, 16, 32, 32).float()
    y = torch.randn(4, 16, 32, 32).contiguous(memory_format=torch.channels_last)
    fn = lambda t, y: (t.sum((0, 2, 3)), (t * y).sum((0, 2, 3)))
    exact = t.double().sum((0, 2, 3))
    err = lambda s: ((s.double() - exact).norm() / exact.norm()).item()
    torch._dynamo.reset()
    assert err(torch.compile(fn, backend="minicompile")(t, y)[0]) <= 2 * err(t.sum((0, 2, 3))) + 1e-8
