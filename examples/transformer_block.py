"""A GPT-2-style transformer block: the quickstart's main job.

Compiles the block with torch.compile(backend="minicompile"), prints the fusion groups and
the generated C++ kernels, and checks the result against eager PyTorch.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import run_example


class Block(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


torch.manual_seed(0)
model = Block().eval()                         # what `minicompile inspect` compiles
example_inputs = (torch.randn(2, 32, 64),)

if __name__ == "__main__":
    run_example("transformer block B2 T32 C64", model, example_inputs)
