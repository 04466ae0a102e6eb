"""How far any float32 computation of a model may land from float64: float64 runs with one float32
rounding's worth of noise at every layer.

A float32 implementation rounds every layer's output and every input gradient it passes back.
Where a model is badly conditioned (a BatchNorm over a channel that a 1x1 convolution made
nearly a multiple of another, so its gradient exists only through ``eps``), those roundings move
a gradient by 1e-4 or more, and two correct float32 implementations (eager NCHW, eager
channels-last, ours) land at different distances from float64: one realisation of that noise
can be 4x another's. A judge that compares ours with eager's one realisation then reports a
correct program.

``jitter`` hooks a float64 model so that each leaf module's output, and the gradient it passes
back, is multiplied by ``1 + u * 2**-24`` (``u`` uniform in [-1, 1], a seeded draw): the
noise of rounding to float32 and nothing else. Its distance from the plain float64 run is the
spread any float32 implementation of the same layers has. For a well-conditioned tensor it is
about float32's resolution (1e-7 to 1e-6), so it excuses nothing a real bug would cause.

    model64 = build().double()
    jitter(model64, seed=1)        # then run the step as the plain float64 run does, and compare
"""
from __future__ import annotations

import torch
import torch.nn as nn

HALF_ULP = 2.0 ** -24     # float32's unit roundoff


class _Jitter(torch.autograd.Function):
    """Multiplies by ``1 + u * HALF_ULP`` going forward and going back (independent draws)."""

    @staticmethod
    def forward(ctx, x, generator):
        ctx.generator = generator
        return x * _noise(x, generator)

    @staticmethod
    def backward(ctx, grad):
        return grad * _noise(grad, ctx.generator), None


def _noise(t: torch.Tensor, generator) -> torch.Tensor:
    u = torch.rand(t.shape, generator=generator, dtype=t.dtype, device=t.device) * 2 - 1
    return 1 + HALF_ULP * u


def jitter(model: nn.Module, seed: int) -> list:
    """Forward hooks on every leaf module of a float64 ``model``; returns the hook handles."""
    generator = torch.Generator().manual_seed(seed)

    def hook(module, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return _Jitter.apply(out, generator)
        return out
    return [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
