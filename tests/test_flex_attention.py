"""flex_attention compiled to one fused C++ kernel (lowering/flex.py, codegen/cpp_flex.py).

Each test compiles a flex_attention call with torch.compile(backend="minicompile"), compares it
with eager's flex_attention (the unfused math: the whole score matrix, exact), and reads the
compiled graph's schedule: one fused attention kernel, no extern flex_attention call. What the
kernel does not cover stays the eager call, with its reason.
"""
import logging
import re

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from minicompile.config import patch
from minicompile.lowering import LOWERINGS
from minicompile.pipeline import CompiledGraph
from tests.helpers import Recorder, assert_matches_eager, compile_with_dynamo

B, H, L, D = 2, 4, 96, 16
SLOPES = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))   # ALiBi: one slope per head
BIAS = torch.randn(H, 2 * L - 1, generator=torch.Generator().manual_seed(7))   # relative position table


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + BIAS[h, q_idx - kv_idx + L - 1]


def soft_cap(score, b, h, q_idx, kv_idx):
    return 30 * torch.tanh(score / 30)


def causal_score(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= 24)


def qkv(heads_kv=H, lq=L, lk=L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, lq, D, generator=g), torch.randn(B, heads_kv, lk, D, generator=g),
            torch.randn(B, heads_kv, lk, D, generator=g))


def compiled_once(fn, *inputs, atol=2e-5, rtol=1e-5) -> CompiledGraph:
    """``fn`` compiled and run once against eager; the one graph it compiled to."""
    out, graphs = compile_with_dynamo(fn, *inputs)
    assert_matches_eager(out, fn(*inputs), atol=atol, rtol=rtol)
    assert len(graphs) == 1 and isinstance(graphs[0], CompiledGraph), graphs
    return graphs[0]


def assert_one_fused_kernel(graph: CompiledGraph) -> None:
    assert len(graph.schedule.templates) == 1, graph.explain()
    assert not [e for e in graph.externs if "flex" in e.op], graph.explain()
    assert graph.explain().count("fused flex_attention kernel") == 1
    assert "_flex_attention(" in graph.kernel_source


@pytest.mark.parametrize("score_mod,mask_mod", [(alibi, causal), (relative_bias, sliding_window),
                                                (soft_cap, causal), (causal_score, None)],
                         ids=["alibi-causal", "relative_bias-sliding_window", "soft_cap-causal", "causal_score"])
def test_score_mods_and_block_masks_match_eager(score_mod, mask_mod):
    mask = create_block_mask(mask_mod, B, H, L, L, device="cpu", BLOCK_SIZE=32) if mask_mod else None
    graph = compiled_once(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=mask), *qkv())
    assert_one_fused_kernel(graph)


def test_grouped_query_attention_with_sliding_window_and_lse():
    mask = create_block_mask(sliding_window, 1, 1, L, L, device="cpu", BLOCK_SIZE=16)   # broadcast over b, h

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=alibi, block_mask=mask, enable_gqa=True, return_lse=True, scale=0.3)
    graph = compiled_once(fn, *qkv(heads_kv=2))
    assert_one_fused_kernel(graph)


def late_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx >= 8)


def test_lengths_not_multiples_of_the_blocks_and_rows_fully_masked():
    """Queries 40, keys 72 in blocks of 16; rows below 8 see no key: output 0 and logsumexp -inf, as eager."""
    mask = create_block_mask(late_causal, B, 1, 40, 72, device="cpu", BLOCK_SIZE=16)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=soft_cap, block_mask=mask, return_lse=True)
    graph = compiled_once(fn, *qkv(lq=40, lk=72))
    assert_one_fused_kernel(graph)
    out, lse = graph_outputs = torch.compile(fn, backend="minicompile")(*qkv(lq=40, lk=72))
    assert graph_outputs and (out[:, :, :8] == 0).all() and torch.isneginf(lse[:, :, :8]).all()


def test_the_kernel_skips_blocks_the_mask_leaves_out():
    """A block mask with no partial blocks for the first query block: nothing of it is read; the
    kernel's loops run over the block lists, so eager's values come from the listed blocks only."""
    mask = create_block_mask(causal, 1, 1, L, L, device="cpu", BLOCK_SIZE=32)
    graph = compiled_once(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), *qkv())
    assert "kv_num_blocks" not in graph.kernel_source   # block counts are read from the tensors, not baked in
    assert "for (int64_t i = 0; i <" in graph.kernel_source


def test_float64_stays_the_eager_call_with_its_reason():
    q, k, v = (t.double() for t in qkv())
    graph = compiled_once(lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap), q, k, v, atol=1e-10)
    assert not graph.schedule.templates
    (extern,) = [e for e in graph.externs if "flex" in e.op]
    assert "float32" in extern.reason


@pytest.mark.parametrize("score_mod,mask_mod,block", [(alibi, sliding_window, 16), (relative_bias, causal, 16),
                                                      (soft_cap, None, 16), (soft_cap, late_causal, 16),
                                                      (alibi, causal, 24)],
                         ids=["alibi-sliding_window", "relative_bias-causal", "soft_cap", "rows_fully_masked",
                              "blocks_of_24-every_key"])
def test_triton_kernel_from_the_same_mod_bodies_in_the_interpreter(score_mod, mask_mod, block):
    """The Triton code generator's flex kernel (codegen/triton_flex.py), run by Triton's interpreter on
    CPU tensors: small shapes, GQA, lengths that are not multiples of its 16 x 16 tiles, rows with
    every key masked (output 0, logsumexp -inf); blocks of 24 rows straddle its programs, which then
    visit every key with the mask."""
    pytest.importorskip("triton")
    mask = create_block_mask(mask_mod, 1, 1, L, 40, device="cpu", BLOCK_SIZE=block) if mask_mod else None
    q, k, v = (t[:1, :, :, :] for t in qkv(heads_kv=2, lk=40))

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=True, return_lse=True)
    with patch(cpu_backend="triton"):
        graph = compiled_once(fn, q, k, v)
    assert graph.backend == "triton"
    assert_one_fused_kernel(graph)


def test_symbolic_sizes_stay_the_eager_call_with_its_reason():
    mask = create_block_mask(causal, 1, 1, L, L, device="cpu", BLOCK_SIZE=32)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap, block_mask=mask)  # noqa: E731
    record = Recorder()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(fn, backend=record, dynamic=True)
        assert_matches_eager(compiled(*qkv()), fn(*qkv()), atol=2e-5)
    graphs = [g for g in record.graphs if isinstance(g, CompiledGraph)]
    assert graphs and not any(g.schedule.templates for g in graphs)
    assert any("symbolic sizes" in e.reason for g in graphs for e in g.externs)


def test_backward_raises_as_eager_does():
    """torch's flex_attention has no backward on the CPU: compiled, the call raises the same error."""
    q, k, v = (t.requires_grad_() for t in qkv())
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap)  # noqa: E731
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        fn(q, k, v)
    torch._dynamo.reset()
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        torch.compile(fn, backend="minicompile")(q, k, v)


def test_check_names_the_flex_kernel_when_a_mod_is_lowered_wrongly(monkeypatch, caplog):
    """MINICOMPILE_CHECK=1 localises a wrong fused kernel: here tanh, in the soft-cap, lowered as cos."""
    monkeypatch.setitem(LOWERINGS, torch.ops.aten.tanh.default, LOWERINGS[torch.ops.aten.cos.default])
    mask = create_block_mask(causal, 1, 1, L, L, device="cpu", BLOCK_SIZE=32)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap, block_mask=mask)  # noqa: E731
    torch._dynamo.reset()
    with patch(check=True), caplog.at_level(logging.WARNING, logger="minicompile"), torch.no_grad():
        torch.compile(fn, backend="minicompile")(*qkv())
    reports = [r.getMessage() for r in caplog.records if "minicompile check" in r.getMessage()]
    assert len(reports) == 1 and re.search(r"kernel kernel\d+_flex_attention", reports[0]), reports


def test_heads_split_from_a_projection_inside_a_larger_graph():
    """Query, key and value as strided views of one (B, L, 3*H*D) projection, a computed query
    (realized for the kernel), the output merged back: the flex kernel among other kernels."""
    mask = create_block_mask(sliding_window, 1, 1, L, L, device="cpu", BLOCK_SIZE=32)

    def fn(x, w):
        qkv_ = (x @ w).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
        q, k, v = qkv_[0] * 0.5, qkv_[1], qkv_[2]
        out = flex_attention(q, k, v, score_mod=relative_bias, block_mask=mask)
        return out.transpose(1, 2).reshape(B, L, H * D).relu()
    g = torch.Generator().manual_seed(3)
    graph = compiled_once(fn, torch.randn(B, L, 32, generator=g), torch.randn(32, 3 * H * D, generator=g) / 6)
    assert_one_fused_kernel(graph)


def test_document_mask_reading_a_captured_tensor_and_one_tensor_as_query_key_and_value():
    """A mask_mod indexing captured document ids at q_idx and kv_idx; q, k and v one tensor."""
    doc = torch.arange(L) // 40

    def same_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
    mask = create_block_mask(same_document, 1, 1, L, L, device="cpu", BLOCK_SIZE=16)
    x = qkv()[0]
    graph = compiled_once(lambda x: flex_attention(x, x, x, score_mod=alibi, block_mask=mask), x)
    assert_one_fused_kernel(graph)


def test_a_mod_indexing_out_of_its_table_stays_the_eager_call():
    """An index expression that may leave the captured tensor (here below 0) is not loaded blindly:
    the op stays eager (which wraps negative indices), with the reason."""
    table = torch.randn(L)

    def shifted(score, b, h, q_idx, kv_idx):
        return score + table[q_idx - kv_idx]
    graph = compiled_once(lambda q, k, v: flex_attention(q, k, v, score_mod=shifted), *qkv())
    assert not graph.schedule.templates
    assert any("runs from" in e.reason for e in graph.externs), graph.explain()


def test_kernel_options_that_change_the_result_keep_the_eager_call():
    """An option the fused kernel does not honour (here one it does not know) keeps the extern call."""
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap, kernel_options={"SOME_NEW_OPTION": 1})  # noqa: E731
    graph = compiled_once(fn, *qkv())
    assert not graph.schedule.templates
    assert any("SOME_NEW_OPTION" in e.reason for e in graph.externs), graph.explain()


NARROW_MODS = {"alibi": lambda slopes: lambda s, b, h, q_idx, kv_idx: s + slopes[h] * (kv_idx - q_idx),
               "soft_cap": lambda slopes: soft_cap}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mod,heads_kv", [("alibi", H), ("soft_cap", H), ("alibi", 2)],
                         ids=["alibi-causal", "soft_cap-causal", "alibi-causal-gqa"])
def test_bfloat16_and_float16_compile_to_the_fused_kernel(dtype, mod, heads_kv):
    """Narrow q/k/v (and an ALiBi slope tensor of that dtype, captured): loaded as float32, scores, mods,
    softmax and output accumulated in float32 as eager's math does (it upcasts q and k and runs the
    score_mod on float32 scores), the output stored in ``dtype``, the logsumexp float32 as eager's.
    Within bfloat16's tolerance of eager, and no further from the float64 answer than eager is
    (eager also rounds the probabilities to ``dtype`` before their product with v; we do not)."""
    slopes = SLOPES.to(dtype)
    score_mod = NARROW_MODS[mod](slopes)
    mask = create_block_mask(causal, B, H, L, L, device="cpu", BLOCK_SIZE=32)
    q, k, v = (t.to(dtype) for t in qkv(heads_kv=heads_kv))

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=heads_kv != H, return_lse=True)
    graph = compiled_once(fn, q, k, v, atol=2e-2, rtol=2e-2)
    assert_one_fused_kernel(graph)
    (out, lse), (ref, ref_lse) = torch.compile(fn, backend="minicompile")(q, k, v), fn(q, k, v)
    assert out.dtype == dtype and lse.dtype == ref_lse.dtype == torch.float32
    exact = flex_attention(*(t.double() for t in (q, k, v)), score_mod=NARROW_MODS[mod](slopes.double()),
                           block_mask=mask, enable_gqa=heads_kv != H)
    ours, eager = ((o.double() - exact).abs().max().item() for o in (out, ref))
    assert ours <= eager * 1.01 + 1e-6, (ours, eager)


def test_triton_keeps_narrow_dtypes_as_the_eager_call():
    """The Triton flex kernel is float32 only (its narrow tl.dot has not run on a GPU): bfloat16 stays eager."""
    pytest.importorskip("triton")
    q, k, v = (t.to(torch.bfloat16) for t in qkv())
    with patch(cpu_backend="triton"):
        graph = compiled_once(lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap), q, k, v, atol=2e-2, rtol=2e-2)
    assert not graph.schedule.templates
    (extern,) = [e for e in graph.externs if "flex" in e.op]
    assert "float32 only" in extern.reason
