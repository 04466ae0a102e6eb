"""Capture time of HF GPT-2 (small config, random init, eval, no_grad): minicompile's front end
vs TorchDynamo, side by side in one process, taking turns (tools/bench.time_interleaved).

Each step builds a fresh model and times the first call of ``minicompile.compile(model)`` or
``torch.compile(model, backend=<returns gm.forward>)``: tracing, guards and the graph run
eagerly, no code generation on either side. Prints the median seconds and the graph count.

``--table`` instead runs the sixteen architectures of ``hf_models.py`` (tiny configs, random
init, eval, no_grad, default ``use_cache``) once each through ``minicompile.compile`` (the whole
pipeline; ``--capture-only``: graphs run as captured) and through ``torch.compile`` with a
counting backend, and prints a markdown table: graphs, breaks and fallbacks of ours, Dynamo's
graph count, and whether both outputs (every tensor, caches included) match eager.

    python benchmarks/bench_capture_hf.py [--reps 5] [--model gpt2|bert|llama]
    python benchmarks/bench_capture_hf.py --table [--capture-only] [--models t5,bart]
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import minicompile  # noqa: E402
from minicompile.capture import compile as capture_compile  # noqa: E402
from minicompile.tools.bench import time_interleaved  # noqa: E402

import hf_models  # noqa: E402  (benchmarks/ is the script's directory)

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


def _matches(expected, got) -> bool:
    a, b = hf_models.tensors(expected), hf_models.tensors(got)
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-4, atol=1e-5)
                                    for x, y in zip(a, b))


def table_row(name: str, capture_only: bool) -> str:
    model, kwargs = hf_models.make(name)
    with torch.no_grad():
        expected = model(**kwargs)
        ours = (capture_compile if capture_only else minicompile.compile)(model)
        ours_ok = _matches(expected, ours(**kwargs)) and _matches(expected, ours(**kwargs))   # trace, then a hit
        report = ours.capture_report
        count = [0]

        def counting(gm, example_inputs):
            count[0] += 1
            return gm.forward

        torch._dynamo.reset()
        dynamo_ok = _matches(expected, torch.compile(model, backend=counting)(**kwargs))
    return (f"| {name} | {len(report.graphs)} | {report.break_count} | {len(report.fallbacks)} | "
            f"{len(report.recompiles)} | {count[0]} | {'yes' if ours_ok else 'NO'} | {'yes' if dynamo_ok else 'NO'} |")


def table(names: list, capture_only: bool) -> None:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{'capture only' if capture_only else 'minicompile.compile (whole pipeline)'}")
    print("| model | graphs | breaks | fallbacks | recompiles | Dynamo graphs | ours = eager | Dynamo = eager |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        print(table_row(name, capture_only), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--table", action="store_true", help="the 16-architecture table (hf_models.py)")
    ap.add_argument("--capture-only", action="store_true", help="with --table: graphs run as captured")
    ap.add_argument("--models", default=",".join(hf_models.NAMES), help="with --table: which ones")
    opts = ap.parse_args()
    if opts.table:
        return table(opts.models.split(","), opts.capture_only)
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
