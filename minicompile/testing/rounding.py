"""How far eager float32 lands from float64 on a badly conditioned step: more than one draw.

Where a model is badly conditioned (a BatchNorm over a channel that a 1x1 convolution made
nearly a multiple of another, so its gradient exists only through ``eps``), float32's roundings
move a gradient by 1e-4 or more, and two correct float32 implementations (eager NCHW, eager
channels-last, ours) land at different distances from float64: one draw of that noise can be
10x another's. A judge that compares ours with eager's one draw then reports a correct program.

``nudge`` moves each element of a float32 input one float32 step up or down, or leaves it (a
seeded draw). The step's exact result barely moves (the float64 runs on the nudged and the
original input agree to about 1e-6 of such a gradient), but every rounding eager makes on the
way lands elsewhere: eager float32 on a nudged input, against float64 on the same nudged input,
is another draw of eager's own error. On a well-conditioned tensor every draw is within float32's
resolution (1e-7 to 1e-6), so the draws excuse nothing a real bug would cause.

    x1 = nudge(x, seed=1)        # then run eager float32 and float64 on x1, and compare
"""
from __future__ import annotations

import torch


def nudge(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` (float32) with each element one float32 step up, one down, or kept, at random."""
    g = torch.Generator().manual_seed(seed)
    way = torch.randint(-1, 2, x.shape, generator=g)
    up, down = torch.nextafter(x, torch.full_like(x, float("inf"))), torch.nextafter(x, torch.full_like(x, float("-inf")))
    return torch.where(way > 0, up, torch.where(way < 0, down, x)).contiguous(memory_format=_format(x))


def _format(x: torch.Tensor):
    return torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
        and not x.is_contiguous() else torch.contiguous_format
