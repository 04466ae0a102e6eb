"""Autoregressive generation with a compiled model: the sequence grows by one token per step,
and a symbolic build serves every length (docs/dynamic.md).

HF GPT-2 and Llama from small configs (random init, no downloads), ``generate()`` of 32 greedy
tokens with ``model.forward`` compiled by torch.compile(backend="minicompile"): the tokens equal
eager's, and the pipeline compiles stay at 3 (the prompt, the first cached step, then one
symbolic build for every later KV-cache length) instead of one per token.
"""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TOKENS = 32


def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=128,
                                  bos_token_id=0, eos_token_id=None)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   hidden_size=32, intermediate_size=64, vocab_size=128,
                                   max_position_embeddings=128, bos_token_id=0, eos_token_id=None)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_generate_compiles_at_most_3_times_and_matches_eager(build, compiles, fresh_dynamo):
    torch.manual_seed(0)
    model = build().eval()
    prompt = torch.randint(0, 128, (1, 5))
    settings = dict(max_new_tokens=TOKENS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        model.forward = torch.compile(model.forward, backend="minicompile")
        tokens = model.generate(prompt, **settings)
    assert tokens.shape == (1, 5 + TOKENS) and torch.equal(tokens, expected)
    assert 1 <= len(compiles) <= 3, [c.explain().splitlines()[0] for c in compiles]
    assert "int64_t s" in compiles[-1].kernel_source  # the last build takes the length as an argument
