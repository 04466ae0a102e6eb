"""The CPU benchmark of issue 2: eager vs minicompile vs Inductor on the standard workloads.

    python benchmarks/bench_cpu.py [--json FILE] [--plot FILE.png]

Runs exactly what ``minicompile bench`` (full sizes) runs: pointwise chain with sin (4M
floats), softmax 4096x1024, layer_norm 8192x1024, a GELU MLP 256x1024->4096->1024 and a
GPT-2 block (B4 T256 C256), each in its own process with fresh caches. Measured results
are in docs/benchmarks.md.
"""
import sys

from minicompile.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--device", "cpu", *sys.argv[1:]]))
