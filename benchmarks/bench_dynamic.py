"""Dynamic-shape benchmark: our static build, our symbolic build and Inductor's, side by side.

    python benchmarks/bench_dynamic.py [--size quick|full|tiny] [--reps N] [--workloads a,b] [--no-inductor]

The same as ``minicompile bench --dynamic``; what is measured, and how, is described in
minicompile/tools/bench_dynamic.py. Measured numbers are in docs/dynamic.md.
"""
import sys

from minicompile.tools.bench_dynamic import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
