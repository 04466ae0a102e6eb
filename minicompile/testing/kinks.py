"""Activations that lie within rounding of a kink, and float64 runs that put them on the other side.

A ReLU input at -3e-7 among values up to 5 is below float32's resolution there: two float32
computations of the same model (eager NCHW, eager channels-last, ours) can put it on either side
of 0, and whichever side lets the gradient through moves a whole channel's gradients by far
more than rounding. A float64 referee takes one side; ``tie_hooks`` finds such inputs (module
activations only: a functional F.relu in a forward is not seen) and ``flip`` makes a float64 run
take the other side for one of them, by moving that element to its mirror image across the kink.

    found = record(model64)          # hooks; run a forward, then
    ties = found.ties()              # [(module name, call, flat index, kink)], closest first
    flip(model64_copy, ties[0])      # that copy's forward now crosses the kink at that element
"""
from __future__ import annotations

import torch
import torch.nn as nn

TIE = 1e-6        # within this fraction of the activation's largest input magnitude: a tie
MAX_TIES = 4      # the closest ones tried
_BY_NAME = {"HardSwish": (-3.0, 3.0), "HardSigmoid": (-3.0, 3.0)}   # timm's own classes


def kinks(module: nn.Module) -> tuple | None:
    """Where a piecewise-linear activation's derivative jumps, or None."""
    if isinstance(module, nn.Hardtanh):            # ReLU6 too
        return (float(module.min_val), float(module.max_val))
    if isinstance(module, (nn.ReLU, nn.LeakyReLU)):
        return (0.0,)
    if isinstance(module, (nn.Hardswish, nn.Hardsigmoid)):
        return (-3.0, 3.0)
    return _BY_NAME.get(type(module).__name__)


class record:
    """Forward pre-hooks on every kinked activation of ``model``: each call's distances to its kinks."""

    def __init__(self, model: nn.Module):
        self.found = []      # (relative distance, module name, call, flat index, kink)
        self.handles = []
        for name, module in model.named_modules():
            points = kinks(module)
            if points is not None:
                self.handles.append(module.register_forward_pre_hook(self._hook(name, points)))

    def _hook(self, name, points):
        calls = [0]

        def hook(module, args):
            x = args[0].detach().flatten()
            scale = float(x.abs().max()) or 1.0
            for k in points:
                dist = (x - k).abs()
                near = torch.nonzero(dist <= TIE * scale).flatten()[:MAX_TIES]
                self.found += [(float(dist[i]) / scale, name, calls[0], int(i), k) for i in near]
            calls[0] += 1
        return hook

    def ties(self) -> list:
        for h in self.handles:
            h.remove()
        return [t[1:] for t in sorted(self.found)[:MAX_TIES]]


def flip(model: nn.Module, tie: tuple) -> nn.Module:
    """``model`` whose activation ``tie`` names takes that element to the other side of its kink."""
    name, call, index, kink = tie
    calls = [0]

    def hook(module, args):
        x = args[0]
        if calls[0] == call:
            move = torch.zeros(x.shape, dtype=x.dtype, device=x.device)   # logical order, as the index
            move.view(-1)[index] = 2 * (kink - x.detach().reshape(-1)[index])
            x = x + move
        calls[0] += 1
        return (x,) + tuple(args[1:])
    dict(model.named_modules())[name].register_forward_pre_hook(hook)
    return model
