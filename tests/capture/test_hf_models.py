"""HF GPT-2, BERT and Llama (small configs, random init, eval, no_grad) through our capture
(graphs run as captured) and through ``minicompile.compile`` (the whole pipeline): outputs
match eager in 1 graph with no break and no fallback, and ``generate()`` with the compiled
model gives eager's tokens."""
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import minicompile   # noqa: E402
from minicompile.capture import compile as capture_compile   # noqa: E402

VOCAB = 100


def _make(name: str):
    torch.manual_seed(0)
    small = dict(vocab_size=VOCAB, max_position_embeddings=64)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64,
                                      bos_token_id=0, eos_token_id=1)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if name == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                      intermediate_size=64, **small)
        return transformers.BertModel(cfg).eval()
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   hidden_size=32, intermediate_size=64, bos_token_id=0, eos_token_id=1,
                                   **small)
    return transformers.LlamaForCausalLM(cfg).eval()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return True   # caches and other objects: their tensors are compared through the outputs


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_model_one_graph(name):
    model = _make(name)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        compiled = capture_compile(model)
        for _ in range(2):   # the trace, then a cache hit
            got = compiled(ids)
            assert type(got) is type(expected)
            assert _same(dict(expected), dict(got))
    report = compiled.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0 and not report.fallbacks, report
    assert not report.recompiles, report


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_model_through_the_pipeline(name):
    # minicompile.compile: our capture, then each graph through aot/decomp/lowering/codegen
    model = _make(name)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids)
        compiled = minicompile.compile(model)
        for _ in range(2):
            assert _same(dict(expected), dict(compiled(ids)))
    report = compiled.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0 and not report.fallbacks, report


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_generate_matches_eager(name):
    model = _make(name)
    ids = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=1)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        compiled = capture_compile(model)
        model.forward = compiled   # generate() calls self(...) -> the compiled forward
        try:
            got = model.generate(ids, **kwargs)
        finally:
            del model.forward
    assert torch.equal(got, expected), (got, expected)
    report = compiled.capture_report
    assert report.graphs and not report.fallbacks, report


def test_hf_t5_runs_and_matches_eager():
    # regression (issue 14's crash list): T5 took the program down. Its relative-position
    # bucketing does ``relative_buckets = 0; relative_buckets += t``, once recorded as a graph
    # node ``operator.iadd(0, t)`` whose generated code ``0 += t`` is a SyntaxError.
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(4))
    dec = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=dec).logits
        got = capture_compile(model)(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_inplace_operator_on_a_number_and_a_tensor():
    def fn(x):
        n = 0
        n += x * 2
        k = 3
        k *= x
        return n + k
    x = torch.randn(4)
    assert torch.equal(capture_compile(fn)(x), fn(x))
