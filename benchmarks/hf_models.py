"""Sixteen HF transformers architectures with tiny configs (random init, eval, default
``use_cache``) and their example inputs, for the capture table (bench_capture_hf.py --table)
and the capture tests. ``make(name)`` -> (model, kwargs for its forward)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 100
_DEC = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
                bos_token_id=0, eos_token_id=1, pad_token_id=1, decoder_start_token_id=0)
_T = transformers

CONFIGS = {
    "gpt2": lambda: _T.GPT2LMHeadModel(_T.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                                     n_positions=64, bos_token_id=0, eos_token_id=1)),
    "gptj": lambda: _T.GPTJForCausalLM(_T.GPTJConfig(n_layer=2, n_head=2, n_embd=32, rotary_dim=8,
                                                     vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                                                     eos_token_id=1)),
    "opt": lambda: _T.OPTForCausalLM(_T.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                                  num_attention_heads=2, word_embed_proj_dim=32,
                                                  vocab_size=VOCAB, max_position_embeddings=64,
                                                  bos_token_id=0, eos_token_id=1, pad_token_id=1)),
    "bloom": lambda: _T.BloomForCausalLM(_T.BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=VOCAB,
                                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)),
    "gpt_neo": lambda: _T.GPTNeoForCausalLM(_T.GPTNeoConfig(
        hidden_size=32, num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=4,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=1)),
    "llama": lambda: _T.LlamaForCausalLM(_T.LlamaConfig(num_key_value_heads=1, **_DEC)),
    "mistral": lambda: _T.MistralForCausalLM(_T.MistralConfig(num_key_value_heads=1, sliding_window=4, **_DEC)),
    "phi": lambda: _T.PhiForCausalLM(_T.PhiConfig(**_DEC)),
    "gemma": lambda: _T.GemmaForCausalLM(_T.GemmaConfig(num_key_value_heads=1, head_dim=16, **_DEC)),
    "mixtral": lambda: _T.MixtralForCausalLM(_T.MixtralConfig(num_key_value_heads=1, num_local_experts=4,
                                                              num_experts_per_tok=2, **_DEC)),
    "t5": lambda: _T.T5ForConditionalGeneration(_T.T5Config(
        d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, vocab_size=VOCAB, decoder_start_token_id=0,
        eos_token_id=1, pad_token_id=1)),
    "bart": lambda: _T.BartForConditionalGeneration(_T.BartConfig(**_SEQ2SEQ)),
    "whisper": lambda: _T.WhisperForConditionalGeneration(_T.WhisperConfig(
        num_mel_bins=8, max_source_positions=16, max_target_positions=32, **{
            k: v for k, v in _SEQ2SEQ.items() if k != "max_position_embeddings"})),
    "bert": lambda: _T.BertModel(_T.BertConfig(**{k: v for k, v in _DEC.items() if "token" not in k})),
    "albert": lambda: _T.AlbertModel(_T.AlbertConfig(embedding_size=16, **{
        k: v for k, v in _DEC.items() if "token" not in k})),
    "deberta_v2": lambda: _T.DebertaV2Model(_T.DebertaV2Config(**{
        k: v for k, v in _DEC.items() if "token" not in k})),
}
NAMES = list(CONFIGS)


def make(name: str, seed: int = 0):
    """(model in eval mode, forward kwargs) for ``name``; inputs from ``seed``."""
    torch.manual_seed(0)
    model = CONFIGS[name]().eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (2, 8), generator=g)
    if name == "whisper":
        return model, dict(input_features=torch.randn(2, 8, 32, generator=g), decoder_input_ids=ids[:, :4])
    if name in ("t5", "bart"):
        return model, dict(input_ids=ids, decoder_input_ids=ids[:, :4])
    return model, dict(input_ids=ids)


def tensors(obj, depth: int = 0) -> list:
    """Every tensor in a model output (ModelOutput, tuples, caches and their layers), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 6 or obj is None or isinstance(obj, (int, float, str, bool)):
        return []
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v, depth + 1)]
    if type(obj).__module__.startswith("transformers"):
        return [t for k, v in sorted(vars(obj).items()) for t in tensors(v, depth + 1)]
    return []
