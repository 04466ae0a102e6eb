"""flex_attention (the higher-order op) -> one FlexAttention buffer: a fused attention kernel.

The op carries the user's score_mod and the BlockMask's mask_mod as FX graphs over 0-d tensors
(the score and its b, h, q_idx, kv_idx). Each is lowered here by our own lowerings, as any
graph is, with the index arguments standing for the kernel's loop variables (ir/flex.py): the
result is a loop-IR body a backend renders with its ops handler, so every pointwise score_mod
compiles, not a list of known ones. A captured tensor indexed by the positions (an ALiBi slope
per head, a bias table over q_idx - kv_idx) is a load at that index expression.

Whatever the fused kernel does not cover raises Unsupported, and the op stays the eager call
it was, with the reason: a backend without the kernel, CUDA tensors (the Triton kernel has run
in Triton's interpreter only), dtypes other than float32, symbolic sizes, kernel options that
change the result, a mod that needs memory or an eager op.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from minicompile.ir.expr import Expr, NotSymbolic
from minicompile.ir.flex import SCORE, SCORE_INDEX, FlexAttention, FlexStat, index_vars
from minicompile.ir.nodes import Layout, Lazy, StorageView, TensorValue
from minicompile.lowering.graph import GraphLowering
from minicompile.lowering.registry import Unsupported, register_lowering

aten = torch.ops.aten

# kernel_options that leave the forward's values as they are: which stats are returned, what the
# backward writes, and the tile sizes of other backends' kernels. Any other option keeps the eager op.
NEUTRAL_OPTIONS = {"PRESCALE_QK", "ROWS_GUARANTEED_SAFE", "BLOCKS_ARE_CONTIGUOUS", "WRITE_DQ", "OUTPUT_LOGSUMEXP",
                   "OUTPUT_MAX", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "FORCE_USE_FLEX_ATTENTION"}
# q/k/v dtypes the C++ kernel loads as float32 (template "flex_attention_narrow"), computing in float32 as
# eager's math does; its output is stored in that dtype, the logsumexp and max stay float32 (as eager's).
NARROW = (torch.bfloat16, torch.float16)
# Floats a thread keeps on its stack per tile (codegen/cpp_flex.py): the scores and query rows of 32
# rows, a key block transposed and a value block (of 128 keys), 32 rows of sums.
SCRATCH_LIMIT = 131072
# Integer ops on the position arguments that stay index expressions (a table read at q_idx - kv_idx).
INDEX_ARITHMETIC = {aten.add.Tensor: operator.add, aten.sub.Tensor: operator.sub, aten.mul.Tensor: operator.mul,
                    aten.add.Scalar: operator.add, aten.sub.Scalar: operator.sub, aten.mul.Scalar: operator.mul}


@register_lowering(torch.ops.higher_order.flex_attention)
def flex_attention(lw, node, query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_buffers=(), mask_buffers=()):
    out_meta, lse_meta, max_meta = node.meta["val"]
    q_meta, k_meta, v_meta = (a.meta["val"] for a in node.args[:3])
    _check(lw, (q_meta, k_meta, v_meta, out_meta), node.args[4], kernel_options)
    (B, HQ, LQ, D), (_, _, LK, DV) = q_meta.shape, v_meta.shape
    index = index_vars(B, HQ, LQ, LK)
    captured = [_captured(lw, t) for t in (*score_buffers, *mask_buffers)]
    score = _mod_body(score_mod, [_score_value(q_meta.device)] + _index_values(index, q_meta.device),
                      captured[:len(score_buffers)], index, torch.float32, "score_mod")
    mask = _mod_body(block_mask[-1], _index_values(index, q_meta.device), captured[len(score_buffers):], index,
                     torch.bool, "mask_mod")
    partial = tuple(lw.realize(t) for t in block_mask[2:4])
    full = tuple(lw.realize(t) for t in block_mask[4:6]) if block_mask[4] is not None else ()
    buf = FlexAttention(lw.new_name(), _at_data_ptr(out_meta), [node.name], query=lw.realize(query),
                        key=lw.realize(key), value=lw.realize(value), partial=partial, full=full, score=score,
                        mask=mask, captured=tuple(captured), scale=float(scale), q_block=int(block_mask[14]),
                        kv_block=int(block_mask[15]))
    lw.register(buf)
    for which, meta in (("lse", lse_meta), ("max", max_meta)):
        stat = FlexStat(lw.new_name(), _at_data_ptr(meta), [node.name], parent=buf, which=which)
        buf.stats.append(lw.register(stat))
    return [StorageView.whole(b) for b in (buf, *buf.stats)]


def _check(lw, metas, block_mask, kernel_options) -> None:
    """``block_mask``: the op's tuple of FX nodes and numbers. Raise Unsupported (the op stays eager, with the reason) where the fused kernel does not apply."""
    q, k, v, out = metas
    if "flex_attention" not in lw.templates:
        raise Unsupported("this code generator has no fused flex_attention kernel")
    if q.device.type != "cpu" or q.dtype not in NARROW + (torch.float32,) or any(t.dtype != q.dtype for t in metas):
        raise Unsupported("the fused flex_attention kernel is generated for float32, bfloat16 and float16 CPU "
                          "tensors of one dtype (C++, or Triton in its interpreter; not yet run on a GPU)")
    if q.dtype in NARROW and "flex_attention_narrow" not in lw.templates:
        raise Unsupported(f"this code generator's fused flex_attention kernel is float32 only, not {q.dtype}")
    if not all(_static(t) for t in metas):
        raise Unsupported("flex_attention with symbolic sizes runs eagerly")
    odd = sorted(str(o) for o in kernel_options if o not in NEUTRAL_OPTIONS and o != "BACKEND")
    if odd or kernel_options.get("BACKEND", "AUTO") not in ("AUTO", "TRITON"):
        raise Unsupported(f"kernel_options {odd or ['BACKEND=' + str(kernel_options['BACKEND'])]} change what the "
                          "fused kernel would compute")
    (B, HQ, LQ, D), (BK, HK, LK, DK), (BV, HV, LV, DV) = q.shape, k.shape, v.shape
    if DK != D or (BK, HK, LK) != (BV, HV, LV) or BK not in (1, B) or HQ % HK:
        raise Unsupported(f"query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not fit "
                          "the fused kernel's grouped-query attention")
    q_block, kv_block = block_mask[14], block_mask[15]
    if not (isinstance(q_block, int) and isinstance(kv_block, int)) or q_block <= 0 or kv_block <= 0:
        raise Unsupported("the block mask's BLOCK_SIZE is not a pair of numbers")
    tile = min(kv_block, 128)   # codegen/cpp_flex.py's KEY_TILE
    if D * tile + tile * (DV + 15) + 32 * (tile + D + DV + 15) > SCRATCH_LIMIT:
        raise Unsupported(f"head size {D} needs more scratch than a thread's stack")
    for counts, indices in (block_mask[2:4], block_mask[4:6]):
        if counts is None:
            continue
        nb, ix = counts.meta["val"], indices.meta["val"]
        if (nb.dim() != 3 or ix.dim() != 4 or nb.shape[0] not in (1, B) or nb.shape[1] not in (1, HQ)
                or nb.shape[2] * q_block < LQ or tuple(ix.shape[:3]) != tuple(nb.shape)
                or nb.dtype != torch.int32 or ix.dtype != torch.int32
                or not (_static(nb) and _static(ix))):
            raise Unsupported(f"block mask tensors {list(nb.shape)} / {list(ix.shape)} do not cover query "
                              f"{list(q.shape)} in blocks of {q_block}")


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in (*t.shape, *t.stride()))


def _captured(lw, value) -> StorageView:
    if not isinstance(value, TensorValue):
        raise Unsupported("a mod captures something other than a tensor")
    return lw.realize(value)


def _score_value(device) -> Lazy:
    return Lazy(torch.float32, device, (), lambda ops, index: ops.load(SCORE, SCORE_INDEX, torch.float32))


def _index_values(index, device) -> list:
    return [Lazy(torch.int32, device, (), lambda ops, _, e=e: ops.index_expr(e, torch.int32)) for e in index]


def _mod_body(gm, leading: list, captured: list, index: tuple, dtype: torch.dtype, what: str):
    """``gm`` (a score_mod or mask_mod graph) as a loop-IR body ``body(ops) -> value``."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise Unsupported(f"the {what} is not a traced graph")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(leading) + len(captured):
        raise Unsupported(f"the {what} takes {len(placeholders)} arguments")
    if leading[0].dtype != placeholders[0].meta["val"].dtype:
        _retype_score(gm, placeholders, leading[0].dtype)
    lw = ModLowering(gm, index={n: e for n, e in zip(placeholders[len(leading) - 4:], index)})
    lw.env.update(zip(placeholders, [*leading, *captured]))
    result = None
    for n in gm.graph.nodes:
        if n.op == "call_function":
            lw.env[n] = lw._call(n)
        elif n.op == "get_attr":
            raise Unsupported(f"the {what} holds a constant tensor")
        elif n.op == "output":
            result = lw.env.get(n.args[0]) if isinstance(n.args[0], torch.fx.Node) else None
    if lw.externs:
        raise Unsupported(f"the {what} runs {lw.externs[0].op} eagerly ({lw.externs[0].reason})")
    if lw.buffers or not isinstance(result, TensorValue) or tuple(result.size) != () or result.dtype != dtype:
        got = f"{getattr(result, 'dtype', result)} of size {list(getattr(result, 'size', ()))}"
        raise Unsupported(f"the {what} does not lower to one {dtype} value per position ({got})")
    load = result.loader()
    return lambda ops: load(ops, [])


def _retype_score(gm, placeholders: list, dtype: torch.dtype) -> None:
    """Dynamo traces a score_mod with a score of the query's dtype (bfloat16), but the op computes the
    score in ``dtype`` (float32) and runs the mod on that: propagate the graph's values again with a
    float32 score, so the mod's ops compute and round where eager's do (``score + slope[h] * d`` adds a
    bfloat16 product to a float32 score, in float32)."""
    metas = [p.meta["val"] for p in placeholders]
    if not all(isinstance(t, torch.Tensor) and _static(t) for t in metas):
        raise Unsupported("the score_mod's captured tensors have symbolic sizes")
    mode = FakeTensorMode()
    with mode:
        args = [torch.empty_strided(t.shape, t.stride(), dtype=dtype if i == 0 else t.dtype)
                for i, t in enumerate(metas)]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)


@dataclass
class ModLowering(GraphLowering):
    """Lowers a mod's graph of 0-d values: nothing gets memory (a value read twice is computed twice,
    and the C++ ops handler's common subexpressions make it once), integer arithmetic on the
    positions stays an index expression, and a captured tensor indexed by such expressions is a load."""
    index: dict = field(default_factory=dict)   # FX node -> Expr over index_vars

    def _maybe_realize(self, value, node):
        return value

    def _call(self, node):
        if node.target is aten.index.Tensor:
            return self._gather(node)
        value = super()._call(node)
        op = INDEX_ARITHMETIC.get(node.target)
        operands = [self.index.get(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
        if op is not None and not node.kwargs and len(operands) == 2 and all(isinstance(a, (int, Expr)) for a in operands):
            try:
                self.index[node] = Expr.of(op(*operands))
            except (NotSymbolic, TypeError):
                pass
        return value

    def _gather(self, node):
        """``table[h, q_idx - kv_idx + 7]``: a load of the captured tensor at those index expressions."""
        base, indices = self.env[node.args[0]], node.args[1]
        exprs = [self.index.get(i) for i in indices]
        if not isinstance(base, StorageView) or len(exprs) != len(base.size) or any(e is None for e in exprs):
            raise Unsupported("a mod indexes a tensor with something other than its position arguments")
        for e, size in zip(exprs, base.size):
            lo, hi = e.range()
            if lo < 0 or hi >= size:
                raise Unsupported(f"a mod indexes a tensor of size {size} at {e}, which runs from {lo} to {hi}")
        load = base.loader()
        return Lazy(base.dtype, base.device, (), lambda ops, _: load(ops, exprs))


def _at_data_ptr(meta) -> Layout:
    """The layout kernels index ``meta`` with: from its data_ptr (which includes the storage offset)."""
    lay = Layout.of(meta)
    return Layout(lay.size, lay.stride, 0, lay.dtype, lay.device)

