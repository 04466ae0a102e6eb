"""Training step benchmark: eager, minicompile and Inductor, side by side in one process.

    python benchmarks/bench_train.py [--reps N] [--models mlp,gpt2_block,layernorm_softmax,cnn] [--quick]

The same as ``minicompile bench --train``; the models and what is measured are described in
minicompile/tools/bench_train.py and docs/training.md.
"""
import sys

from minicompile.tools.bench_train import main

if __name__ == "__main__":
    sys.exit(main())
