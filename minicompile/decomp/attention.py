"""Scaled dot-product attention in its math form: bmm, scale, mask, softmax, bmm.

F.scaled_dot_product_attention reaches aten.scaled_dot_product_attention, which is
CompositeImplicitAutograd: in torch 2.13 on CPU the dispatcher picks
_scaled_dot_product_flash_attention_for_cpu (after turning a boolean mask into an additive
one) before make_fx consults the table, so that fused op is decomposed here (unless the CPU policy,
cpu/claims.py, keeps eager's fused kernel, a choice it measures per shape); the composite
op's own entry serves direct use and tracers that stop at composite ops.
"""
from __future__ import annotations

import math

import torch

from minicompile.decomp.linalg import matmul
from minicompile.decomp.precision import fill_where, to_dtype, upcast, where_scalar
from minicompile.decomp.registry import register_decomposition

aten = torch.ops.aten


def _repeat_kv_heads(t, num_heads):
    """Grouped-query attention: query head h reads key/value head h // (Hq // Hkv)."""
    kv_heads = t.shape[-3]
    if kv_heads == num_heads:
        return t
    if num_heads % kv_heads:
        raise RuntimeError(f"scaled_dot_product_attention: {num_heads} query heads cannot share "
                           f"{kv_heads} key/value heads (grouped-query attention needs a multiple)")
    group = num_heads // kv_heads
    expanded = aten.expand.default(
        aten.unsqueeze.default(t, -3), list(t.shape[:-2]) + [group] + list(t.shape[-2:])
    )
    return aten.reshape.default(expanded, list(t.shape[:-3]) + [num_heads] + list(t.shape[-2:]))


def attention_math(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Returns (output, logsumexp of the scores); fully masked rows give output 0 and logsumexp 0."""
    q, k, v = upcast(query), upcast(key), upcast(value)
    if q.dim() >= 3:
        k, v = _repeat_kv_heads(k, q.shape[-3]), _repeat_kv_heads(v, q.shape[-3])
    L, S = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = aten.mul.Scalar(matmul(q, aten.transpose.int(k, -2, -1)), scale)
    if is_causal:
        # Top-left aligned: query i sees keys 0..i, whatever L and S are.
        rows = aten.arange.start_step(0, L, 1, dtype=torch.int64, device=q.device)
        cols = aten.arange.start_step(0, S, 1, dtype=torch.int64, device=q.device)
        visible = aten.le.Tensor(aten.unsqueeze.default(cols, 0), aten.unsqueeze.default(rows, 1))
        scores = where_scalar(visible, scores, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = where_scalar(attn_mask, scores, float("-inf"))  # True = may attend
        else:
            scores = aten.add.Tensor(scores, upcast(attn_mask))
    row_max = aten.amax.default(scores, [-1], True)
    row_max = fill_where(aten.isinf.default(row_max), 0, row_max)
    e = aten.exp.default(aten.sub.Tensor(scores, row_max))
    denom = aten.sum.dim_IntList(e, [-1], True)
    # A row with every key masked has denom 0: divide by 1 so its weights stay 0.
    safe_denom = fill_where(aten.eq.Scalar(denom, 0), 1, denom)
    out = matmul(aten.div.Tensor(e, safe_denom), v)
    # Such a row's logsumexp is 0, as eager's flash kernel writes it: its backward, which training
    # runs on this logsumexp, computes the weights as exp(score - logsumexp), NaN for -inf - -inf
    lse = aten.squeeze.dim(aten.add.Tensor(aten.log.default(safe_denom), row_max), -1)
    return to_dtype(out, query.dtype), lse


@register_decomposition(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    if dropout_p != 0.0:
        return NotImplemented  # random dropout of attention weights: keep the eager op
    if not enable_gqa and query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        raise RuntimeError(
            f"scaled_dot_product_attention: query has {query.shape[-3]} heads but key has "
            f"{key.shape[-3]}; pass enable_gqa=True for grouped-query attention"
        )
    return attention_math(query, key, value, attn_mask, is_causal, scale)[0]


@register_decomposition(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p != 0.0:
        return NotImplemented
    out, lse = attention_math(query, key, value, attn_mask, is_causal, scale)
    return _laid_out_like(out, query), lse


def _laid_out_like(out, query):
    """``out`` stored in the dimension order of a dense ``query``, as eager's kernel allocates its
    output (empty_like(query)): heads split from a (B, L, H*D) projection give (B, L, H, D) memory."""
    strides = query.stride()
    if not all(isinstance(s, int) for s in (*strides, *query.shape)):
        return out
    order = sorted(range(query.dim()), key=lambda d: -strides[d])
    dense, step = True, 1
    for d in reversed(order):
        dense, step = dense and (query.shape[d] == 1 or strides[d] == step), step * query.shape[d]
    if not dense or order == list(range(query.dim())):
        return out
    stored = aten.clone.default(aten.permute.default(out, order), memory_format=torch.contiguous_format)
    return aten.permute.default(stored, [order.index(d) for d in range(query.dim())])
