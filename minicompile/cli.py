"""The ``minicompile`` command: a thin dispatcher; the work lives in minicompile/tools/.

    minicompile inspect TARGET [--stages ...] [--out DIR] [--frontend dynamo|minicompile]
    minicompile report TARGET [--train] [--profile] [--out FILE.html]
    minicompile bench [--quick] [--device cpu|cuda] [--json FILE] [--plot FILE.png]
    minicompile bench --train [--quick] [--workloads mlp,cnn,...] [--json FILE]
    minicompile bench --train --models [--quick] [--workloads gpt2,resnet18,...] [--autocast bf16] [--json FILE]
    minicompile bench --models [--quick] [--batch N] [--dtype bf16] [--autocast bf16] [--mode max-autotune] [--workloads resnet18,vit,...] [--json FILE]
    minicompile bench --dynamic [--quick] [--workloads pointwise,block,...] [--no-inductor]
    minicompile cache info | clear
    minicompile config

Exit status: 0 success, 1 the command ran and failed (e.g. a mismatch), 2 bad usage or a
TARGET that cannot be loaded.
"""
from __future__ import annotations

import argparse
import os
import sys

from minicompile.config import MODES, config, knobs, unknown_variables

from minicompile.tools.target import CONVENTION, TargetError

DEBUG_HELP = "MINICOMPILE_DEBUG=1..5 prints the same stages while any program compiles (see docs/cli.md)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minicompile", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Inspect what minicompile does to a model, benchmark it against eager and Inductor, "
                    "manage the kernel cache.",
        epilog=f"{CONVENTION}\n\n{DEBUG_HELP}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ins = sub.add_parser("inspect", help="show graphs, breaks, guards, fusion groups, kernels and wrapper",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=CONVENTION)
    ins.add_argument("target", metavar="TARGET", help="script.py or module:callable (see below)")
    ins.add_argument("--stages", default="all",
                     help="comma-separated stages to print: breaks, guards, graph, aten, ir, fusion, kernels, "
                          "wrapper (default: all)")
    ins.add_argument("--out", metavar="DIR", help="also write every artifact, and a reproducer per graph, to DIR")
    ins.add_argument("--frontend", default="dynamo", metavar="NAME",
                     help="who captures the graphs: dynamo (torch.compile, the default) or minicompile "
                          "(minicompile.compile, minicompile's own bytecode tracer)")
    ins.add_argument("--train", action="store_true",
                     help="capture for training (inputs require grad, one backward through torch.compile) and "
                          "show each graph's partition report, then its forward and backward stages")

    rep = sub.add_parser("report", help="one self-contained HTML page: every stage, compile times, kernel roofline",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=CONVENTION)
    rep.add_argument("target", metavar="TARGET", help="script.py or module:callable (see below)")
    rep.add_argument("--train", action="store_true", help="capture for training (as inspect --train)")
    rep.add_argument("--profile", action="store_true",
                     help="also time each kernel and chart its bytes moved against the copy bandwidth")
    rep.add_argument("--out", metavar="FILE.html", default="minicompile-report.html",
                     help="where to write the page (default: minicompile-report.html)")

    bench = sub.add_parser("bench", help="time eager vs minicompile vs Inductor on standard workloads")
    bench.add_argument("--quick", action="store_true", help="smaller shapes and fewer repetitions (< 3 min on 2 cores)")
    bench.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    bench.add_argument("--plot", metavar="FILE.png", help="write a bar chart of speedups (needs matplotlib)")
    bench.add_argument("--workloads", help="comma-separated subset of workloads (default: all)")
    # Test-only sizes: "tiny" runs in seconds; not advertised.
    bench.add_argument("--size", choices=["full", "quick", "tiny"], help=argparse.SUPPRESS)
    bench.add_argument("--no-inductor", action="store_true", help="skip the Inductor column")
    bench.add_argument("--train", action="store_true",
                       help="time training steps (forward + backward) of the training workloads instead, with "
                            "cold compile times and bytes saved for backward (docs/training.md)")
    bench.add_argument("--models", action="store_true",
                       help="the real-model suite instead (docs/models.md; --workloads picks: ResNet/ResNeXt/DenseNet, "
                            "ViT/DeiT/Mixer, ConvNeXt, Swin, EfficientNet, HF GPT-2/BERT/Llama/T5); with --train: HF "
                            "GPT-2/Llama/BERT, ResNet, ViT, ConvNeXt")
    bench.add_argument("--no-cold-compile", action="store_true", help="with --train/--models: no cold-compile processes")
    bench.add_argument("--batch", type=int, help="with --models: the inputs' batch size (default: each model's own)")
    bench.add_argument("--autocast", choices=["bf16", "fp16"], help="with --models (and --train): forwards under CPU autocast")
    bench.add_argument("--dtype", choices=["bf16", "fp16"], help="with --models: the models and their inputs in this dtype")
    bench.add_argument("--mode", choices=[m for m in MODES if m], help="with --models: torch.compile's mode, both compilers")
    bench.add_argument("--dynamic", action="store_true",
                       help="static vs dynamic-shape builds of minicompile and Inductor, one thread, CPU time "
                            "(docs/dynamic.md)")
    bench.add_argument("--profile", action="store_true", help="with --models: where minicompile's time goes")
    bench.add_argument("--threads", type=int, help="with --models: OMP_NUM_THREADS for the timed processes")

    cache = sub.add_parser("cache", help="show or clear the compiled-kernel cache")
    cache.add_argument("action", choices=["info", "clear"])
    sub.add_parser("config", help="every MINICOMPILE_* knob: its value now, and whether the environment set it")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TargetError as e:
        print(f"minicompile: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `minicompile inspect x | head`
        return 0


def _inspect(args) -> int:
    from minicompile.tools import inspect
    try:
        stages = inspect.parse_stages(args.stages)
    except ValueError as e:
        print(f"minicompile inspect: {e}", file=sys.stderr)
        return 2
    if args.frontend not in inspect.FRONTENDS:
        print(f"minicompile inspect: unknown front end {args.frontend!r}; "
              f"available: {', '.join(inspect.FRONTENDS)}", file=sys.stderr)
        return 2
    if args.train and args.frontend != "dynamo":
        print("minicompile inspect: --train captures with torch.compile (--frontend dynamo); "
              "minicompile's own front end has no training path yet", file=sys.stderr)
        return 2
    return inspect.run_inspect(args.target, stages, args.out, args.frontend, train=args.train)


def _report(args) -> int:
    from minicompile.tools import report_html
    return report_html.run_report(args.target, args.out, train=args.train, profile_kernels=args.profile)


def _bench(args) -> int:
    wrong = ("--autocast is for --models" if args.autocast and not args.models else
             "--mode is for --models (inference)" if args.mode and (args.train or not args.models) else
             "--dtype is for --models (inference)" if args.dtype and (args.train or not args.models) else
             "--batch N (N >= 1) is for --models (inference)" if args.batch is not None and
             (args.train or not args.models or args.batch < 1) else None)
    if wrong:
        print(f"minicompile bench: {wrong}", file=sys.stderr)
        return 2
    size = args.size or ("quick" if args.quick else "full")
    if args.train:
        if args.device != "cpu" or args.plot:
            print("minicompile bench --train: CPU only, no --plot", file=sys.stderr)
            return 2
        from minicompile.tools import bench_train, bench_train_models
        names = [w.strip() for w in args.workloads.split(",")] if args.workloads else None
        if args.models:
            return bench_train_models.run_train_models_bench(names, size, bench_train.REPS[size], not args.no_inductor,
                                                             args.json, args.autocast, not args.no_cold_compile)
        return bench_train.run_train_bench(names or list(bench_train.TRAIN_WORKLOADS), size, bench_train.REPS[size],
                                           not args.no_inductor, args.json, not args.no_cold_compile)
    if args.dynamic:
        from minicompile.tools import bench_dynamic
        names = [w.strip() for w in args.workloads.split(",")] if args.workloads else list(bench_dynamic.WORKLOADS)
        return bench_dynamic.run_dynamic_bench(names, size, bench_dynamic.REPS[size], not args.no_inductor)
    if args.models:
        from minicompile.tools import bench_models
        names = [n.strip() for n in args.workloads.split(",")] if args.workloads else None
        return bench_models.run_models(names, size, not args.no_inductor, args.profile, args.json, threads=args.threads,
                                       batch=args.batch, cold=not args.no_cold_compile, dtype=args.dtype,
                                       autocast=args.autocast, mode=args.mode)
    from minicompile.tools import bench
    return bench.run_bench(args)


def _cache(args) -> int:
    from minicompile.runtime import cache
    if args.action == "info":
        info = cache.info()
        print(f"cache directory: {info['path']}\nfiles: {info['files']}\nsize: {_size(info['bytes'])}")
    else:
        removed = cache.clear()
        print(f"removed {removed} file(s) from {cache.cache_root()}")
    return 0


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if n < 1000 or unit == "MB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _config(args) -> int:
    for name, spec in knobs().items():
        where = "environment" if os.environ.get(spec.env) else "default"
        print(f"{spec.env:38} {getattr(config, name)!r:24} ({where}; accepted: {spec.accepted()})")
    for name in unknown_variables():
        print(f"unknown: {name}")
    return 0


# Imports of the heavy tools (torch, Dynamo) are deferred so `minicompile --help` and
# `minicompile cache info` answer instantly.
COMMANDS = {"inspect": _inspect, "report": _report, "bench": _bench, "cache": _cache, "config": _config}


if __name__ == "__main__":
    sys.exit(main())
