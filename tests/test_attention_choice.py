"""CPU attention: eager's fused flash kernel or our math form (cpu/claims.py use_fused_cpu_attention).

The test run pins the math form (conftest); these tests set ``cpu_attention`` themselves."""
import os

import pytest
import torch
import torch.nn.functional as F

from minicompile.cpu import claims as cpu_policy
from minicompile.config import patch
from minicompile.decomp import DECOMPOSITIONS
from minicompile.cpu import timing
from minicompile.runtime import autotune
from tests.helpers import Recorder, check, compile_fn

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu"


def attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_heads(qkv):
    """Heads split from one projection (strided query, key and value), causal, merged back."""
    b, t, c3 = qkv.shape
    q, k, v = qkv.view(b, t, 3, 2, c3 // 6).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c3 // 3)


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(2, 3, 9, 8), torch.randn(2, 3, 11, 8), torch.randn(2, 3, 11, 8), torch.randn(2, 1, 9, 11)]


@pytest.mark.parametrize("mode,flash", [("math", False), ("flash", True)])
def test_pinned_choice_runs_that_form_and_matches_eager(mode, flash):
    with patch(cpu_attention=mode), torch.no_grad():
        for fn, inputs in ((attention, _inputs()), (causal_heads, [torch.randn(2, 7, 48)])):
            c = check(fn, *inputs, atol=1e-5, rtol=1e-4)
            assert (FLASH in c.wrapper_source) == flash


def test_flash_trains_with_eagers_gradients():
    torch.manual_seed(0)
    qkv = torch.randn(2, 7, 48, requires_grad=True)
    ref = qkv.detach().clone().requires_grad_()
    torch._dynamo.reset()
    record = Recorder()
    with patch(cpu_attention="flash"):
        out = torch.compile(causal_heads, backend=record)(qkv)
    expected = causal_heads(ref)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(qkv.grad, ref.grad, atol=1e-5, rtol=1e-4)
    (graph,) = record.training     # compiled for training, flash forward and backward as extern calls
    assert FLASH in graph.forward.wrapper_source and graph.backward_calls == 1
    assert FLASH + "_backward" in graph.backward.wrapper_source


def test_auto_measures_each_shape_once_and_follows_the_measurement(monkeypatch):
    seen = []

    def fake_choice(key, candidates, what="", prefer=None, margin=0.0, otherwise=None):
        seen.append((key, what, prefer, otherwise))
        for run in candidates.values():   # both candidates run on real tensors of the traced layout
            run()
        return "flash"
    measure_afresh(monkeypatch)
    monkeypatch.setattr(timing, "library_choice", fake_choice)
    with patch(cpu_attention="auto"), torch.no_grad():
        c = check(attention, *_inputs(), atol=1e-5, rtol=1e-4)
    assert FLASH in c.wrapper_source
    assert len(seen) == 1 and seen[0][2:] == ("flash", "math") and "masked" in seen[0][1]


def test_auto_choice_is_remembered_per_shape(monkeypatch):
    keys = []
    real_choice = timing.library_choice

    def recording(key, *args, **kwargs):
        keys.append(key)
        return real_choice(key, *args, **kwargs)
    monkeypatch.setattr(timing, "library_choice", recording)
    q, k, v, mask = _inputs()
    with patch(cpu_attention="auto"):
        first = cpu_policy.use_fused_cpu_attention(q, k, v, mask)
        assert autotune.load_timings(keys[0]) is not None   # both forms' times are kept on disk
        monkeypatch.setattr(timing, "_library_choices", {})    # a new process: read from disk
        monkeypatch.setattr(timing, "_library_times", {})
        monkeypatch.setattr(timing, "_interleaved_best", lambda c: pytest.fail("measured twice"))
        assert cpu_policy.use_fused_cpu_attention(q, k, v, mask) == first
        assert len(set(keys)) == 1


# -- every shape: grouped heads, masks, causal, dropout; no shape leaves attention uncompiled ---------

B, L, S, D = 2, 5, 6, 8
# (query heads, key/value heads) x how the model shares key/value heads between query heads
SHARING = [(4, 1, "enable_gqa"), (4, 1, "repeat_interleave"), (4, 1, "expand"),
           (4, 2, "enable_gqa"), (4, 2, "repeat_interleave"), (4, 2, "expand"), (4, 4, "enable_gqa")]
MASKS = [None, "bool", "bool_2d", "float", "float_expanded", "causal"]


def grouped_attention(heads: int, kv_heads: int, sharing: str, mask_kind, dropout_p: float = 0.0):
    """F.scaled_dot_product_attention with ``kv_heads`` key/value heads shared by ``heads`` query
    heads: by the op itself (enable_gqa), or repeated first as models do (repeat_interleave;
    HF's repeat_kv, an expand that is a stride-0 view for one key/value head)."""
    def fn(q, k, v, mask):
        if sharing == "repeat_interleave":
            k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        elif sharing == "expand":
            k, v = (t[:, :, None].expand(B, kv_heads, heads // kv_heads, S, D).reshape(B, heads, S, D) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=mask_kind == "causal", enable_gqa=sharing == "enable_gqa")
    return fn


def grouped_inputs(heads: int, kv_heads: int, mask_kind, requires_grad: bool):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, h, n, D, requires_grad=requires_grad)
               for h, n in ((heads, L), (kv_heads, S), (kv_heads, S)))
    mask = {None: None, "causal": None,
            "bool": torch.rand(B, 1, L, S) > 0.3,     # True: may attend
            "bool_2d": torch.rand(L, S) > 0.3,
            "float": torch.randn(B, 1, L, S),
            "float_expanded": torch.randn(1, 1, L, S).expand(B, heads, L, S)}[mask_kind]   # stride 0
    if mask_kind in ("bool", "float"):   # rows that see no key: output 0, and no NaN in the gradients
        mask[1, 0, :2] = False if mask.dtype == torch.bool else float("-inf")
    return q, k, v, mask


def compiled_and_eager(fn, inputs, train: bool):
    """``fn`` through torch.compile(backend=minicompile) and eager: outputs, the input gradients
    (training) and the wrapper source of every compiled graph (forward and backward)."""
    record = Recorder()
    torch._dynamo.reset()
    results = []
    for run in (torch.compile(fn, backend=record), fn):
        torch.manual_seed(1)   # the same dropout mask in both
        with torch.set_grad_enabled(train):
            out = run(*inputs)
        grads = torch.autograd.grad(out, inputs[:3], torch.ones_like(out) * 0.5) if train else ()
        results.append((out, grads))
    torch._dynamo.reset()
    assert record.graphs, "nothing compiled"
    parts = [p for g in record.graphs for p in ((g.forward, g.backward) if hasattr(g, "forward") else (g,))]
    return results, [p.wrapper_source for p in parts if p is not None]


def measure_afresh(monkeypatch):
    """"auto" measures here, as in a new process on a new machine (no choice kept in memory or on disk)."""
    monkeypatch.setattr(timing, "_library_choices", {})
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)


# the default run measures ("auto", what users get and what raised); the pinned forms are slow
EVERY_MODE = ["auto", pytest.param("math", marks=pytest.mark.slow), pytest.param("flash", marks=pytest.mark.slow)]


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("heads,kv_heads,sharing", SHARING, ids=[f"{h}q{k}kv-{s}" for h, k, s in SHARING])
@pytest.mark.parametrize("mode", EVERY_MODE)
def test_grouped_heads_masks_and_causal_compile_in_every_mode_and_match_eager(mode, heads, kv_heads, sharing, train,
                                                                             monkeypatch):
    measure_afresh(monkeypatch)
    with patch(cpu_attention=mode):
        for mask_kind in MASKS:
            inputs = grouped_inputs(heads, kv_heads, mask_kind, train)
            fn = grouped_attention(heads, kv_heads, sharing, mask_kind)
            ((out, grads), (expected, expected_grads)), wrappers = compiled_and_eager(fn, inputs, train)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4, msg=lambda m: f"{mask_kind}: {m}")
            for g, e in zip(grads, expected_grads):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4, msg=lambda m: f"{mask_kind} grad: {m}")
            forward_flash = any(FLASH + ".default" in w for w in wrappers)   # not its backward's
            assert forward_flash == (mode == "flash") or mode == "auto", mask_kind


@pytest.mark.parametrize("mode", ["auto", "math", "flash"])
def test_attention_with_dropout_compiles_and_draws_eagers_mask(mode):
    """Seeded alike, the compiled graph drops the weights eager drops (its bernoulli, an extern)."""
    heads, kv_heads = 4, 1
    fn = grouped_attention(heads, kv_heads, "enable_gqa", None, dropout_p=0.3)
    inputs = grouped_inputs(heads, kv_heads, None, True)
    with patch(cpu_attention=mode):
        ((out, grads), (expected, expected_grads)), wrappers = compiled_and_eager(fn, inputs, train=True)
    undropped = grouped_attention(heads, kv_heads, "enable_gqa", None)(*inputs)
    assert not torch.allclose(out, undropped, atol=1e-3)   # weights were dropped
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grads, expected_grads, atol=1e-5, rtol=1e-4)
    assert not any(FLASH in w for w in wrappers)   # eager itself runs dropout in the math form on CPU


def test_auto_decomposes_to_math_where_no_candidate_runs(monkeypatch):
    def cannot_run(t):
        raise RuntimeError("operands cannot be made")
    monkeypatch.setattr(cpu_policy, "_random_as", cannot_run)
    measure_afresh(monkeypatch)
    with patch(cpu_attention="auto"), torch.no_grad():
        c = check(attention, *_inputs(), atol=1e-5, rtol=1e-4)
    assert FLASH not in c.wrapper_source


def test_auto_times_both_forms_on_repeated_heads_and_expanded_masks(monkeypatch):
    """The operands of the timing are laid out as the traced ones, stride 0 included: HF's
    repeated key/value heads (one head, expanded) made both candidates fail to be built."""
    ran = []
    real_choice = timing.library_choice

    def recording(key, candidates, *args, **kwargs):
        for name, run in candidates.items():
            run()
            ran.append(name)
        return real_choice(key, candidates, *args, **kwargs)
    monkeypatch.setattr(timing, "library_choice", recording)
    measure_afresh(monkeypatch)
    inputs = grouped_inputs(4, 1, "float_expanded", False)
    with patch(cpu_attention="auto"), torch.no_grad():
        check(grouped_attention(4, 1, "expand", "float_expanded"), *inputs, atol=1e-5, rtol=1e-4)
    assert sorted(ran) == ["flash", "math"]


def test_random_operands_keep_the_traced_layout():
    expanded = torch.randn(2, 1, 5, 8).expand(2, 4, 5, 8)
    for t in (expanded, torch.rand(3, 1, 4) > 0.5, torch.randn(4, 6).t()):
        made = cpu_policy._random_as(t)
        assert (made.shape, made.stride(), made.dtype) == (t.shape, t.stride(), t.dtype)


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (4, 2), (4, 4)])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "causal"])
def test_math_decomposition_of_sdpa_shares_key_value_heads_as_eager(heads, kv_heads, mask_kind):
    decomposed = DECOMPOSITIONS[torch.ops.aten.scaled_dot_product_attention.default]
    q, k, v, mask = grouped_inputs(heads, kv_heads, mask_kind, False)
    kwargs = dict(attn_mask=mask, is_causal=mask_kind == "causal", enable_gqa=True)
    torch.testing.assert_close(decomposed(q, k, v, **kwargs), F.scaled_dot_product_attention(q, k, v, **kwargs),
                               atol=1e-5, rtol=1e-4)
    if kv_heads != heads:
        with pytest.raises(RuntimeError, match="enable_gqa=True"):
            decomposed(q, k, v, attn_mask=mask)
    with pytest.raises(RuntimeError, match="needs a multiple"):
        decomposed(q, k[:, :1].expand(B, 3, S, D), v[:, :1].expand(B, 3, S, D), enable_gqa=True)


def tiny_gemma():
    """HF Gemma from a small config (random init, no download): multi-query attention, 4 query heads
    reading 1 key/value head (repeated by HF's repeat_kv, or enable_gqa, as its SDPA path chooses)."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = transformers.GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                      max_position_embeddings=32, attn_implementation="sdpa")
    return transformers.GemmaForCausalLM(config)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("mode", EVERY_MODE)
def test_hf_gemma_multi_query_attention_compiles_and_matches_eager(mode, train, monkeypatch):
    model = tiny_gemma().train(train)
    ids = torch.randint(0, 64, (2, 7))
    padding = torch.ones(2, 7, dtype=torch.long)
    padding[1, :2] = 0   # left padding: a mask expanded over the heads
    measure_afresh(monkeypatch)
    record = Recorder()
    torch._dynamo.reset()
    with patch(cpu_attention=mode), torch.set_grad_enabled(train):
        logits = torch.compile(model, backend=record)(ids, attention_mask=padding).logits
        expected = model(ids, attention_mask=padding).logits
    torch._dynamo.reset()
    assert record.graphs   # compiled by minicompile (tests raise where users would fall back to eager)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    if train:
        grad = torch.randn_like(logits)
        params = [p for p in model.parameters() if p.requires_grad]
        got = torch.autograd.grad(logits, params, grad, allow_unused=True)
        want = torch.autograd.grad(expected, params, grad, allow_unused=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["math", "flash", "auto"])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("projected,strides", [(True, (160, 16, 32, 1)), (False, (160, 80, 16, 1))])
def test_attention_output_is_laid_out_as_its_query(mode, mask, projected, strides, monkeypatch):
    """Eager's CPU kernel allocates its output like the query: heads split from a (B, L, H*D)
    projection give (B, L, H, D) memory, a (B, H, L, D) query contiguous memory. The math form
    stores its result so too (the bug-class fuzzer's attention class found both differing)."""
    measure_afresh(monkeypatch)

    def fn(x, k, m):
        q = x.view(2, 5, 2, 16).transpose(1, 2) if projected else x
        return F.scaled_dot_product_attention(q, k, k, attn_mask=m, scale=0.3, enable_gqa=True)
    x = torch.randn(2, 5, 32) if projected else torch.randn(2, 2, 5, 16)
    k, m = torch.randn(2, 1, 5, 16), (torch.rand(5, 5) < 0.7 if mask else None)
    with patch(cpu_attention=mode), torch.no_grad():
        c = check(fn, x, k, m, atol=1e-5, rtol=1e-4, trace="fake")
    assert c(x, k, m).stride() == fn(x, k, m).stride() == strides
