"""flex_attention on the CPU: eager (unfused), eager SDPA, Inductor's compiled flex_attention and
minicompile's fused kernel (codegen/cpp_flex.py), on causal, sliding-window and ALiBi masks.

    THREADS=1 python benchmarks/bench_flex.py --batch 2 --heads 8 --length 1024 --dim 64 --reps 15

One process, the four calls taking turns (minicompile.tools.bench.time_interleaved), medians in
ms. SDPA gets the same attention as a mask it can take: ``is_causal`` for causal, a boolean mask
for the sliding window, an additive float mask (ALiBi bias plus causal -inf) for ALiBi. Every
compiled result is checked against eager flex_attention first. Results: docs/models.md "flex_attention".
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from minicompile.tools.bench import time_interleaved

WINDOW = 256


def cases(B, H, L, slopes):
    """name -> (score_mod, mask_mod, the SDPA keyword arguments giving the same attention)."""
    pos = torch.arange(L)
    causal_mask = pos[:, None] >= pos[None, :]
    window_mask = causal_mask & (pos[:, None] - pos[None, :] <= WINDOW)
    alibi_bias = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None]).float()
    alibi_bias = alibi_bias.masked_fill(~causal_mask, float("-inf"))

    def causal(b, h, q, kv):
        return q >= kv

    def sliding_window(b, h, q, kv):
        return (q >= kv) & (q - kv <= WINDOW)

    def alibi(score, b, h, q, kv):
        return score + slopes[h] * (kv - q)
    return {"causal": (None, causal, {"is_causal": True}),
            "sliding window": (None, sliding_window, {"attn_mask": window_mask}),
            "ALiBi (causal)": (alibi, causal, {"attn_mask": alibi_bias})}


def compiled(fn, backend, inputs):
    torch._dynamo.reset()
    t0 = time.perf_counter()
    c = torch.compile(fn, backend=backend, fullgraph=True)
    c(*inputs)
    return c, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--no-inductor", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    torch.manual_seed(0)
    B, H, L, D = a.batch, a.heads, a.length, a.dim
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32) * 8 / H)
    print(f"B={B} H={H} L={L} D={D}, float32, {torch.get_num_threads()} thread(s), {a.reps} interleaved reps; ms (median)")
    print("| mask | eager flex (unfused) | eager SDPA | Inductor flex | minicompile | ours / Inductor | ours / SDPA | "
          "compile s (Inductor, ours) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (score_mod, mask_mod, sdpa_kwargs) in cases(B, H, L, slopes).items():
        mask = create_block_mask(mask_mod, 1, 1, L, L, device="cpu")

        def flex(q, k, v):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)
        with torch.no_grad():
            ref = flex(q, k, v)
            steps = {"eager flex": lambda: flex(q, k, v),
                     "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)}
            compile_s = {}
            for label, backend in ([] if a.no_inductor else [("inductor", "inductor")]) + [("ours", "minicompile")]:
                fn, compile_s[label] = compiled(flex, backend, (q, k, v))
                err = (fn(q, k, v) - ref).abs().max().item()
                assert err < 1e-4, f"{label} differs from eager flex_attention on {name}: {err}"
                steps[label] = lambda fn=fn: fn(q, k, v)
            err = (steps["sdpa"]() - ref).abs().max().item()
            assert err < 1e-4, f"SDPA's mask for {name} is not the same attention: {err}"
            times = time_interleaved(list(steps.values()), a.reps)
        ms = {label: statistics.median(t) * 1e3 for label, t in zip(steps, times)}
        ind = ms.get("inductor", float("nan"))
        print(f"| {name} | {ms['eager flex']:.1f} | {ms['sdpa']:.1f} | {ind:.1f} | {ms['ours']:.1f} | "
              f"{ms['ours'] / ind:.2f} | {ms['ours'] / ms['sdpa']:.2f} | "
              f"{compile_s.get('inductor', float('nan')):.1f}, {compile_s['ours']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
