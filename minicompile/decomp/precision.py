"""Dtype helpers shared by decompositions.

Eager computes most bf16/fp16 kernels in float32 ("opmath") and rounds once at the end;
decompositions that would otherwise round after every step upcast first and cast back.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

LOW_PRECISION = (torch.bfloat16, torch.float16)


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW_PRECISION else dtype


def to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


def upcast(x: torch.Tensor) -> torch.Tensor:
    return to_dtype(x, opmath_dtype(x.dtype))


def scalar_like(value, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A 0-d tensor on x's device, for where() branches that are a constant."""
    return aten.scalar_tensor.default(value, dtype=dtype or x.dtype, device=x.device)


def where_scalar(cond: torch.Tensor, a: torch.Tensor, value) -> torch.Tensor:
    """where(cond, a, value): keep a where cond holds, else the constant (in a's dtype)."""
    return aten.where.self(cond, a, scalar_like(value, a))


def fill_where(cond: torch.Tensor, value, a: torch.Tensor) -> torch.Tensor:
    """where(cond, value, a): the constant (in a's dtype) where cond holds, else a."""
    return aten.where.self(cond, scalar_like(value, a), a)
