"""Eager's output strides for elementwise ops, where fake tensors disagree with eager.

    restride_elementwise(traced_gm, fake_mode)

Eager runs every elementwise ATen op through TensorIterator, which picks the output's
memory order from its inputs' strides. Fake tensors reach some of those ops through
Python reference implementations that first convert narrow-dtype inputs to float32; the
conversion makes an expanded input contiguous, and the output order then follows it. For
``add`` of a bfloat16 (6,4) expanded input (strides (1,0)) and a transposed one (1,6),
eager returns strides (1,6) while the fake tensor says (4,1).

Our generated wrapper allocates outputs with the strides in ``node.meta["val"]``, so this
pass recomputes them the way TensorIterator does and repairs the values in place, then
re-runs the fake kernels of anything downstream (views of a repaired tensor change too).

TensorIterator's rule, for an op whose output it allocates:
  1. If every input has the output's shape: all contiguous -> contiguous; all
     channels_last -> channels_last; all non-overlapping and dense with equal strides ->
     those strides.
  2. Otherwise sort the dimensions by stride, input by input in argument order: a
     broadcast dimension (stride 0) defers to the next input; equal strides put the
     smaller size first. The output is dense in that order.
"""
from __future__ import annotations

import functools

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true
from torch.utils import _pytree as pytree


def restride_elementwise(gm: torch.fx.GraphModule, fake_mode) -> int:
    """Make every elementwise node's meta['val'] carry eager's strides; returns how many changed."""
    changed: set = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        if _is_elementwise(node, val):
            operands = _promoted(_tensor_operands(node), val.dtype, skip_first=node.target.name() == "aten::where.self")
            strides = eager_elementwise_strides(tuple(val.shape), operands)
            if strides is not None and not _same(strides, val.stride()):
                with fake_mode:
                    node.meta["val"] = torch.empty_strided(val.shape, strides, dtype=val.dtype, device=val.device)
                changed.add(node)
                continue
        if any(n in changed for n in node.all_input_nodes) and _rerun(node, fake_mode):
            changed.add(node)
    return len(changed)


class Undecided(Exception):
    """A comparison of symbolic sizes that holds for some sizes the graph serves and not others."""


def _true(cond) -> bool:
    """``cond``, a bool or a SymBool over symbolic sizes, decided for every size the graph serves
    (their value ranges), never by a guard; raises Undecided where it is not."""
    if isinstance(cond, bool):
        return cond
    if statically_known_true(cond):
        return True
    if statically_known_true(torch.sym_not(cond)):
        return False
    raise Undecided(str(cond))


def _same(a, b) -> bool:
    """Equal sequences of sizes or strides; False where a symbolic comparison is undecided."""
    try:
        return len(a) == len(b) and all(_true(x == y) for x, y in zip(a, b))
    except Undecided:
        return False


def eager_elementwise_strides(shape: tuple, operands: list) -> tuple | None:
    """The strides TensorIterator gives a fresh output of ``shape`` computed from ``operands``
    (tensors, in argument order). With symbolic sizes, only where each comparison it takes holds
    for every size the graph serves; None otherwise."""
    try:
        return _elementwise_strides(shape, operands)
    except Undecided:
        return None


def _elementwise_strides(shape: tuple, operands: list) -> tuple:
    ndim = len(shape)
    if ndim == 0 or not operands:
        return contiguous_strides(shape)
    if all(_same(t.shape, shape) for t in operands):
        if all(_dense_as(t, contiguous_strides(shape)) for t in operands):
            return contiguous_strides(shape)
        if ndim == 4 and all(_dense_as(t, _channels_last(shape)) for t in operands):
            return _channels_last(shape)
        first = tuple(operands[0].stride())
        if all(is_non_overlapping_and_dense(t) and _same(t.stride(), first) for t in operands):
            return first
    strides = [_broadcast_strides(t, shape) for t in operands]
    perm = _iteration_order(shape, strides)
    if perm == list(range(ndim - 1, -1, -1)):
        return contiguous_strides(shape)
    out = [0] * ndim
    step = 1
    for d in perm:  # fastest dimension first
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _dense_as(t: torch.Tensor, strides: tuple) -> bool:
    """``t`` has ``strides`` wherever its size is not 1 (is_contiguous's rule, for any format)."""
    return all(_true(n == 1) or _true(s == want) for n, s, want in zip(t.shape, t.stride(), strides))


def _iteration_order(shape: tuple, strides: list) -> list:
    """Dimensions from fastest- to slowest-moving, as TensorIterator orders them."""
    ndim = len(shape)
    if ndim == 1:
        return [0]

    def should_swap(d0, d1):
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if _true(s0 == 0) or _true(s1 == 0):
                continue  # broadcast here: the next input decides
            if not _true(s0 == s1):
                return 1 if _true(s0 > s1) else -1
            if _true(shape[d0] > shape[d1]):
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):  # insertion sort that tolerates ambiguous comparisons
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return perm


def _broadcast_strides(t: torch.Tensor, shape: tuple) -> list:
    """The input's strides over the broadcast shape: 0 for missing and broadcast dimensions."""
    offset = len(shape) - t.dim()
    out = [0] * len(shape)
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        out[offset + i] = 0 if (_true(n == 1) and not _true(shape[offset + i] == 1)) else s
    return out


def contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides; sizes may be SymInts (a size-0 dimension counts as 1, as in ATen)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step = step * (max(n, 1) if isinstance(n, int) else n)
    return tuple(reversed(strides))


def _channels_last(shape: tuple) -> tuple:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Some permutation of the dims is contiguous (size-1 dims ignored); sizes may be symbolic
    (Undecided where that depends on them)."""
    def by_stride(a, b):
        return -1 if _true(a[0] < b[0]) else int(_true(a[0] > b[0]))
    dims = [(s, n) for n, s in zip(t.shape, t.stride()) if not _true(n == 1)]
    step = 1
    for s, n in sorted(dims, key=functools.cmp_to_key(by_stride)):
        if not _true(s == step):
            return False
        step *= n
    return True


def _is_elementwise(node: torch.fx.Node, val) -> bool:
    target = node.target
    return (
        isinstance(target, torch._ops.OpOverload)
        and torch.Tag.pointwise in target.tags
        and isinstance(val, torch.Tensor)
        and guard_or_false(val.numel() > 0)  # a data-dependent size may be 0: eager's strides then are the meta's
        and not any(r.alias_info is not None for r in target._schema.returns)
        # clone/_to_copy follow their memory_format argument, not TensorIterator
        and not any(a.name == "memory_format" for a in target._schema.arguments)
        # a piece of a decomposition: eager ran the composite op, whose strides the
        # decomposition already reproduces
        and _same_op(node.meta.get("original_aten", target), target)
    )


def _same_op(a, b) -> bool:
    # compared by name: the recorded overload need not be the identical Python object
    return isinstance(a, torch._ops.OpOverload) and a.name() == b.name()


def _tensor_operands(node: torch.fx.Node) -> list:
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    vals = [n.meta.get("val") for n in leaves if isinstance(n, torch.fx.Node)]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _promoted(operands: list, out_dtype: torch.dtype, skip_first: bool = False) -> list:
    """The operands as eager's CPU TensorIterator sees them: an input whose dtype is not the
    common one is first converted with ``.to``, which makes a non-dense input (an expanded
    one, say) contiguous. ``where``'s condition takes no part in promotion. (On CUDA the
    conversion happens inside the kernel and the operands keep their strides: float32 expanded
    times float64 transposed is (3, 1) on CPU and (1, 8) on an H200, fuzzer seed 223.)"""
    fixed, rest = (operands[:1], operands[1:]) if skip_first else ([], operands)
    if not rest or rest[0].device.type != "cpu" or any(not _concrete(t) for t in rest):
        return operands
    acc = _like(rest[0], rest[0].dtype)
    for t in rest[1:]:
        acc = _like(t if t.dim() else acc, torch.result_type(acc, _like(t, t.dtype)))
    common = acc.dtype
    if out_dtype.is_floating_point and not (common.is_floating_point or common.is_complex):
        common = out_dtype  # integer inputs of a float op (sin, true division) are converted
    return fixed + [t if t.dtype == common else _converted(t, common) for t in rest]


def _like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # type promotion looks at dtype and at whether a tensor is 0-dim, nothing else
    return torch.empty((0,) if t.dim() else (), dtype=dtype, device="meta")


def _converted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``'s layout (dense inputs keep their strides), computed on meta tensors."""
    m = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta").to(dtype)
    return torch.empty_strided(tuple(m.shape), tuple(m.stride()), dtype=dtype, device="meta")


def _concrete(t: torch.Tensor) -> bool:
    return all(isinstance(x, int) for x in (*t.shape, *t.stride()))


def _rerun(node: torch.fx.Node, fake_mode) -> bool:
    """Recompute a node's fake value from its inputs' (repaired) values; True if it changed."""
    args, kwargs = torch.fx.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    try:
        with fake_mode:
            new = node.target(*args, **kwargs)
    except Exception:  # keep the traced value: it is what we had before this pass
        return False
    old = node.meta.get("val")
    if _same_layouts(new, old):
        return False
    node.meta["val"] = new
    return True


def _same_layouts(a, b) -> bool:
    """The same shapes and strides (and other leaves), without guarding on symbolic sizes."""
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        _same(x.shape, y.shape) and _same(x.stride(), y.stride()) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        else _same((x,), (y,)) for x, y in zip(la, lb))
