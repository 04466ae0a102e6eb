"""Capture time of HF GPT-2 (small config, random init, eval, no_grad): minicompile's front end
vs TorchDynamo, side by side in one process, taking turns (tools/bench.time_interleaved).

Each step builds a fresh model and times the first call of ``minicompile.compile(model)`` or
``torch.compile(model, backend=<returns gm.forward>)``: tracing, guards and the graph run
eagerly, no code generation on either side. Prints the median seconds and the graph count.

    python benchmarks/bench_capture_hf.py [--reps 5] [--model gpt2|bert|llama]
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from minicompile.capture import compile as capture_compile  # noqa: E402
from minicompile.tools.bench import time_interleaved  # noqa: E402

transformers.logging.set_verbosity_error()


def make(name: str):
    torch.manual_seed(0)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)).eval()
    if name == "bert":
        return transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
            vocab_size=100, max_position_embeddings=64)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
        intermediate_size=64, vocab_size=100, max_position_embeddings=64)).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="gpt2")
    opts = ap.parse_args()
    ids = torch.randint(0, 100, (2, 8))
    graphs = {"minicompile": 0, "dynamo": 0}

    def ours():
        compiled = capture_compile(make(opts.model))
        compiled(ids)
        graphs["minicompile"] = len(compiled.capture_report.graphs)

    def dynamo():
        count = [0]

        def backend(gm, example_inputs):
            count[0] += 1
            return gm.forward

        torch._dynamo.reset()
        torch.compile(make(opts.model), backend=backend)(ids)
        graphs["dynamo"] = count[0]

    with torch.no_grad():
        ours(), dynamo()   # imports and first-use costs of both, outside the timing
        times = time_interleaved([ours, dynamo], opts.reps)
    print(f"{opts.model}: capture seconds (median of {opts.reps}, interleaved)")
    for (name, t) in zip(("minicompile", "dynamo"), times):
        print(f"  {name:12s} {statistics.median(t):7.3f} s  (min {min(t):.3f}, max {max(t):.3f})  "
              f"graphs {graphs[name]}")


if __name__ == "__main__":
    main()
