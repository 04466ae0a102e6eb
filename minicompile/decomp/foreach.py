"""The `_foreach_*` ops that optimizers with ``foreach=True`` call: one per-tensor op per element.

Functionalization turns ``torch._foreach_add_(steps, 1)`` into the functional
``_foreach_add.Scalar``, which returns new tensors; lowered as it is, each such op is one
extern call over all parameters and every intermediate list is materialised. Decomposed
here into ordinary per-tensor ops, a parameter's whole update (read p, grad, state; write p
and state) is one pointwise chain that the scheduler fuses into one kernel.

Element ``i`` of ``_foreach_op.overload(args)`` is the per-tensor op called with the same
arguments in the same order, where every list argument (``Tensor[]``, ``Scalar[]``) is
replaced by its element ``i`` and every other argument (a Scalar, one Tensor) is passed to
each element unchanged. The ``.Tensor`` overloads of addcmul/addcdiv carry their one value
per element as a 1-D tensor: it is unbound into 0-d tensors, so no value leaves the graph.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from minicompile.decomp.precision import to_dtype, upcast
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten

# foreach overload -> per-tensor overload taking the same arguments
SAME_ARGUMENTS = {
    **{f"{op}.List": f"{op}.Tensor" for op in ("add", "sub", "mul", "div")},
    **{f"{op}.Scalar": f"{op}.Scalar" for op in ("add", "sub", "mul", "div")},
    **{f"{op}.ScalarList": f"{op}.Scalar" for op in ("add", "sub", "mul", "div")},
    **{f"{op}.Tensor": f"{op}.Tensor" for op in ("add", "mul", "div")},
    # eager's foreach kernels compute maximum/minimum with a scalar as clamp_min/clamp_max
    "maximum.List": "maximum", "maximum.Scalar": "clamp_min", "maximum.ScalarList": "clamp_min",
    "minimum.List": "minimum", "minimum.Scalar": "clamp_max", "minimum.ScalarList": "clamp_max",
    "clamp_min.List": "clamp_min.Tensor", "clamp_min.Scalar": "clamp_min", "clamp_min.ScalarList": "clamp_min",
    "clamp_max.List": "clamp_max.Tensor", "clamp_max.Scalar": "clamp_max", "clamp_max.ScalarList": "clamp_max",
    "pow.List": "pow.Tensor_Tensor", "pow.Scalar": "pow.Tensor_Scalar", "pow.ScalarList": "pow.Tensor_Scalar",
    "pow.ScalarAndTensor": "pow.Scalar",
    "lerp.List": "lerp.Tensor", "lerp.Scalar": "lerp.Scalar", "lerp.ScalarList": "lerp.Scalar",
    "copy": "copy", "clone": "clone", "zero": "zeros_like",
    # (lgamma has no core form: _foreach_lgamma stays one extern call)
    **{op: op for op in (
        "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor log log10 log1p log2"
        " neg reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc").split()},
}


def _addcmul(self, tensor1, tensor2, value=1):
    if not isinstance(value, torch.Tensor):
        return aten.addcmul.default(self, tensor1, tensor2, value=value)
    # a 0-d tensor value (the .Tensor overload): eager's self + (value * t1) * t2, in opmath
    s, t1, t2 = upcast(self), upcast(tensor1), upcast(tensor2)
    return to_dtype(aten.add.Tensor(s, aten.mul.Tensor(aten.mul.Tensor(t1, value), t2)), self.dtype)


def _addcdiv(self, tensor1, tensor2, value=1):
    if not isinstance(value, torch.Tensor):
        return aten.addcdiv.default(self, tensor1, tensor2, value=value)
    s, t1, t2 = upcast(self), upcast(tensor1), upcast(tensor2)
    return to_dtype(aten.add.Tensor(s, aten.div.Tensor(aten.mul.Tensor(t1, value), t2)), self.dtype)


def _vector_norm(x, ord=2, dtype=None):
    """linalg_vector_norm over all elements, as the reductions eager computes it with."""
    out_dtype = dtype or x.dtype
    x = upcast(to_dtype(x, out_dtype))
    if ord == 0:
        total = aten.sum.default(to_dtype(aten.ne.Scalar(x, 0), x.dtype))
    elif ord in (math.inf, -math.inf):
        total = (aten.amax if ord > 0 else aten.amin).default(aten.abs.default(x))
    elif ord == 1:
        total = aten.sum.default(aten.abs.default(x))
    elif ord == 2:
        total = aten.sqrt.default(aten.sum.default(aten.mul.Tensor(x, x)))
    else:
        powered = aten.pow.Tensor_Scalar(aten.abs.default(x), ord)
        total = aten.pow.Tensor_Scalar(aten.sum.default(powered), 1.0 / ord)
    return to_dtype(total, out_dtype)


def _frac(x):
    return aten.sub.Tensor(x, aten.trunc.default(x))


def _max(x):
    return aten.amax.default(x, [])  # every dimension, like max() with no dim


ADAPTED = {
    "frac": _frac, "max": _max,
    "addcmul.Scalar": _addcmul, "addcmul.ScalarList": _addcmul, "addcmul.Tensor": _addcmul,
    "addcdiv.Scalar": _addcdiv, "addcdiv.ScalarList": _addcdiv, "addcdiv.Tensor": _addcdiv,
    "norm.Scalar": _vector_norm,
}


def _overload(packet_name: str, spec: str):
    """('_foreach_', 'add.List') -> aten._foreach_add.List; None where this torch lacks it."""
    name, _, overload = spec.partition(".")
    packet = getattr(aten, packet_name + name, None)
    if packet is None or (overload or "default") not in packet.overloads():
        return None
    return getattr(packet, overload or "default")


def _per_element(foreach_op, fn: Callable) -> Callable:
    arguments = foreach_op._schema.arguments
    is_list = [isinstance(a.type, torch.ListType) or a.name == "scalars" for a in arguments]

    def decompose(*args, **kwargs):
        values = [args[k] if k < len(args) else kwargs.get(a.name, a.default_value)
                  for k, a in enumerate(arguments)]
        values = [aten.unbind.int(v) if isinstance(v, torch.Tensor) and listed else v
                  for v, listed in zip(values, is_list)]
        length = len(next(v for v, listed in zip(values, is_list) if listed))
        results = []
        for i in range(length):
            picked = [v[i] if listed else v for v, listed in zip(values, is_list)]
            positional = [v for v, a in zip(picked, arguments) if not a.kwarg_only]
            keywords = {a.name: v for v, a in zip(picked, arguments) if a.kwarg_only}
            results.append(fn(*positional, **keywords))
        return results

    decompose.__name__ = f"{foreach_op._schema.name.split('::')[-1]}_{foreach_op._overloadname}"
    return decompose


def _register_all() -> None:
    per_tensor = {spec: _overload("", target) for spec, target in SAME_ARGUMENTS.items()}
    per_tensor.update(ADAPTED)
    for spec, fn in per_tensor.items():
        foreach_op = _overload("_foreach_", spec)
        if foreach_op is not None and fn is not None:
            register_decomposition(foreach_op)(_per_element(foreach_op, fn))


_register_all()
