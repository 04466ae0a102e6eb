"""CPU attention: eager's fused flash kernel or our math form (aot/cpu_policy.py use_fused_cpu_attention).

The test run pins the math form (conftest); these tests set ``cpu_attention`` themselves."""
import pytest
import torch
import torch.nn.functional as F

from minicompile.aot import cpu_policy
from minicompile.config import patch
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

    def fake_choice(key, candidates, what="", prefer=None, margin=0.0):
        seen.append((key, what, prefer))
        for run in candidates.values():   # both candidates run on real tensors of the traced layout
            run()
        return "flash"
    monkeypatch.setattr(cpu_policy, "library_choice", fake_choice)
    with patch(cpu_attention="auto"), torch.no_grad():
        c = check(attention, *_inputs(), atol=1e-5, rtol=1e-4)
    assert FLASH in c.wrapper_source
    assert len(seen) == 1 and seen[0][2] == "flash" and "masked" in seen[0][1]


def test_auto_choice_is_remembered_per_shape(monkeypatch):
    keys = []

    def recording(key, *args, **kwargs):
        keys.append(key)
        return autotune.library_choice(key, *args, **kwargs)
    monkeypatch.setattr(cpu_policy, "library_choice", recording)
    q, k, v, mask = _inputs()
    with patch(cpu_attention="auto"):
        first = cpu_policy.use_fused_cpu_attention(q, k, v, mask)
        assert autotune.load_timings(keys[0]) is not None   # both forms' times are kept on disk
        monkeypatch.setattr(autotune, "_library_choices", {})    # a new process: read from disk
        monkeypatch.setattr(autotune, "_library_times", {})
        monkeypatch.setattr(autotune, "_interleaved_best", lambda c: pytest.fail("measured twice"))
        assert cpu_policy.use_fused_cpu_attention(q, k, v, mask) == first
        assert len(set(keys)) == 1


def test_unknown_attention_choice_is_a_clear_error():
    with patch(cpu_attention="fastest"), pytest.raises(ValueError, match="use 'auto', 'math' or 'flash'"):
        compile_fn(attention, *_inputs())
