"""The core ATen op set: what the lowering handles natively.

Decompositions bottom out in these ops. Any other op in a traced graph is still correct:
the lowering runs it as an extern eager call, only slower. docs/core-ops.md is the
human-readable version of this file; keep the two in step.
"""
from __future__ import annotations

import operator

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _overloads(spec: str) -> list[OpOverload]:
    """'abs neg add.Tensor' -> [aten.abs.default, aten.neg.default, aten.add.Tensor].

    Overloads this torch build does not have are skipped, so one list serves every
    supported torch version.
    """
    ops = []
    for name in spec.split():
        packet_name, _, overload = name.partition(".")
        packet = getattr(aten, packet_name, None)
        if packet is not None and (overload or "default") in packet.overloads():
            ops.append(getattr(packet, overload or "default"))
    return ops


POINTWISE_UNARY = _overloads(
    "abs neg exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos"
    " atan sinh cosh tanh asinh acosh atanh erf erfc sigmoid relu floor ceil round trunc sign"
    " logical_not bitwise_not isnan isinf"
)
POINTWISE_BINARY = _overloads(
    "add.Tensor add.Scalar sub.Tensor sub.Scalar mul.Tensor mul.Scalar div.Tensor div.Scalar"
    " div.Tensor_mode remainder.Tensor remainder.Scalar fmod.Tensor fmod.Scalar floor_divide"
    " pow.Tensor_Tensor pow.Tensor_Scalar pow.Scalar maximum minimum atan2"
    " eq.Tensor eq.Scalar ne.Tensor ne.Scalar lt.Tensor lt.Scalar le.Tensor le.Scalar"
    " gt.Tensor gt.Scalar ge.Tensor ge.Scalar logical_and logical_or logical_xor"
    " bitwise_and.Tensor bitwise_and.Scalar bitwise_or.Tensor bitwise_or.Scalar"
    " bitwise_xor.Tensor bitwise_xor.Scalar clamp clamp.Tensor clamp_min clamp_min.Tensor clamp_max clamp_max.Tensor"
    " where.self"
)
CREATION_AND_COPIES = _overloads(
    "_to_copy clone copy alias detach lift_fresh_copy full full_like zeros_like ones_like"
    " empty_like scalar_tensor arange.start_step empty.memory_format"
    # copy_ only appears as the last write of a new value into a mutated graph input.
    " copy_"
)
REDUCTIONS = _overloads(
    "sum sum.dim_IntList mean.dim amax amin prod prod.dim_int argmax argmin"
    " var_mean.correction var.correction any any.dim any.dims all all.dim all.dims"
)
VIEWS = _overloads(
    "view _unsafe_view permute transpose.int t expand slice.Tensor select.int squeeze"
    " squeeze.dim squeeze.dims unsqueeze split.Tensor split_with_sizes unbind.int as_strided"
    " cat constant_pad_nd"
)
INDEXING = _overloads("index.Tensor index_select gather")
# Shape queries that appear in graphs traced with symbolic (dynamic) shapes.
SHAPE_QUERIES = _overloads("sym_size.int sym_stride.int sym_numel sym_storage_offset")

# Picking one output of a multi-output op (native_layer_norm, var_mean, split, ...).
STRUCTURAL = [operator.getitem]

CORE_OPS: frozenset = frozenset(
    POINTWISE_UNARY + POINTWISE_BINARY + CREATION_AND_COPIES + REDUCTIONS + VIEWS + INDEXING
    + SHAPE_QUERIES + STRUCTURAL
)

# Compute-bound ops that stay extern on purpose (vendor BLAS / oneDNN beat generated loops).
EXTERN_COMPUTE_OPS: frozenset = frozenset(_overloads("mm bmm convolution")) | frozenset(
    [torch.ops.mkldnn._linear_pointwise.default] if hasattr(torch.ops.mkldnn, "_linear_pointwise") else [])


def is_core(target) -> bool:
    return target in CORE_OPS
