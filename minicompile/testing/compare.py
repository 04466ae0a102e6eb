"""Compare a compiled result with eager's: structure, dtype, device, shape, strides, then values.

Values get per-dtype tolerances, TOLERANCES unless the caller passes its own; NaN and inf must
sit at the same positions. Strides are compared where eager's output is dense
(non-overlapping and dense), ignoring size-1 dimensions, whose stride eager itself does not
pin down. This is the one comparator: the OpInfo sweep, the fuzzer and the tests use it.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from minicompile.aot.strides import is_non_overlapping_and_dense
from minicompile.runtime.host_pool import copy_with_layout

# (rtol, atol) per dtype. Generated code computes in a different order and with libm/SIMD
# transcendental functions, so float32 allows a few hundred ulps; bf16/fp16 are computed in
# float32 and rounded once, so a one-ulp difference in the narrow type is allowed. Read-only:
# a caller wanting others passes ``tolerances=`` to ``mismatch``.
TOLERANCES: Mapping = MappingProxyType({
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (2e-3, 1e-3),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
})


DEFAULT_TOLERANCE = (1e-4, 1e-5)   # a float dtype missing from the table
_INEXACT = {d for d in vars(torch).values() if isinstance(d, torch.dtype) and (d.is_floating_point or d.is_complex)}


def same_tolerance(rtol: float, atol: float) -> dict:
    """One (rtol, atol) for every float and complex dtype."""
    return dict.fromkeys(_INEXACT, (rtol, atol))


def mismatch(expected, actual, *, values: bool = True, strides: bool = True,
             tolerances: Mapping = TOLERANCES) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise a one-line description of the first difference.

    ``tolerances`` maps a dtype to (rtol, atol). ``values=False`` compares only structure and
    metadata (random ops); ``strides=False`` leaves layouts out (a decomposition called directly:
    the compiler gives its result eager's strides later)."""
    exp_flat, exp_spec = pytree.tree_flatten(expected)
    act_flat, act_spec = pytree.tree_flatten(actual)
    if len(exp_flat) != len(act_flat):
        return f"output structure differs: eager {exp_spec}, compiled {act_spec}"
    for k, (e, a) in enumerate(zip(exp_flat, act_flat)):
        msg = _leaf_mismatch(e, a, values, strides, tolerances)
        if msg:
            return f"output {k}: {msg}"
    return None


def _leaf_mismatch(e, a, values: bool, strides: bool, tolerances: Mapping) -> str | None:
    if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
        return f"eager gives {type(e).__name__}, compiled gives {type(a).__name__}"
    if not isinstance(e, torch.Tensor):
        if values and not _same_scalar(e, a):
            return f"eager gives {e!r}, compiled gives {a!r}"
        return None
    if e.dtype != a.dtype:
        return f"dtype: eager {e.dtype}, compiled {a.dtype}"
    if e.device != a.device:
        return f"device: eager {e.device}, compiled {a.device}"
    if e.shape != a.shape:
        return f"shape: eager {tuple(e.shape)}, compiled {tuple(a.shape)}"
    if strides and e.numel() > 0 and is_non_overlapping_and_dense(e):
        es = [s for s, n in zip(e.stride(), e.shape) if n > 1]
        as_ = [s for s, n in zip(a.stride(), a.shape) if n > 1]
        if es != as_:
            return f"strides: eager {e.stride()}, compiled {a.stride()} (shape {tuple(e.shape)})"
    if not values or e.numel() == 0:
        return None
    return _value_mismatch(e, a, tolerances)


def _value_mismatch(e: torch.Tensor, a: torch.Tensor, tolerances: Mapping) -> str | None:
    if e.dtype.is_floating_point or e.dtype.is_complex:
        rtol, atol = tolerances.get(e.dtype, DEFAULT_TOLERANCE)
        e64 = e.detach().to(torch.complex128 if e.dtype.is_complex else torch.float64)
        a64 = a.detach().to(e64.dtype)
        if not torch.equal(torch.isnan(e64), torch.isnan(a64)):
            return f"NaN positions differ ({_where(torch.isnan(e64) != torch.isnan(a64))})"
        if not torch.equal(torch.isinf(e64), torch.isinf(a64)) or not torch.equal(e64[torch.isinf(e64)], a64[torch.isinf(a64)]):
            return f"inf positions differ ({_where(torch.isinf(e64) != torch.isinf(a64))})"
        finite = torch.isfinite(e64)
        diff = (e64 - a64).abs()[finite]
        allowed = (atol + rtol * e64.abs())[finite]
        bad = diff > allowed
        if bool(bad.any()):
            k = int(bad.nonzero()[0])
            return (f"values differ ({int(bad.sum())} of {e.numel()} elements beyond rtol={rtol}, atol={atol}; "
                    f"max abs diff {float(diff.max()):.3g}; e.g. eager {e64[finite][k].item()!r}, "
                    f"compiled {a64[finite][k].item()!r})")
        return None
    if not torch.equal(e, a):
        bad = e != a
        return f"values differ ({int(bad.sum())} of {e.numel()} elements; first at {_where(bad)})"
    return None


def _where(mask: torch.Tensor) -> str:
    idx = mask.nonzero()
    return f"index {tuple(idx[0].tolist())}" if len(idx) else "no index"


def _same_scalar(e, a) -> bool:
    if isinstance(e, float) and isinstance(a, float) and e != e and a != a:
        return True
    return e == a




def to_device(t, device):
    """``t`` on ``device`` with the same size, strides and storage offset (expanded and offset views
    stay so); ``t`` itself when it is there already."""
    if not isinstance(t, torch.Tensor) or t.device == torch.device(device):
        return t
    moved = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).to(device)
    return _viewing(t, moved.untyped_storage())


def copy_preserving_strides(t):
    """A fresh copy of ``t`` with the same size and strides (so non-contiguous inputs stay so)."""
    if not isinstance(t, torch.Tensor):
        return t
    out = copy_with_layout(t)   # the whole storage, viewed the same way: expanded (stride-0) inputs too
    return out.detach().requires_grad_(t.requires_grad) if t.requires_grad else out


def _viewing(t, storage):
    """A tensor that views ``storage`` as ``t`` views its own (size, strides, offset)."""
    return torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, t.storage_offset(), t.size(), t.stride())


class _DtypesComputed(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes.update(t.dtype for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def dtypes_computed(fn, args) -> set:
    """The dtypes of every value ``fn(*args)`` computes (its ops' results), from one eager run on copies."""
    with _DtypesComputed() as mode:
        fn(*[copy_preserving_strides(a) if isinstance(a, torch.Tensor) else a for a in args])
    return mode.dtypes
