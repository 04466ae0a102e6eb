"""Small but real inference models for ``minicompile bench --models`` (no torchvision, no downloads).

Each is written the way timm / torchvision write the architecture, at a reduced width or
depth so that one benchmark run stays within minutes on 2 cores:

    resnet18      BasicBlocks [2, 2, 2, 2], widths 64-512: conv / BatchNorm / ReLU / residual,
                  max-pool stem, global average pool (torchvision's ResNet-18, full width)
    vit           ViT-Tiny/16 at 224: patch conv, 197 tokens, 3-head attention
                  (scaled_dot_product_attention), GELU MLP, LayerNorm; 6 of its 12 blocks
    convnext      ConvNeXt-Atto: 7x7 depthwise conv, channels-last LayerNorm (permute, LN,
                  Linear, GELU, Linear, layer scale, permute back), strided-conv downsampling
    swin          Swin-style: 4x4 patches, 7x7 windows, shifted windows by torch.roll with the
                  attention mask, relative position bias gathered from a table, patch merging
    efficientnet  EfficientNet-B0: MBConv (1x1 expand, depthwise 3x3/5x5, squeeze-excite with
                  SiLU and sigmoid, 1x1 project, BatchNorm, residual)
    gpt2, bert    Hugging Face GPT-2 / BERT from small configs (4 layers, hidden 256, random
                  init), 4 x 128 tokens; skipped when transformers is not installed

BatchNorm running statistics are randomised so that folding them is not an identity.
``MODELS[name].build(size, batch)`` returns ``(model in eval mode, inputs)``; sizes are "full"
(the benchmark), "quick" (narrower or shallower, smaller images or sequences, same batch) and
"tiny" (the tests); ``batch`` replaces the inputs' first size. tools/models_more.py holds the
wider half of the suite (ResNeXt, DenseNet, DeiT, MLP-Mixer, HF Llama and T5 encoder).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- ResNet-18

def conv_bn(cin, cout, k, stride=1, groups=1, act: type | None = nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, act=None)
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.conv2(self.conv1(x)) + self.down(x))


class ResNet18(nn.Module):
    def __init__(self, widths=(64, 128, 256, 512), classes=1000, depth=2):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, widths[0], 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):   # depth BasicBlocks a stage (ResNet-18: 2)
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2)] + [BasicBlock(w, w, 1) for _ in range(depth - 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


# ---------------------------------------------------------------- ViT

class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, bias=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Sequential):
    def __init__(self, dim, hidden):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class ViTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn, self.mlp = Attention(dim, heads), Mlp(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, img=224, patch=16, dim=192, depth=6, heads=3, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


# ---------------------------------------------------------------- ConvNeXt

class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's downsampling norm)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(40, 80, 160, 320), depths=(2, 2, 6, 2), classes=1000):
        super().__init__()
        stages = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (d, n) in enumerate(zip(dims, depths)):
            if i:
                stages += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, 2)]
            stages += [ConvNeXtBlock(d) for _ in range(n)]
        self.stages = nn.Sequential(*stages)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.stages(x).mean((2, 3))))


# ---------------------------------------------------------------- Swin

def window_partition(x, w):
    b, h, wd, c = x.shape
    x = x.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, w * w, c)


def window_reverse(x, w, b, h, wd):
    x = x.view(b, h // w, wd // w, w, w, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, wd, -1)


def shifted_window_mask(h, wd, w, shift) -> torch.Tensor:
    """(windows, w*w, w*w) additive mask: -100 between tokens that the roll brought together."""
    region = torch.zeros(1, h, wd, 1)
    cuts = (slice(0, -w), slice(-w, -shift), slice(-shift, None))
    for k, (hs, ws) in enumerate((a, b) for a in cuts for b in cuts):
        region[:, hs, ws, :] = k
    ids = window_partition(region, w).squeeze(-1)
    diff = ids.unsqueeze(1) - ids.unsqueeze(2)
    return diff.ne(0).float() * -100.0


class SwinBlock(nn.Module):
    def __init__(self, dim, heads, res, window=7, shift=0):
        super().__init__()
        self.heads, self.res, self.window, self.shift = heads, res, window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = Attention(dim, heads), Mlp(dim, 4 * dim)
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)
        mask = (shifted_window_mask(res, res, window, shift) if shift
                else torch.zeros((res // window) ** 2, window ** 2, window ** 2))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, n, c = x.shape
        h = wd = self.res
        w2 = self.window ** 2
        y = self.norm1(x).view(b, h, wd, c)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), (1, 2))
        windows = window_partition(y, self.window)
        bias = self.table[self.index.view(-1)].view(w2, w2, -1).permute(2, 0, 1)
        mask = (bias.unsqueeze(0) + self.mask.unsqueeze(1))              # (windows, heads, w2, w2)
        mask = mask.repeat(b, 1, 1, 1)
        y = window_reverse(self.attn(windows, mask), self.window, b, h, wd)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        x = x + y.reshape(b, n, c)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim, res):
        super().__init__()
        self.res = res
        self.norm, self.reduce = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        b, _, c = x.shape
        x = x.view(b, self.res // 2, 2, self.res // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduce(self.norm(x.reshape(b, -1, 4 * c)))


class Swin(nn.Module):
    def __init__(self, img=112, dim=48, depths=(2, 2, 2), heads=(3, 6, 12), classes=1000):
        super().__init__()
        self.patch, self.patch_norm = nn.Conv2d(3, dim, 4, 4), nn.LayerNorm(dim)
        layers, res = [], img // 4
        for i, (n, h) in enumerate(zip(depths, heads)):
            if i:
                layers.append(PatchMerging(dim, res))
                dim, res = 2 * dim, res // 2
            shift = 0 if res <= 7 else 3
            layers += [SwinBlock(dim, h, res, shift=shift * (k % 2)) for k in range(n)]
        self.layers = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_norm(self.patch(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(self.layers(x)).mean(1))


# ---------------------------------------------------------------- EfficientNet

class SqueezeExcite(nn.Module):
    def __init__(self, dim, reduced):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(dim, reduced, 1), nn.Conv2d(reduced, dim, 1)

    def forward(self, x):
        s = self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * s.sigmoid()


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, k, stride):
        super().__init__()
        mid = cin * expand
        self.expand = conv_bn(cin, mid, 1, act=nn.SiLU) if expand != 1 else nn.Identity()
        self.dw = conv_bn(mid, mid, k, stride, groups=mid, act=nn.SiLU)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = conv_bn(mid, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


# (expand, channels, repeats, stride, kernel): EfficientNet-B0's stages
B0 = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
      (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]


class EfficientNet(nn.Module):
    def __init__(self, stages=B0, classes=1000):
        super().__init__()
        blocks, cin = [conv_bn(3, 32, 3, 2, act=nn.SiLU)], 32
        for e, c, n, s, k in stages:
            for i in range(n):
                blocks.append(MBConv(cin, c, e, k, s if i == 0 else 1))
                cin = c
        blocks.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*blocks)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


# ---------------------------------------------------------------- Hugging Face

def _hf(kind: str, layers: int, hidden: int, batch: int, seq: int):
    import transformers
    heads = max(1, hidden // 64)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max(seq, 64),
                                      vocab_size=1000)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      intermediate_size=4 * hidden, vocab_size=1000,
                                      max_position_embeddings=max(seq, 64))
        model = transformers.BertModel(cfg)
    model.config.use_cache = False
    return HFLogits(model), (torch.randint(0, 1000, (batch, seq)),)


class HFLogits(nn.Module):
    """The HF model's first output only (a tensor, not a ModelOutput)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids)[0]


# ---------------------------------------------------------------- the table

def randomise_batch_norm(model: nn.Module) -> nn.Module:
    """Random running statistics and affine parameters, so BatchNorm is not an identity."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model


@dataclass
class ModelSpec:
    name: str
    describe: str                                 # architecture and input, for the table
    build_full: Callable[[], tuple]
    build_tiny: Callable[[], tuple]
    needs: str | None = None                      # a module that must import (transformers)
    build_quick: Callable[[], tuple] | None = None

    def build(self, size: str = "full", batch: int | None = None, dtype: str | None = None,
              autocast: str | None = None) -> tuple:
        """``dtype`` ("bf16", "fp16"): the model's parameters, buffers and floating inputs in it;
        ``autocast`` ("bf16", "fp16"): the model's forward runs under CPU autocast (``Autocast``)."""
        torch.manual_seed(0)
        make = {"full": self.build_full, "quick": self.build_quick or self.build_tiny, "tiny": self.build_tiny}
        model, inputs = make[size]()
        model, inputs = randomise_batch_norm(model).eval(), rebatch(inputs, batch)
        if dtype:
            model = model.to(DTYPES[dtype])
            inputs = tuple(x.to(DTYPES[dtype]) if x.is_floating_point() else x for x in inputs)
        return (Autocast(model, DTYPES[autocast]) if autocast else model), inputs


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Autocast(nn.Module):
    """``model`` called under ``torch.autocast("cpu", dtype)``, as inference code wraps its calls."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *inputs):
        with torch.autocast("cpu", dtype=self.dtype):
            return self.model(*inputs)


def rebatch(inputs: tuple, batch: int | None) -> tuple:
    """``inputs`` drawn again with ``batch`` as their first size (token ids stay below 1000)."""
    if batch is None:
        return inputs
    g = torch.Generator().manual_seed(2)
    return tuple(torch.randint(0, 1000, (batch, *x.shape[1:]), generator=g) if not x.is_floating_point()
                 else torch.randn((batch, *x.shape[1:]), generator=g, dtype=x.dtype) for x in inputs)


def _img(b, hw):
    return (torch.randn(b, 3, hw, hw),)


MODELS = {m.name: m for m in [
    ModelSpec("resnet18", "ResNet-18, 2x3x128x128",
              lambda: (ResNet18(), _img(2, 128)), lambda: (ResNet18((8, 8, 16, 16), 10), _img(1, 32)),
              build_quick=lambda: (ResNet18((32, 64, 128, 256)), _img(2, 64))),
    ModelSpec("vit", "ViT-Tiny/16 (6 blocks), 2x3x224x224",
              lambda: (ViT(), _img(2, 224)), lambda: (ViT(32, 8, 16, 2, 2, 10), _img(1, 32)),
              build_quick=lambda: (ViT(112, 16, 96, 3, 3), _img(2, 112))),
    ModelSpec("convnext", "ConvNeXt-Atto, 2x3x128x128",
              lambda: (ConvNeXt(), _img(2, 128)), lambda: (ConvNeXt((8, 16, 16, 32), (1, 1, 1, 1), 10), _img(1, 32)),
              build_quick=lambda: (ConvNeXt((24, 48, 96, 192), (1, 1, 3, 1)), _img(2, 64))),
    ModelSpec("swin", "Swin (dim 48, 2-2-2 blocks, window 7), 2x3x112x112",
              lambda: (Swin(), _img(2, 112)), lambda: (Swin(56, 16, (2, 2), (2, 2), 10), _img(1, 56)),
              build_quick=lambda: (Swin(56, 32, (2, 2), (2, 4)), _img(2, 56))),
    ModelSpec("efficientnet", "EfficientNet-B0, 2x3x128x128",
              lambda: (EfficientNet(), _img(2, 128)),
              lambda: (EfficientNet([(1, 8, 1, 1, 3), (4, 16, 2, 2, 5)], 10), _img(1, 32)),
              build_quick=lambda: (EfficientNet(), _img(2, 64))),
    ModelSpec("gpt2", "HF GPT-2 (4 layers, hidden 256), 4x128 tokens",
              lambda: _hf("gpt2", 4, 256, 4, 128), lambda: _hf("gpt2", 1, 64, 1, 16), needs="transformers",
              build_quick=lambda: _hf("gpt2", 2, 128, 4, 32)),
    ModelSpec("bert", "HF BERT (4 layers, hidden 256), 4x128 tokens",
              lambda: _hf("bert", 4, 256, 4, 128), lambda: _hf("bert", 1, 64, 1, 16), needs="transformers",
              build_quick=lambda: _hf("bert", 2, 128, 4, 32)),
]}


def _wider_suite():
    from minicompile.tools.models_more import MORE   # it builds on the classes above
    for name, (describe, make) in MORE.items():
        MODELS[name] = ModelSpec(name, describe, make["full"], make["tiny"], build_quick=make["quick"],
                                 needs="transformers" if name in ("llama", "t5") else None)


_wider_suite()
