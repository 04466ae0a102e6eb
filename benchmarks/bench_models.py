"""The real-model benchmark of issue 15: eager vs minicompile vs Inductor on small CNNs and transformers.

    python benchmarks/bench_models.py [--models resnet18,vit] [--profile] [--json FILE]

ResNet-18, ViT-Tiny, ConvNeXt-Atto, Swin, EfficientNet-B0 (minicompile/tools/models.py) and HF
GPT-2 / BERT from small configs; inference (eval, no_grad); one process per model with fresh
compile caches, the three callables timed in turns. The same as ``minicompile bench --models``.
Measured results are in docs/models.md.
"""
import sys

from minicompile.tools.bench_models import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
