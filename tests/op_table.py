"""The shared correctness table: op samples every code generator is checked against eager with.

Each Sample is a function and a factory for its inputs (called fresh for each run, so
in-place samples see pristine inputs). Shapes are small so the Triton interpreter can run
the same table.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch._inductor.inductor_prims  # noqa: F401  defines prims::fma, which Dynamo emits for addcmul_
import torch.nn.functional as F


@dataclass
class Sample:
    name: str
    fn: Callable
    inputs: Callable           # () -> tuple of inputs
    atol: float = 1e-5
    rtol: float = 1e-5
    kwargs: dict = field(default_factory=dict)   # passed to fn after the inputs
    fixed: tuple = ()          # sizes fn hard-codes: the dynamic mode keeps them (tests/dynamic_table.py)


# The dynamic mode calls a sample at other sizes: each input size is looked up here (original
# size -> size at this call), so sizes equal in the sample stay equal, as broadcasting needs.
_SIZE_MAP: dict = {}


@contextlib.contextmanager
def resized(size_map: dict):
    """``sample.inputs()`` inside this block makes inputs with every size remapped by ``size_map``."""
    saved = dict(_SIZE_MAP)
    _SIZE_MAP.clear()
    _SIZE_MAP.update(size_map)
    try:
        yield
    finally:
        _SIZE_MAP.clear()
        _SIZE_MAP.update(saved)


def _g(*shape, dtype=torch.float32, low=None):
    shape = tuple(_SIZE_MAP.get(s, s) for s in shape)
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    if dtype.is_floating_point:
        t = torch.randn(*shape, generator=gen)
        if low is not None:
            t = t.abs() + low
        return t.to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape, generator=gen) > 0.5
    return torch.randint(-20, 20, shape, generator=gen).to(dtype)


def x(*shape, **kw):
    return lambda: (_g(*shape, **kw),)


def xy(a, b, **kw):
    return lambda: (_g(*a, **kw), _g(*b, **kw))


S = (8, 16)
SAMPLES = [
    # unary
    *[Sample(f"unary_{n}", f, x(*S)) for n, f in [
        ("exp", torch.exp), ("sin", torch.sin), ("cos", torch.cos), ("tanh", torch.tanh),
        ("sigmoid", torch.sigmoid), ("relu", torch.relu), ("abs", torch.abs), ("neg", torch.neg),
        ("erf", torch.erf), ("floor", torch.floor), ("ceil", torch.ceil), ("round", torch.round),
        ("trunc", torch.trunc), ("sign", torch.sign), ("expm1", torch.expm1), ("atan", torch.atan)]],
    *[Sample(f"unary_{n}", f, x(*S, low=0.1)) for n, f in [
        ("log", torch.log), ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("log1p", torch.log1p),
        ("reciprocal", torch.reciprocal), ("log2", torch.log2)]],
    # binary and ternary
    Sample("add_broadcast", lambda a, b: a + b, xy((8, 16), (16,))),
    Sample("sub_alpha", lambda a, b: torch.sub(a, b, alpha=2.5), xy(S, S)),
    Sample("mul_scalar", lambda a: a * 3.5 - 1, x(*S)),
    Sample("div", lambda a, b: a / b, lambda: (_g(*S), _g(*S, low=0.5))),
    Sample("pow_scalar", lambda a: a ** 3, x(*S)),
    Sample("pow_tensor", lambda a, b: torch.pow(a, b), lambda: (_g(*S, low=0.1), _g(*S))),
    Sample("square", lambda a: a ** 2 + a, x(*S)),
    Sample("maximum_minimum", lambda a, b: torch.maximum(a, b) - torch.minimum(a, b), xy(S, S)),
    Sample("remainder", lambda a, b: torch.remainder(a, b), lambda: (_g(*S), _g(*S, low=0.5) * -1)),
    Sample("fmod", lambda a, b: torch.fmod(a, b), lambda: (_g(*S), _g(*S, low=0.5))),
    Sample("floor_divide_float", lambda a, b: torch.floor_divide(a, b), lambda: (_g(*S), _g(*S, low=0.5))),
    Sample("atan2", torch.atan2, xy(S, S)),
    Sample("xlogy", torch.xlogy, lambda: (_g(*S).relu(), _g(16).abs() * torch.arange(16)), fixed=(16,)),
    Sample("compare", lambda a, b: ((a < b) & (a >= 0)) | (a == b), xy(S, S)),
    Sample("where", lambda a, b: torch.where(a > 0, a, b), xy(S, S)),
    Sample("fma", lambda a, b, c: torch.ops.prims.fma(a, b, c), lambda: (_g(*S), _g(*S) * 3, _g(S[-1]))),
    Sample("clamp", lambda a: torch.clamp(a, -0.5, 0.5), x(*S)),
    Sample("clamp_min_tensor", lambda a, b: torch.clamp(a, min=b), xy(S, (16,))),
    Sample("masked_fill", lambda a: a.masked_fill(a > 0.5, -1.0), x(*S)),
    Sample("logical", lambda a, b: torch.logical_xor(a > 0, b > 0) | torch.logical_not(a > b), xy(S, S)),
    Sample("chain", lambda a: ((a * 2 + 1).relu() * a).sin(), x(*S)),
    # dtypes and promotion
    Sample("bf16_add_mul", lambda a, b: a * b + a, xy(S, S, dtype=torch.bfloat16), 1e-2, 1e-2),
    Sample("fp16_exp", lambda a: torch.exp(a) * 2, x(*S, dtype=torch.float16), 1e-2, 1e-2),
    Sample("f64_sin", lambda a: a.sin() * a, x(*S, dtype=torch.float64), 1e-12, 1e-12),
    Sample("int64_arith", lambda a, b: a * b + 3 - b, xy(S, S, dtype=torch.int64)),
    Sample("int32_max", lambda a, b: torch.maximum(a, b) * 2, xy(S, S, dtype=torch.int32)),
    Sample("int_floor_divide_scalar", lambda a: torch.floor_divide(a, 3) + a % 4, x(*S, dtype=torch.int64)),
    Sample("bitwise", lambda a, b: (a & b) | (a ^ 5), xy(S, S, dtype=torch.int64)),
    Sample("bool_ops", lambda a, b: (a & ~b) | (a ^ b), xy(S, S, dtype=torch.bool)),
    Sample("promote_int_float", lambda a, b: a + b, lambda: (_g(*S, dtype=torch.int64), _g(*S))),
    Sample("int_truediv", lambda a: a / 3, x(*S, dtype=torch.int64)),
    Sample("to_dtype", lambda a: (a.to(torch.bfloat16).float() * 2).to(torch.int32), x(*S)),
    Sample("bool_to_float", lambda a: (a > 0).float() + 1, x(*S)),
    # reductions
    Sample("sum_last", lambda a: a.sum(-1), x(*S)),
    Sample("sum_first_keepdim", lambda a: a.sum(0, keepdim=True), x(*S)),
    Sample("sum_all", lambda a: a.sum(), x(64, 33)),
    Sample("sum_3d_middle", lambda a: a.sum(1), x(4, 6, 8)),
    Sample("mean", lambda a: a.mean(-1), x(*S)),
    Sample("var_std", lambda a: (a.var(-1), a.std(0, unbiased=False)), x(*S)),
    Sample("amax_amin", lambda a: (a.amax(-1), a.amin(0)), x(*S)),
    Sample("max_dim", lambda a: a.max(dim=1).values + a.min(dim=1).values, x(*S)),
    Sample("argmax_argmin", lambda a: (a.argmax(-1), a.argmin(0)), x(*S)),
    Sample("argmax_flat", lambda a: a.argmax(), x(*S)),
    Sample("prod", lambda a: a.prod(-1), x(4, 5)),
    Sample("any_all", lambda a: ((a > 1).any(-1), (a > -3).all(0)), x(*S)),
    Sample("sum_bool", lambda a: (a > 0).sum(-1), x(*S)),
    Sample("sum_int", lambda a: a.sum(0), x(*S, dtype=torch.int64)),
    Sample("bf16_sum", lambda a: a.sum(-1), x(*S, dtype=torch.bfloat16), 3e-2, 1e-2),
    Sample("sum_then_pointwise", lambda a: a - a.sum(-1, keepdim=True) / 16, x(*S)),
    # views
    Sample("transpose", lambda a: a.t() * 2, x(*S)),
    Sample("permute_3d", lambda a: a.permute(2, 0, 1).sin(), x(3, 4, 5)),
    Sample("slice_step", lambda a: a[1:7:2, ::3] + 1, x(*S)),
    Sample("select", lambda a: a[3] * a[:, -1].sum(), x(*S), fixed=(8,)),
    Sample("unsqueeze_expand", lambda a: a.unsqueeze(1).expand(-1, 4, -1) + 0.5, x(*S)),
    Sample("view_merge", lambda a: (a + 1).view(-1) * 2, x(*S)),
    Sample("view_split", lambda a: (a * 2).reshape(2, 4, 4, 4).sum(2), x(*S), fixed=S),
    Sample("reshape_of_transpose", lambda a: a.t().reshape(-1).cos(), x(*S)),
    Sample("flatten_cat", lambda a, b: torch.cat([a.flatten(), b.flatten()]) * 2, xy(S, (3, 5))),
    Sample("split_chunk", lambda a: [t * i for i, t in enumerate(a.chunk(4, dim=1))], x(*S)),
    Sample("unbind", lambda a: sum(t * t for t in a.unbind(0)), x(4, 16)),
    Sample("narrow", lambda a: a.narrow(1, 3, 5).exp(), x(*S), fixed=(16,)),
    Sample("cat_dim1", lambda a, b: torch.cat([a, b.relu()], dim=1), xy(S, (8, 5))),
    Sample("pad", lambda a: F.pad(a, (1, 2, 0, 3), value=0.5), x(*S)),
    Sample("pad_negative", lambda a: F.pad(a, (-2, 1)), x(*S)),
    Sample("squeeze", lambda a: a.unsqueeze(0).squeeze(0) + a.view(a.shape[0], 1, a.shape[1]).squeeze(1), x(*S)),
    Sample("repeat", lambda a: a.repeat(2, 1, 3) * 2, x(1, 8, 5)),
    Sample("repeat_expand_rank", lambda a, b: a[:, :1].repeat(3, 1, 4) + b, xy(S, (3, 8, 4)), fixed=(3, 4)),
    Sample("roll", lambda a: torch.roll(a, (3, -5), (0, 1)).exp(), x(*S)),
    Sample("roll_flat", lambda a: torch.roll(a.relu(), 7) + 1, x(*S)),
    # a reshape of a permute: loops split where the indices divide them (Swin's patch merging)
    Sample("patch_merge", lambda a: (a + 1).view(2, 2, 2, 2, 2, 4).permute(0, 1, 3, 4, 2, 5).reshape(2, 4, 16)
           .softmax(-1), x(2, 16, 4), fixed=(2, 16, 4)),
    Sample("max_pool2d", lambda a: F.max_pool2d(torch.relu(a * 2 - 0.5), 3, 2, 1), x(2, 3, 9, 8)),
    Sample("max_pool2d_ceil", lambda a: F.max_pool2d(a, 2, 3, 1, ceil_mode=True), x(1, 2, 8, 7)),
    Sample("max_pool2d_dilated", lambda a: F.max_pool2d(a, (3, 2), (1, 2), (1, 0), dilation=(2, 1)), x(1, 2, 9, 8)),
    Sample("max_pool2d_nan", lambda a: F.max_pool2d(torch.where(a > 1.5, torch.nan, a), 2), x(2, 2, 8, 8)),
    # creation
    Sample("arange", lambda a: a + torch.arange(16, device=a.device), x(*S), fixed=(16,)),
    Sample("zeros_ones_full", lambda a: torch.zeros_like(a) + torch.ones_like(a) * torch.full_like(a, 3.0), x(*S)),
    # composites
    Sample("softmax", lambda a: torch.softmax(a, -1), x(*S)),
    Sample("softmax_dim0", lambda a: torch.softmax(a, 0), x(*S)),
    Sample("log_softmax", lambda a: torch.log_softmax(a, -1), x(*S)),
    Sample("layer_norm", lambda a, w, b: F.layer_norm(a, a.shape[-1:], w, b), lambda: (_g(*S), _g(16), _g(16))),
    Sample("gelu", lambda a: F.gelu(a), x(*S)),
    Sample("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), x(*S)),
    Sample("silu", F.silu, x(*S)),
    Sample("hardswish", F.hardswish, x(*S)),
    Sample("mse_loss", F.mse_loss, xy(S, S)),
    Sample("linear", lambda a, w, b: F.linear(a, w, b).relu(), lambda: (_g(*S), _g(4, 16), _g(4)), 1e-4, 1e-4),
    Sample("matmul_softmax", lambda a, b: torch.softmax(a @ b, -1), xy((8, 16), (16, 8)), 1e-5, 1e-4),
    Sample("inplace_input", lambda a: a.add_(1).mul_(2), x(*S)),
    Sample("extern_cumsum", lambda a: torch.cumsum(a, 1) * 2, x(*S)),
    Sample("empty_tensor", lambda a: (a * 2).sum(0), x(0, 4)),
    Sample("scalar_tensor", lambda a: a * 2 + 1, lambda: (torch.tensor(3.0),)),
]
