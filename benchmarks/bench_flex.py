"""flex_attention on the CPU: eager (unfused), eager SDPA, Inductor's compiled flex_attention and
minicompile's fused kernel (codegen/cpp_flex.py), on causal, sliding-window and ALiBi masks.

    THREADS=1 python benchmarks/bench_flex.py --batch 2 --heads 8 --length 1024 --dim 64 --reps 15

One process, the four calls taking turns (minicompile.tools.bench.time_interleaved), medians in
ms. SDPA gets the same attention as a mask it can take: ``is_causal`` for causal, a boolean mask
for the sliding window, an additive float mask (ALiBi bias plus causal -inf) for ALiBi. Every
compiled result is checked against eager flex_attention first (float32: within 1e-4; ``--dtype bfloat16``
or ``float16``: q, k, v, the ALiBi slopes and SDPA's masks in that dtype, within 3e-2), and each one's
largest distance from float64 flex_attention on the same inputs is printed. Results: docs/models.md "flex_attention".
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
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    torch.manual_seed(0)
    B, H, L, D = a.batch, a.heads, a.length, a.dim
    dtype = getattr(torch, a.dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    q, k, v = (torch.randn(B, H, L, D).to(dtype) for _ in range(3))
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32) * 8 / H).to(dtype)
    print(f"B={B} H={H} L={L} D={D}, {a.dtype}, {torch.get_num_threads()} thread(s), {a.reps} interleaved reps; ms (median)")
    print("| mask | eager flex (unfused) | eager SDPA | Inductor flex | minicompile | ours / Inductor | ours / SDPA | "
          "compile s (Inductor, ours) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (score_mod, mask_mod, sdpa_kwargs) in cases(B, H, L, slopes).items():
        mask = create_block_mask(mask_mod, 1, 1, L, L, device="cpu")
        sdpa_kwargs = {k_: m_.to(dtype) if getattr(m_, "dtype", None) == torch.float32 else m_ for k_, m_ in sdpa_kwargs.items()}

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
                assert err < tol, f"{label} differs from eager flex_attention on {name}: {err}"
                steps[label] = lambda fn=fn: fn(q, k, v)
            err = (steps["sdpa"]() - ref).abs().max().item()
            assert err < tol, f"SDPA's mask for {name} is not the same attention: {err}"
            exact = _exact(q, k, v, score_mod, mask, slopes) if dtype != torch.float32 else None
            errs = {label: (step().double() - exact).abs().max().item() for label, step in steps.items()} if exact is not None else {}
            times = time_interleaved(list(steps.values()), a.reps)
        ms = {label: statistics.median(t) * 1e3 for label, t in zip(steps, times)}
        ind = ms.get("inductor", float("nan"))
        print(f"| {name} | {ms['eager flex']:.1f} | {ms['sdpa']:.1f} | {ind:.1f} | {ms['ours']:.1f} | "
              f"{ms['ours'] / ind:.2f} | {ms['ours'] / ms['sdpa']:.2f} | "
              f"{compile_s.get('inductor', float('nan')):.1f}, {compile_s['ours']:.1f} |", flush=True)
        if errs:
            print("    max |x - float64 flex|: " + ", ".join(f"{k_} {e:.2e}" for k_, e in errs.items()), flush=True)


def _exact(q, k, v, score_mod, mask, slopes):
    """flex_attention in float64 on the same (narrow) inputs, the slopes widened too."""
    mod = score_mod
    if score_mod is not None:
        s64 = slopes.double()

        def mod(score, b, h, q_idx, kv_idx):
            return score + s64[h] * (kv_idx - q_idx)
    with torch.no_grad():
        return flex_attention(q.double(), k.double(), v.double(), score_mod=mod, block_mask=mask)


if __name__ == "__main__":
    main()
