"""The core ATen op set: what decompositions bottom out in, and how each op runs.

``NATIVE_OPS`` are lowered to loop IR (tests/test_structure.py checks each has a lowering);
the pointwise ones come from the loop IR's op table, ``ir.ops.POINTWISE_OPS``. The indexing
ops are core too (decompositions produce them) but run as extern eager calls. Any other op in
a traced graph is still correct: the lowering runs it as an extern call, only slower.
The "Core op set" table of docs/core-ops.md is ``markdown_table()``; tests/test_structure.py
fails when the two differ.
"""
from __future__ import annotations

import operator

import torch
from torch._ops import OpOverload

from minicompile.ir.ops import POINTWISE_OPS, aten_overloads

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


POINTWISE = [overload for name in POINTWISE_OPS for overload in aten_overloads(name)]
# Pointwise ops with a lowering of their own (alpha, rounding modes, integer pow, clamp bounds).
POINTWISE_OWN_LOWERING = _overloads(
    "add.Tensor add.Scalar sub.Tensor sub.Scalar div.Tensor_mode div.Scalar_mode"
    " pow.Tensor_Tensor pow.Tensor_Scalar pow.Scalar clamp clamp.Tensor clamp_min clamp_min.Tensor"
    " clamp_max clamp_max.Tensor"
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
# Picking one output of a multi-output op (native_layer_norm, var_mean, split, ...).
STRUCTURAL = [operator.getitem]
# Ops (by name) that address a tensor's storage rather than its elements: the value they read is
# its storage, in the layout it has (aot/layout_readers.py checks it is eager's; lowering gives
# their arguments memory of eager's strides).
STORAGE_READERS = frozenset({"as_strided", "as_strided_", "as_strided_copy", "as_strided_scatter", "set_",
                             "untyped_storage", "storage"})
NATIVE_OPS: frozenset = frozenset(
    POINTWISE + POINTWISE_OWN_LOWERING + CREATION_AND_COPIES + REDUCTIONS + VIEWS + STRUCTURAL)

# Gathers (embedding, nll_loss) run as eager calls: eager checks every index is in bounds and
# raises, which a generated loop cannot do; indices computed from positions are index math.
EXTERN_INDEXING_OPS: frozenset = frozenset(_overloads("index.Tensor index_select gather"))
CORE_OPS: frozenset = NATIVE_OPS | EXTERN_INDEXING_OPS

# Compute-bound ops that stay extern on purpose (vendor BLAS / oneDNN beat generated loops).
EXTERN_COMPUTE_OPS: frozenset = frozenset(_overloads("mm bmm convolution")) | frozenset(
    [torch.ops.mkldnn._linear_pointwise.default] if hasattr(torch.ops.mkldnn, "_linear_pointwise") else [])

FAMILIES = {
    "pointwise, loop IR ops (`ir/ops.py`)": ("native", POINTWISE),
    "pointwise, own lowering": ("native", POINTWISE_OWN_LOWERING),
    "dtype, copies, creation": ("native", CREATION_AND_COPIES),
    "reductions": ("native", REDUCTIONS),
    "views and layout": ("native", VIEWS),
    "structural": ("native", STRUCTURAL),
    "indexing": ("extern", sorted(EXTERN_INDEXING_OPS, key=str)),
    "compute-bound (not core)": ("extern on purpose", sorted(EXTERN_COMPUTE_OPS, key=str)),
}


def is_core(target) -> bool:
    # ops of a library loaded after us ("prims.fma.default") are listed by name
    return target in CORE_OPS or (isinstance(target, OpOverload) and str(target) in CORE_OPS)


def markdown_table() -> str:
    """The core op set as the Markdown table in docs/core-ops.md, ops grouped by packet."""
    lines = ["| family | runs | ops |", "|---|---|---|"]
    for family, (runs, ops) in FAMILIES.items():
        packets: dict[str, list[str]] = {}
        for op in ops:
            packets.setdefault(_packet_name(op), []).append(getattr(op, "_overloadname", "default"))
        cells = [name if overloads == ["default"] else f"{name} ({', '.join(f'`.{o}`' for o in overloads)})"
                 for name, overloads in packets.items()]
        lines.append(f"| {family} | {runs} | {', '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _packet_name(op) -> str:
    if isinstance(op, str):  # "prims.fma.default"
        return op.rsplit(".", 1)[0]
    if not isinstance(op, OpOverload):
        return f"`operator.{op.__name__}`"
    name = op.overloadpacket.__name__
    return name if op.namespace == "aten" else f"{op.namespace}.{name}"
