"""Loss functions: mse_loss, nll_loss (1-d, 2-d and N-d targets).

cross_entropy is CompositeImplicitAutograd: the dispatcher turns it into _log_softmax +
nll_loss_forward / nll_loss2d_forward (+ pointwise ops for label smoothing or soft
targets), and those are decomposed here and in activations.py.
"""
from __future__ import annotations

import torch

from minicompile.decomp.precision import scalar_like, to_dtype, where_scalar
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten

# at::Reduction enum values, as passed to the aten loss ops.
REDUCTION_NONE, REDUCTION_MEAN, REDUCTION_SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == REDUCTION_NONE:
        return loss
    if reduction == REDUCTION_SUM:
        return aten.sum.default(loss)
    return aten.mean.dim(loss, list(range(loss.dim())), False)


@register_decomposition(aten.mse_loss.default)
def mse_loss(self, target, reduction=REDUCTION_MEAN):
    diff = aten.sub.Tensor(self, target)
    return _reduce(aten.mul.Tensor(diff, diff), reduction)


@register_decomposition([aten.nll_loss_forward.default, aten.nll_loss2d_forward.default])
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    """Returns (loss, total_weight) like eager; class dim is 1 (0 for an unbatched input)."""
    unbatched = self.dim() == 1
    if unbatched:
        self, target = aten.unsqueeze.default(self, 0), aten.unsqueeze.default(target, 0)
    keep = aten.ne.Scalar(target, ignore_index)
    # Ignored positions may hold any value (e.g. -100): point them at class 0 so gather
    # and the weight lookup stay in bounds, then zero them with where (not a multiply,
    # which would let a NaN/inf logit at class 0 leak through).
    safe_target = where_scalar(keep, target, 0)
    picked = aten.squeeze.dim(aten.gather.default(self, 1, aten.unsqueeze.default(safe_target, 1)), 1)
    if weight is None:
        w = to_dtype(keep, self.dtype)
    else:
        w = where_scalar(keep, aten.index.Tensor(weight, [safe_target]), 0)
    loss = where_scalar(keep, aten.mul.Tensor(aten.neg.default(picked), w), 0)
    if reduction == REDUCTION_NONE:
        out = aten.squeeze.dim(loss, 0) if unbatched else loss
        # Eager leaves total_weight unused (a 0-d tensor) without reduction.
        return out, scalar_like(0, self)
    total_weight = aten.sum.default(w)
    loss_sum = aten.sum.default(loss)
    if reduction == REDUCTION_SUM:
        return loss_sum, total_weight
    return aten.div.Tensor(loss_sum, total_weight), total_weight
