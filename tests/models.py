"""Small representative models for the tracing tests."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, 5)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(B, T, C))
        x = x + self.mlp(self.ln2(x))
        return F.softmax(self.head(x), dim=-1)


class LanguageModelLoss(nn.Module):
    """Embedding -> RMS norm -> logits -> cross entropy."""

    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        logits = self.out(self.norm(self.emb(idx)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=0)


class ConvHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3)))


def model_cases():
    torch.manual_seed(0)
    conv = ConvHead()
    conv.bn.running_mean.uniform_(-1, 1)
    conv.bn.running_var.uniform_(0.5, 2)
    return [
        ("mlp_gelu", MLP(), [torch.randn(4, 16)]),
        ("transformer_block", TransformerBlock(), [torch.randn(2, 6, 16)]),
        ("embedding_rms_norm_cross_entropy", LanguageModelLoss(), [torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))]),
        ("batch_norm_eval_cnn_head", conv, [torch.randn(2, 3, 5, 5)]),
    ]
