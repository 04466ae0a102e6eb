"""GPU benchmark: eager vs minicompile (Triton) vs Inductor, float32 and bfloat16, in one run.

    python benchmarks/bench_gpu.py            # prints a markdown table (paste it into docs/triton.md)
    python benchmarks/bench_gpu.py --quick    # smaller shapes, fewer repeats

Every timer read is preceded by ``torch.cuda.synchronize()``. Memory-bound workloads also
report achieved bandwidth (bytes the graph must read and write at least, over the compiled
time) as a fraction of the device's measured device-to-device copy bandwidth. Exits cleanly
(status 0, with a message) when no CUDA device exists.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, args, reps: int) -> float:
    """Median seconds per call, synchronizing before every timer read."""
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), (), reps)
    return 2 * nbytes / t


def pointwise_chain(x, y):
    return ((x * 2 + y).relu() * x).sin() - y.exp()


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def transformer_block(x, ln1_w, ln1_b, w_qkv, w_out, ln2_w, ln2_b, w_fc, w_proj):
    B, T, C = x.shape
    H = 8
    h = F.layer_norm(x, (C,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv).split(C, dim=-1)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + y.transpose(1, 2).reshape(B, T, C) @ w_out
    h = F.layer_norm(x, (C,), ln2_w, ln2_b)
    return x + F.gelu(h @ w_fc) @ w_proj


def workloads(dtype, quick: bool):
    n, c = (1024, 1024) if quick else (8192, 4096)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=dtype)  # noqa: E731
    B, T, C = (4, 256, 512) if quick else (8, 1024, 1024)
    return [
        # name, fn, inputs, minimum bytes moved (None: compute-bound, no bandwidth column)
        ("pointwise chain", pointwise_chain, (r(n, c), r(c)), None),
        ("softmax", softmax, (r(n, c),), None),
        ("layer_norm", layer_norm, (r(n, c), r(c), r(c)), None),
        ("mlp", mlp, (r(B * T, C), r(4 * C, C), r(4 * C), r(C, 4 * C), r(C)), "compute"),
        ("transformer block", transformer_block,
         (r(B, T, C), r(C), r(C), r(C, 3 * C), r(C, C), r(C), r(C), r(C, 4 * C), r(4 * C, C)), "compute"),
    ]


def min_bytes(fn, inputs) -> int:
    """Inputs read once plus outputs written once: what a perfectly fused graph moves."""
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(t.numel() * t.element_size() for t in (*inputs, *outs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device found; this benchmark needs a GPU (the Triton path is tested on CPU "
              "in interpreter mode by tests/test_triton.py). Nothing measured.")
        return 0
    reps = 10 if args.quick else args.reps
    copy_bw = copy_bandwidth(1 << 28 if args.quick else 1 << 30)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"measured copy bandwidth {copy_bw / 1e9:.0f} GB/s\n")
    print("| workload | dtype | eager ms | minicompile ms | inductor ms | vs eager | vs inductor | bandwidth |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for name, fn, inputs, kind in workloads(dtype, args.quick):
            with torch.no_grad():
                torch._dynamo.reset()
                ours = torch.compile(fn, backend="minicompile")
                ours(*inputs)
                torch._dynamo.reset()
                ind = torch.compile(fn, backend="inductor")
                ind(*inputs)
                t_eager = timed(fn, inputs, reps)
                torch._dynamo.reset()
                ours = torch.compile(fn, backend="minicompile")
                t_ours = timed(ours, inputs, reps)
                torch._dynamo.reset()
                ind = torch.compile(fn, backend="inductor")
                t_ind = timed(ind, inputs, reps)
                bw = "compute-bound" if kind == "compute" else \
                    f"{min_bytes(fn, inputs) / t_ours / copy_bw:.0%} of copy"
            print(f"| {name} | {str(dtype).replace('torch.', '')} | {t_eager * 1e3:.3f} | {t_ours * 1e3:.3f} | "
                  f"{t_ind * 1e3:.3f} | {t_eager / t_ours:.2f}x | {t_ind / t_ours:.2f}x | {bw} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
