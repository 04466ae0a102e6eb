"""The op samples that drive the decomposition tests, as the op table's Samples.

Each sample's ``fn`` is an ATen overload, called with its inputs (tensors and the overload's
other arguments) and ``kwargs``; tests run the decomposition directly and through
trace_inference, and compare both with eager. The inputs are made once per ``samples(dtype)``
call, so the decomposition and eager see the same values.
"""
from __future__ import annotations

import torch

from minicompile.decomp import DECOMPOSITIONS
from tests.op_table import Sample

aten = torch.ops.aten


def sample(name: str, op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> Sample:
    return Sample(name, op, lambda: args, kwargs=kwargs or {})


def tensor(*shape, dtype=torch.float32, noncontig=False, low=None, high=None):
    """Random tensor; noncontig=True gives a transposed (non-contiguous) view of that shape."""
    if noncontig and len(shape) >= 2:
        return tensor(*shape[::-1], dtype=dtype, low=low, high=high).permute(*range(len(shape) - 1, -1, -1))
    t = torch.randn(*shape) if low is None else torch.empty(*shape).uniform_(low, high)
    return t.to(dtype)


def samples(dtype: torch.dtype) -> list[Sample]:
    T = lambda *s, **kw: tensor(*s, dtype=dtype, **kw)  # noqa: E731
    bf = dtype != torch.float32
    out = [
        # linalg
        sample("addmm", aten.addmm.default, (T(5), T(3, 4), T(4, 5, noncontig=True))),
        sample("addmm_beta_alpha", aten.addmm.default, (T(3, 5), T(3, 4), T(4, 5)), dict(beta=0.5, alpha=2.0)),
        sample("addmm_beta0_nan", aten.addmm.default, (torch.full((3, 5), float("nan"), dtype=dtype), T(3, 4), T(4, 5)), dict(beta=0)),
        sample("baddbmm", aten.baddbmm.default, (T(2, 3, 5), T(2, 3, 4), T(2, 4, 5)), dict(beta=0.5, alpha=1.5)),
        sample("addmv", aten.addmv.default, (T(3), T(3, 4), T(4)), dict(beta=2, alpha=0.5)),
        sample("mv", aten.mv.default, (T(3, 4, noncontig=True), T(4))),
        sample("dot", aten.dot.default, (T(7), T(7))),
        sample("matmul_3d_2d", aten.matmul.default, (T(2, 3, 4), T(4, 5))),
        sample("matmul_bcast", aten.matmul.default, (T(2, 1, 3, 4), T(5, 4, 2))),
        sample("matmul_bcast_noncontig", aten.matmul.default, (T(3, 4, noncontig=True), T(2, 4, 5, noncontig=True))),
        sample("matmul_1d_3d", aten.matmul.default, (T(4), T(2, 4, 3))),
        sample("matmul_3d_1d", aten.matmul.default, (T(2, 3, 4), T(4))),
        sample("matmul_1d_2d", aten.matmul.default, (T(4), T(4, 3))),
        sample("linear", aten.linear.default, (T(2, 1, 4), T(6, 4), T(6))),
        sample("linear_nobias_noncontig", aten.linear.default, (T(3, 4, noncontig=True), T(6, 4))),
        # norms
        sample("native_layer_norm", aten.native_layer_norm.default, (T(2, 1, 8), [8], T(8), T(8), 1e-5)),
        sample("native_layer_norm_2d_noaffine", aten.native_layer_norm.default, (T(3, 4, 5, noncontig=True), [4, 5], None, None, 1e-6)),
        sample("rms_norm", aten.rms_norm.default, (T(2, 3, 8), [8], T(8))),
        sample("rms_norm_eps_noweight", aten.rms_norm.default, (T(3, 1, 8, noncontig=True), [1, 8]), dict(eps=1e-3)),
        sample("fused_rms_norm", aten._fused_rms_norm.default, (T(2, 8), [8], T(8), None)),
        sample("bn_no_training", aten._native_batch_norm_legit_no_training.default,
               (T(2, 3, 4, 1), T(3), T(3), T(3), T(3, low=0.5, high=1.5), 0.1, 1e-5)),
        sample("native_batch_norm_eval", aten.native_batch_norm.default,
               (T(2, 3, 5, noncontig=True), None, T(3), T(3), T(3, low=0.5, high=1.5), False, 0.1, 1e-5)),
        sample("bn_legit_functional_eval", aten._native_batch_norm_legit_functional.default,
               (T(4, 3, 2), T(3), T(3), T(3), T(3, low=0.5, high=1.5), False, 0.1, 1e-5)),
        sample("bn_legit_eval", aten._native_batch_norm_legit.default,
               (T(4, 3), T(3), None, T(3), T(3, low=0.5, high=1.5), False, 0.1, 1e-5)),
        # activations
        sample("gelu", aten.gelu.default, (T(3, 1, 5),)),
        sample("gelu_tanh", aten.gelu.default, (T(3, 5, noncontig=True),), dict(approximate="tanh")),
        sample("silu", aten.silu.default, (T(4, 5),)),
        sample("mish", aten.mish.default, (T(4, 5) * 10,)),
        sample("softplus", aten.softplus.default, (T(4, 5) * 10, 2.0, 5.0)),
        sample("elu", aten.elu.default, (T(4, 5), 0.7, 1.2, 0.9)),
        sample("hardswish", aten.hardswish.default, (T(4, 5) * 4,)),
        sample("hardsigmoid", aten.hardsigmoid.default, (T(4, 5) * 4,)),
        sample("hardtanh", aten.hardtanh.default, (T(4, 5) * 2, -0.5, 1.5)),
        sample("leaky_relu", aten.leaky_relu.default, (T(4, 1, 5), 0.2)),
        sample("softmax", aten._softmax.default, (T(3, 1, 7), -1, False)),
        sample("softmax_dim0_noncontig", aten._softmax.default, (T(4, 6, noncontig=True), 0, False)),
        sample("log_softmax", aten._log_softmax.default, (T(3, 7), 1, False)),
        sample("safe_softmax_masked_row", aten._safe_softmax.default,
               (torch.tensor([[float("-inf")] * 3, [0.0, 1.0, float("-inf")]], dtype=dtype), -1)),
        # dropout (eval)
        sample("dropout_eval", aten.dropout.default, (T(3, 4), 0.5, False)),
        sample("native_dropout_eval", aten.native_dropout.default, (T(3, 4), 0.5, False)),
        sample("alpha_dropout_eval", aten.alpha_dropout.default, (T(3, 4), 0.5, False)),
        # bernoulli_ of a transposed tensor draws in memory order; p=1 makes the draws certain
        sample("bernoulli__transposed_p1", aten.bernoulli_.float, (T(3, 4, noncontig=True), 1.0)),
        # reductions
        sample("mean_all", aten.mean.default, (T(3, 1, 4, noncontig=True),)),
        sample("std_correction", aten.std.correction, (T(3, 5), [1]), dict(correction=1, keepdim=True)),
        sample("std_all_corr0", aten.std.correction, (T(3, 5),), dict(correction=0)),
        sample("std_mean", aten.std_mean.correction, (T(3, 5), [0]), dict(correction=1)),
        sample("logsumexp", aten.logsumexp.default, (T(3, 5), [1], False)),
        sample("logsumexp_inf", aten.logsumexp.default, (torch.tensor([[float("-inf")] * 2, [1.0, float("inf")]], dtype=dtype), [1], True)),
        # losses
        sample("mse_mean", aten.mse_loss.default, (T(3, 4), T(3, 4), 1)),
        sample("mse_none", aten.mse_loss.default, (T(3, 4), T(3, 4), 0)),
        sample("mse_sum", aten.mse_loss.default, (T(3, 4), T(3, 4), 2)),
        sample("nll_mean_ignore", aten.nll_loss_forward.default, (T(4, 5), torch.tensor([1, -100, 4, 0]), None, 1, -100)),
        sample("nll_weight_sum", aten.nll_loss_forward.default, (T(4, 5), torch.tensor([1, 2, 4, 0]), torch.rand(5).to(dtype), 2, -100)),
        sample("nll_weight_mean_ignore", aten.nll_loss_forward.default, (T(4, 5), torch.tensor([1, 2, 3, 0]), torch.rand(5).to(dtype), 1, 2)),
        sample("nll_none", aten.nll_loss_forward.default, (T(4, 5), torch.tensor([1, 2, 4, -100]), None, 0, -100)),
        sample("nll_unbatched", aten.nll_loss_forward.default, (T(5), torch.tensor(3), None, 1, -100)),
        sample("nll2d", aten.nll_loss2d_forward.default, (T(2, 5, 3, 1), torch.randint(0, 5, (2, 3, 1)), None, 1, -100)),
        # indexing
        sample("embedding", aten.embedding.default, (T(10, 4), torch.tensor([[1, 2], [9, 0]]))),
        # pointwise
        sample("addcmul", aten.addcmul.default, (T(3, 4), T(3, 1), T(4)), dict(value=0.5)),
        sample("addcdiv", aten.addcdiv.default, (T(3, 4), T(3, 4), T(4, 3, noncontig=True).t() + 3), dict(value=2)),
        sample("masked_fill_scalar", aten.masked_fill.Scalar, (T(3, 4), torch.rand(4) > 0.5, -7.0)),
        sample("masked_fill_tensor", aten.masked_fill.Tensor, (T(3, 4, noncontig=True), torch.rand(3, 4) > 0.5, torch.tensor(2.5))),
        sample("lerp_scalar_small", aten.lerp.Scalar, (T(3, 4), T(3, 4), 0.3)),
        sample("lerp_scalar_large", aten.lerp.Scalar, (T(3, 4), T(3, 4), 0.8)),
        sample("lerp_tensor", aten.lerp.Tensor, (T(3, 4), T(3, 4), T(4, low=-0.5, high=1.5))),
        sample("rsub_scalar", aten.rsub.Scalar, (T(3, 4), 1.0)),
        sample("rsub_scalar_alpha", aten.rsub.Scalar, (T(3, 4), 2.0, 3)),
        sample("rsub_tensor", aten.rsub.Tensor, (T(3, 4), T(4)), dict(alpha=2)),
        sample("pow_2", aten.pow.Tensor_Scalar, (T(3, 4, noncontig=True), 2)),
        sample("pow_half", aten.pow.Tensor_Scalar, (T(3, 4, low=0.1, high=3.0), 0.5)),
        sample("pow_3_core", aten.pow.Tensor_Scalar, (T(3, 4), 3)),
        # attention
        sample("sdpa", aten.scaled_dot_product_attention.default, (T(2, 3, 5, 8), T(2, 3, 6, 8), T(2, 3, 6, 4))),
        sample("sdpa_causal_scale", aten.scaled_dot_product_attention.default, (T(1, 2, 5, 8), T(1, 2, 7, 8), T(1, 2, 7, 8)),
               dict(is_causal=True, scale=0.3)),
        sample("sdpa_bool_mask", aten.scaled_dot_product_attention.default,
               (T(2, 2, 4, 8), T(2, 2, 4, 8), T(2, 2, 4, 8), torch.tensor([[1, 0, 1, 1]] * 3 + [[0, 0, 0, 0]], dtype=torch.bool))),
        sample("sdpa_float_mask", aten.scaled_dot_product_attention.default, (T(2, 2, 4, 8), T(2, 2, 4, 8), T(2, 2, 4, 8), T(1, 1, 4, 4))),
        sample("sdpa_gqa", aten.scaled_dot_product_attention.default, (T(1, 4, 3, 8), T(1, 2, 3, 8), T(1, 2, 3, 8)), dict(enable_gqa=True)),
        sample("sdpa_3d_noncontig", aten.scaled_dot_product_attention.default,
               (T(3, 4, 8, noncontig=True), T(3, 5, 8), T(3, 5, 8))),
        sample("flash_cpu", aten._scaled_dot_product_flash_attention_for_cpu.default, (T(1, 2, 5, 8), T(1, 2, 5, 8), T(1, 2, 5, 8)),
               dict(is_causal=True)),
        # backward ops (decomp/backward.py)
        sample("threshold_backward", aten.threshold_backward.default, (T(3, 4), T(3, 4, noncontig=True), 0.0)),
        sample("softmax_backward", aten._softmax_backward_data.default, (T(3, 5), T(3, 5).softmax(-1), 1, dtype)),
        sample("log_softmax_backward", aten._log_softmax_backward_data.default,
               (T(3, 5), T(3, 5).log_softmax(-1), -1, dtype)),
        sample("gelu_backward", aten.gelu_backward.default, (T(3, 4), T(3, 4))),
        sample("gelu_backward_tanh", aten.gelu_backward.default, (T(3, 4), T(3, 4)), dict(approximate="tanh")),
        sample("tanh_backward", aten.tanh_backward.default, (T(3, 4), T(3, 4).tanh())),
        sample("sigmoid_backward", aten.sigmoid_backward.default, (T(3, 4), T(3, 4).sigmoid())),
        sample("silu_backward", aten.silu_backward.default, (T(3, 4), T(3, 4, noncontig=True))),
        layer_norm_backward("layer_norm_backward", T(2, 3, 8), [8], T(8), T(8), [True, True, True]),
        layer_norm_backward("layer_norm_backward_2d_input_only", T(3, 4, 5), [4, 5], None, None, [True, False, False]),
    ]
    out += foreach_samples(dtype)
    out += model_backward_samples(dtype)
    if not bf:
        out += [
            sample("addmm_int", aten.addmm.default, (torch.randint(-5, 5, (3, 5)), torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 5)))),
            sample("pow_2_int", aten.pow.Tensor_Scalar, (torch.randint(-5, 5, (3, 4)), 2)),
            sample("pow_2_float_exp_on_int", aten.pow.Tensor_Scalar, (torch.randint(-5, 5, (3, 4)), 2.0)),
            sample("masked_fill_int", aten.masked_fill.Scalar, (torch.randint(-5, 5, (3, 4)), torch.rand(3, 4) > 0.5, 3)),
            sample("rsub_int", aten.rsub.Scalar, (torch.randint(-5, 5, (3, 4)), 1)),
            sample("native_layer_norm_3d_stats", aten.native_layer_norm.default, (T(2, 3, 4), [3, 4], None, T(3, 4), 1e-5)),
            sample("logsumexp_int", aten.logsumexp.default, (torch.randint(-3, 3, (3, 4)), [0], False)),
        ]
    return out


def layer_norm_backward(name: str, x, shape, weight, bias, mask) -> Sample:
    """native_layer_norm_backward with the mean and rstd eager's forward saves for ``x``."""
    _, mean, rstd = aten.native_layer_norm.default(x, shape, weight, bias, 1e-5)
    args = (torch.randn(x.shape).to(x.dtype), x, shape, mean, rstd, weight, bias, mask)
    return sample(name, aten.native_layer_norm_backward.default, args)


def model_backward_samples(dtype: torch.dtype) -> list[Sample]:
    """The backward ops of decomp/backward_training.py (batch norm, slicing, nll_loss, fused dropout)."""
    T = lambda *s, **kw: tensor(*s, dtype=dtype, **kw)  # noqa: E731
    x, w, stats = T(4, 3, 5), T(3), [T(3), T(3, low=0.5, high=1.5)]
    _, mean, invstd = aten.native_batch_norm.default(x, w, T(3), *[s.clone() for s in stats], True, 0.1, 1e-5)
    logp, target = T(4, 5).log_softmax(1), torch.tensor([1, -100, 4, 0])
    logp2d, target2d = T(2, 5, 3, 1).log_softmax(1), torch.tensor([[[1], [2], [-100]], [[4], [0], [3]]])
    _, mask = aten.native_dropout.default(T(3, 4), 0.3, True)
    return [
        sample("batch_norm_backward_train", aten.native_batch_norm_backward.default,
               (T(4, 3, 5), x, w, *stats, mean, invstd, True, 1e-5, [True, True, True])),
        sample("batch_norm_backward_eval_noaffine", aten.native_batch_norm_backward.default,
               (T(4, 3), T(4, 3, noncontig=True), None, *stats, None, None, False, 1e-5, [True, False, False])),
        sample("slice_backward", aten.slice_backward.default, (T(5, 4), [5, 7], 1, -4, 100, 1)),
        sample("select_backward", aten.select_backward.default, (T(7), [5, 7], 0, -1)),
        sample("nll_loss_backward_mean", aten.nll_loss_backward.default,
               (T(()), logp, target, None, 1, -100, torch.tensor(3.0, dtype=dtype))),
        sample("nll_loss_backward_none", aten.nll_loss_backward.default, (T(4), logp, target, None, 0, -100, T(()))),
        sample("nll_loss2d_backward_sum", aten.nll_loss2d_backward.default,
               (T(()), logp2d, target2d, None, 2, -100, torch.tensor(5.0, dtype=dtype))),
        sample("native_dropout_backward", aten.native_dropout_backward.default, (T(3, 4), mask, 1 / 0.7)),
    ]


def foreach_samples(dtype: torch.dtype) -> list[Sample]:
    """One sample per `_foreach_*` decomposition, its arguments made from the op's schema: each
    Tensor[] a list of three tensors of different shapes (one non-contiguous) with values in
    (0.1, 0.9), where every unary op (log, acos, ...) is defined; each Scalar[] three values;
    a Scalar 0.5; one Tensor a 0-d 0.5, or the 1-D per-element values of addcmul/addcdiv.Tensor.
    Arguments with a default keep it."""
    def make(arg):
        kind = str(arg.type)
        if kind == "List[Tensor]":
            return [tensor(*shape, dtype=dtype, low=0.1, high=0.9, noncontig=nc) for shape, nc in
                    (((3, 4), False), ((5,), False), ((2, 3), True))]
        if kind == "List[number]":
            return [0.25, 0.5, 0.75]
        if kind == "number":
            return 0.5
        if kind == "Tensor":
            return torch.tensor([0.25, 0.5, 0.75]) if arg.name == "scalars" else torch.tensor(0.5, dtype=dtype)
        raise TypeError(f"no sample value for {arg}")

    out = []
    for op in DECOMPOSITIONS:
        if op._schema.name.startswith("aten::_foreach_"):
            args = [a for a in op._schema.arguments if not a.has_default_value()]
            out.append(sample(f"{op._schema.name[6:]}.{op._overloadname}", op, tuple(make(a) for a in args)))
    signed = [tensor(3, 4, dtype=dtype), tensor(5, dtype=dtype, noncontig=True)]
    out += [sample(f"_foreach_norm_{order}", aten._foreach_norm.Scalar, (signed, order))
            for order in (float("inf"), 1, 0, 3)]
    return out
