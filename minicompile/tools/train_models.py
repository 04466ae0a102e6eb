"""Real models as they train, for ``minicompile bench --train --models``.

Each model returns its training loss (a scalar), so a step is ``loss = model(*inputs);
loss.backward()``:

    gpt2, llama   Hugging Face GPT2LMHeadModel / LlamaForCausalLM (random init, vocab 1000),
                  their own causal-LM loss with labels = the input ids
    bert          Hugging Face BertForMaskedLM, its own masked-LM loss with labels = the input ids
    resnet18      tools/models.py's ResNet-18 (BatchNorm in train mode: batch statistics, running
    vit           statistics updated), ViT-Tiny/16 and ConvNeXt-Atto, cross-entropy against fixed
    convnext      random labels

Dropout is off in the HF configs (0.0 everywhere) so that the compiled gradients can be compared
with eager's; the models are otherwise as their configs build them (attention through
``scaled_dot_product_attention``, HF's default). Sizes:

    full   HF: 4 layers, hidden 256, 4 heads (Llama: 2 key/value heads), 4 x 128 tokens;
           vision: tools/models.py's full models and images, batch 2
    quick  HF: 2 layers, hidden 128, 2 heads (Llama: 1 key/value head), 2 x 32 tokens;
           vision: the full architectures at 2 x 3 x 64 x 64 (ViT: 2 of its blocks)
    tiny   (the tests) HF: 1 layer, hidden 64, 1 x 16 tokens; vision: tools/models.py's tiny ones
           (ResNet: one BasicBlock a stage), batch 2
           (BatchNorm in train mode needs more than one value per channel)

``TRAIN_MODELS[name].build(size)`` returns ``(model in train mode, inputs)``; the HF models
need transformers (``available`` says whether it imports).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.tools.models import ConvNeXt, ResNet18, ViT

VOCAB = 1000
HF_SIZES = {"full": dict(layers=4, hidden=256, heads=4, batch=4, seq=128),
            "quick": dict(layers=2, hidden=128, heads=2, batch=2, seq=32),
            "tiny": dict(layers=1, hidden=64, heads=2, batch=1, seq=16)}


class HFLoss(nn.Module):
    """The HF model's own language-modelling loss (labels = the input ids)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


class ClassifierLoss(nn.Module):
    """Cross-entropy of an image classifier's logits against the labels."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, labels):
        return F.cross_entropy(self.model(x), labels)


def _hf(kind: str, size: str) -> tuple:
    import transformers
    s = HF_SIZES[size]
    h, positions = s["hidden"], max(s["seq"], 64)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=s["layers"], n_embd=h, n_head=s["heads"], n_positions=positions,
                                      vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=s["layers"], hidden_size=h, num_attention_heads=s["heads"],
                                       num_key_value_heads=max(1, s["heads"] // 2), intermediate_size=_llama_mlp(h),
                                       max_position_embeddings=positions, vocab_size=VOCAB, attention_dropout=0.0)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.BertConfig(num_hidden_layers=s["layers"], hidden_size=h, num_attention_heads=s["heads"],
                                      intermediate_size=4 * h, max_position_embeddings=positions, vocab_size=VOCAB,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = transformers.BertForMaskedLM(cfg)
    model.config.use_cache = False
    return HFLoss(model), (torch.randint(0, VOCAB, (s["batch"], s["seq"])),)


def _llama_mlp(hidden: int) -> int:
    """Llama's SwiGLU width: 8/3 of the hidden size, rounded up to a multiple of 16."""
    return -(-8 * hidden // 3 // 16) * 16


def _describe_hf(kind: str, size: str) -> str:
    s = HF_SIZES[size]
    kv = f" ({max(1, s['heads'] // 2)} kv)" if kind == "llama" else ""
    return (f"{s['layers']} layer(s), hidden {s['hidden']}, {s['heads']} heads{kv}, vocab {VOCAB}, "
            f"{s['batch']}x{s['seq']} tokens, own LM loss")


VISION = {   # name: size -> (model, batch, image side)
    "resnet18": {"full": lambda: (ResNet18(), 2, 128), "quick": lambda: (ResNet18(), 2, 64),
                 "tiny": lambda: (ResNet18((8, 8, 16, 16), 10, depth=1), 2, 32)},
    "vit": {"full": lambda: (ViT(), 2, 224), "quick": lambda: (ViT(img=64, depth=2), 2, 64),
            "tiny": lambda: (ViT(32, 8, 16, 2, 2, 10), 2, 32)},
    "convnext": {"full": lambda: (ConvNeXt(), 2, 128), "quick": lambda: (ConvNeXt(), 2, 64),
                 "tiny": lambda: (ConvNeXt((8, 16, 16, 32), (1, 1, 1, 1), 10), 2, 32)},
}
VISION_NAMES = {"resnet18": "ResNet-18", "vit": "ViT-Tiny/16", "convnext": "ConvNeXt-Atto"}


def _vision(name: str, size: str) -> tuple:
    model, batch, side = VISION[name][size]()
    classes = model.fc.out_features if name == "resnet18" else model.head.out_features
    x = torch.randn(batch, 3, side, side)
    return ClassifierLoss(model), (x, torch.randint(0, classes, (batch,)))


def _describe_vision(name: str, size: str) -> str:
    model, batch, side = VISION[name][size]()
    params = sum(p.numel() for p in model.parameters())
    kind = "reduced widths, " if size == "tiny" else ""
    blocks = f"{len(model.blocks)} blocks, " if name in ("vit", "resnet18") else ""
    return (f"{VISION_NAMES[name]} ({kind}{blocks}{params / 1e6:.2f}M parameters), {batch}x3x{side}x{side}, "
            "cross-entropy")


@dataclass
class TrainModel:
    name: str
    make: Callable[[str], tuple]          # size -> (model returning its loss, inputs)
    describe: Callable[[str], str]        # size -> the architecture and input, for the table
    needs: str | None = None              # a module that must import (transformers)

    def available(self) -> bool:
        return self.needs is None or importlib.util.find_spec(self.needs) is not None

    def build(self, size: str) -> tuple:
        torch.manual_seed(0)
        model, inputs = self.make(size)
        return model.train(), inputs


TRAIN_MODELS = {m.name: m for m in [
    TrainModel("gpt2", lambda s: _hf("gpt2", s), lambda s: "HF GPT-2, " + _describe_hf("gpt2", s), "transformers"),
    TrainModel("llama", lambda s: _hf("llama", s), lambda s: "HF Llama, " + _describe_hf("llama", s), "transformers"),
    TrainModel("bert", lambda s: _hf("bert", s), lambda s: "HF BERT (masked LM), " + _describe_hf("bert", s),
               "transformers"),
    *[TrainModel(n, lambda s, n=n: _vision(n, s), lambda s, n=n: _describe_vision(n, s)) for n in VISION],
]}
