"""The wider half of the ``bench --models`` suite (issue 27 item 3): architectures of other shapes.

    resnext    ResNeXt-50 32x4d-style bottlenecks: 1x1 reduce, grouped 3x3 (32 groups), 1x1 expand,
               BatchNorm, ReLU, projection shortcuts; two blocks a stage
    densenet   DenseNet-121-style dense blocks: BN-ReLU-1x1-BN-ReLU-3x3 layers whose outputs are
               concatenated onto every input before them, transitions (1x1 conv, 2x2 average pool)
    deit       DeiT-Tiny/16: a class and a distillation token, two heads averaged; 6 of its 12 blocks
    mixer      MLP-Mixer (/16 patches): token-mixing MLPs on the transposed tokens, channel MLPs
    llama      Hugging Face LlamaForCausalLM from a small config (RMSNorm, rotary embeddings,
               grouped-query attention, SwiGLU), logits; random init, no download
    t5         Hugging Face T5EncoderModel (relative position buckets, RMS-style T5 LayerNorm,
               ReLU feed-forward), last hidden state

Sizes: "full" (the benchmark; batch 2 images or 4 sequences, as models.py), "quick" (smaller
widths or depths, same batch) and "tiny" (the tests; batch 1). ``--batch N`` replaces the batch.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.tools.models import HFLogits, Mlp, ViTBlock, conv_bn


# ---------------------------------------------------------------- ResNeXt

class Bottleneck(nn.Module):
    def __init__(self, cin, width, cout, stride, groups):
        super().__init__()
        self.reduce = conv_bn(cin, width, 1)
        self.grouped = conv_bn(width, width, 3, stride, groups=groups)
        self.expand = conv_bn(width, cout, 1, act=None)
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.expand(self.grouped(self.reduce(x))) + self.down(x))


class ResNeXt(nn.Module):
    def __init__(self, stem=64, outs=(256, 512, 1024, 2048), depths=(2, 2, 2, 2), groups=32, base=4, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, stem, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], stem
        for i, (cout, n) in enumerate(zip(outs, depths)):
            width = groups * base * 2 ** i
            for k in range(n):
                blocks.append(Bottleneck(cin, width, cout, 2 if i and not k else 1, groups))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


# ---------------------------------------------------------------- DenseNet

class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size=4):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list):
        x = torch.cat(features, 1)
        return self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))


class DenseBlock(nn.ModuleList):
    def forward(self, x):
        features = [x]
        for layer in self:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, growth=32, blocks=(6, 12, 24, 16), stem=64, classes=1000):
        super().__init__()
        layers, c = [conv_bn(3, stem, 7, 2), nn.MaxPool2d(3, 2, 1)], stem
        for i, n in enumerate(blocks):
            layers.append(DenseBlock([DenseLayer(c + k * growth, growth) for k in range(n)]))
            c += n * growth
            if i < len(blocks) - 1:   # transition: BN, ReLU, 1x1 conv halving the channels, 2x2 average pool
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU())
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---------------------------------------------------------------- DeiT

class DeiT(nn.Module):
    """ViT with a distillation token beside the class token; eval averages the two heads."""

    def __init__(self, img=224, patch=16, dim=192, depth=6, heads=3, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.dist = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head, self.head_dist = nn.Linear(dim, classes), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        b = x.shape[0]
        x = torch.cat([self.cls.expand(b, -1, -1), self.dist.expand(b, -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2


# ---------------------------------------------------------------- MLP-Mixer

class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.tokens, self.channels = Mlp(tokens, token_hidden), Mlp(dim, channel_hidden)

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, img=224, patch=16, dim=256, depth=6, token_hidden=128, channel_hidden=1024, classes=1000):
        super().__init__()
        tokens = (img // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.blocks(self.patch(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


# ---------------------------------------------------------------- Hugging Face Llama, T5

def hf_llama(layers: int, hidden: int, heads: int, kv_heads: int, batch: int, seq: int):
    import transformers
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, intermediate_size=hidden * 8 // 3 // 8 * 8,
                                   vocab_size=1000, max_position_embeddings=max(seq, 64), use_cache=False)
    return HFLogits(transformers.LlamaForCausalLM(cfg)), (torch.randint(0, 1000, (batch, seq)),)


def hf_t5_encoder(layers: int, hidden: int, heads: int, batch: int, seq: int):
    import transformers
    cfg = transformers.T5Config(num_layers=layers, d_model=hidden, d_kv=hidden // heads, num_heads=heads,
                                d_ff=4 * hidden, vocab_size=1000, use_cache=False, dropout_rate=0.0)
    return HFLogits(transformers.T5EncoderModel(cfg)), (torch.randint(0, 1000, (batch, seq)),)


def _img(b, hw):
    return (torch.randn(b, 3, hw, hw),)


# name: (description of full, {size: build}); each build returns (model, inputs)
MORE = {
    "resnext": ("ResNeXt-50 32x4d-style (2 bottlenecks a stage), 2x3x128x128", {
        "full": lambda: (ResNeXt(), _img(2, 128)),
        "quick": lambda: (ResNeXt(32, (64, 128, 256, 512), (1, 1, 1, 1), 8, 4), _img(2, 64)),
        "tiny": lambda: (ResNeXt(8, (16, 32, 32, 64), (1, 1, 1, 1), 4, 2, 10), _img(1, 32))}),
    "densenet": ("DenseNet-121-style (growth 32, 6-12-24-16 layers), 2x3x128x128", {
        "full": lambda: (DenseNet(), _img(2, 128)),
        "quick": lambda: (DenseNet(16, (3, 6, 6, 4), 32), _img(2, 64)),
        "tiny": lambda: (DenseNet(4, (2, 3, 2, 2), 8, 10), _img(1, 32))}),
    "deit": ("DeiT-Tiny/16 with distillation token (6 blocks), 2x3x224x224", {
        "full": lambda: (DeiT(), _img(2, 224)),
        "quick": lambda: (DeiT(112, 16, 96, 3, 3), _img(2, 112)),
        "tiny": lambda: (DeiT(32, 8, 16, 2, 2, 10), _img(1, 32))}),
    "mixer": ("MLP-Mixer/16 (dim 256, 6 blocks), 2x3x224x224", {
        "full": lambda: (Mixer(), _img(2, 224)),
        "quick": lambda: (Mixer(112, 16, 128, 3, 64, 512), _img(2, 112)),
        "tiny": lambda: (Mixer(32, 8, 16, 2, 8, 32, 10), _img(1, 32))}),
    "llama": ("HF Llama (4 layers, hidden 256, 4 heads, 2 KV heads), 4x128 tokens", {
        "full": lambda: hf_llama(4, 256, 4, 2, 4, 128),
        "quick": lambda: hf_llama(2, 128, 2, 1, 4, 32),
        "tiny": lambda: hf_llama(1, 64, 2, 1, 1, 16)}),
    "t5": ("HF T5 encoder (4 layers, d_model 256, 4 heads), 4x128 tokens", {
        "full": lambda: hf_t5_encoder(4, 256, 4, 4, 128),
        "quick": lambda: hf_t5_encoder(2, 128, 2, 4, 32),
        "tiny": lambda: hf_t5_encoder(1, 64, 2, 1, 16)}),
}
