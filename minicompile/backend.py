"""The entry point TorchDynamo calls: ``torch.compile(model, backend="minicompile")``.

Registered through the ``torch_dynamo_backends`` entry point in pyproject.toml, so the name
works after ``pip install`` without importing minicompile. ``torch.compile(mode=...,
options={...})`` reaches us as keyword arguments: they set knobs for this graph
(config.graph_knobs; docs/modes.md): CUDA graphs, max-autotune, or any knob by name.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils import _pytree as pytree

from minicompile.aot.fake import dynamo_fakes
from minicompile.aot.global_state import kept_global_state
from minicompile.aot.joint import TrainingUnsupported, trace_joint
from minicompile.aot.partition import partition
from minicompile.aot.runtime import TrainingGraph
from minicompile.config import CALL_TIME_KNOBS, config, graph_knobs, patch
from minicompile.cpu import CPU
from minicompile.cpu.timing import measured_first
from minicompile.ir.expr import NotSymbolic
from minicompile.pipeline import CompiledGraph, compile_aten, compile_graph
from minicompile.report import artifacts
from minicompile.report.highlight import highlight
from minicompile.runtime import CompilerNotFound, autotune, cache
from minicompile.runtime.cpp_build import start_precompiled_prelude
from minicompile.runtime.cudagraphs import CUDAGraphRunner

log = logging.getLogger("minicompile")

# max-autotune on CPU: the variants of a graph that are built and timed, as knob changes
# relative to the graph's own knobs. Each changes the generated C++: which loops run on
# OpenMP threads, and whether a value read by several consumers is recomputed in each
# (fused) or computed once into a buffer.
CPU_VARIANTS = {
    "defaults": lambda c: {},
    "threads for smaller loops": lambda c: {"parallel_threshold": max(1, c.parallel_threshold // 8)},
    "one thread": lambda c: {"parallel_threshold": 1 << 62},
    "shared values in buffers": lambda c: {"realize_reads_threshold": 1},
}

_logged_once: set = set()


def needs_autograd(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def has_symbolic_shapes(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Dynamo marked some size dynamic: the graph must serve more than one shape."""
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt):
            return True
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False


def has_data_dependent_sizes(gm: torch.fx.GraphModule) -> bool:
    """A value of the graph has a size or number only the run knows (Dynamo's u0: nonzero, .item())."""
    values = pytree.tree_leaves([n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes])
    return any(free_unbacked_symbols(v) for v in values if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat,
                                                                             torch.SymBool)))


def compile_symbolic(gm: torch.fx.GraphModule, example_inputs, knobs: dict):
    """One build for every size: the graph is traced with Dynamo's symbolic fake inputs, and
    sizes stay symbols through the loop IR, the kernels (size arguments) and the wrapper
    (docs/dynamic.md). What the symbolic path cannot compile yet (NotSymbolic, or any error it
    meets) is compiled per shape instead: slower to warm up, never wrong."""
    reason = _not_symbolic_reason(gm, example_inputs, knobs)
    if reason is None:
        try:
            with patch(**knobs):
                return compile_graph(gm, _symbolic_inputs(gm))
        except CompilerNotFound:
            raise
        except NotSymbolic as e:
            reason = str(e)
        except Exception as e:  # a gap of the symbolic path, not of the graph: say so loudly
            if not config.fallback_on_error:
                raise
            log.warning("minicompile: compiling with symbolic sizes failed (%s: %s); compiling per shape",
                        type(e).__name__, e)
            return PerShapeGraph(gm, knobs)
    log.info("minicompile: this graph is compiled per shape (not supported symbolically: %s)", reason)
    return PerShapeGraph(gm, knobs)


def _symbolic_inputs(gm) -> list:
    return [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]


def _not_symbolic_reason(gm, example_inputs, knobs: dict) -> str | None:
    fakes = _symbolic_inputs(gm)
    if len(fakes) != len(example_inputs) or any(f is None for f in fakes):
        return "the graph's placeholders carry no example values"
    with patch(**knobs):
        if config.max_autotune or config.cudagraphs:
            return "max-autotune and CUDA graphs time or record one concrete shape"
    return None


class PerShapeGraph:
    """Compiles a dynamic-shape graph once per concrete input signature (shapes are static inside):
    inference's graphs the symbolic path cannot compile, and (``build``: compile_training) training
    graphs our own front end captured with sizes that changed (its capture hands real tensors, and
    the joint trace takes Dynamo's symbolic fakes)."""

    def __init__(self, gm: torch.fx.GraphModule, knobs: dict | None = None, build=None):
        self.gm = gm
        self.knobs = knobs or {}
        self.build = build or compile_or_fallback
        self.compiled = {}

    def __call__(self, *args):
        key = signature(args)
        fn = self.compiled.get(key)
        if fn is None:
            with patch(**self.knobs), kept_global_state():
                fn = self.compiled[key] = self.build(self.gm, list(args))
        return fn(*args)


def signature(args) -> tuple:
    """What a per-shape build is keyed on: each tensor's sizes, strides, dtype, device (and whether it
    requires grad), each other argument as it is."""
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor)
                 else a for a in args)


def minicompile_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    """Compile a captured FX graph; returns a callable taking the graph's inputs.

    ``mode`` and ``options`` are torch.compile's: a mode is a set of knobs (config.MODES), options
    name knobs; both apply to this graph only. Unknown ones raise, listing the valid ones."""
    start_precompiled_prelude()   # in the background, while this graph is traced
    with kept_global_state():
        return _compile_for_dynamo(gm, example_inputs, graph_knobs(mode, options))


def _compile_for_dynamo(gm: torch.fx.GraphModule, example_inputs, knobs: dict):
    if needs_autograd(example_inputs):
        return with_call_time_knobs(compile_training(gm, example_inputs, knobs), knobs)
    if has_symbolic_shapes(gm, example_inputs):
        return with_call_time_knobs(compile_symbolic(gm, example_inputs, knobs), knobs)
    with patch(**knobs):
        compiled = compile_or_fallback(gm, list(example_inputs))
    return with_call_time_knobs(compiled, knobs)


def compile_training(gm: torch.fx.GraphModule, example_inputs, knobs: dict, per_shape: bool = False):
    """A graph whose inputs require grad: joint trace, partition, compiled forward and backward
    (aot/); a graph the training runtime cannot reproduce exactly runs eagerly, and the log says why."""
    with patch(**knobs):
        if config.cudagraphs:
            log_once("minicompile: CUDA graphs (mode='reduce-overhead'/'max-autotune', option 'cudagraphs') are "
                     "not applied to training graphs (inputs that require grad); they run without them.")
    if not per_shape and has_symbolic_shapes(gm, example_inputs):
        fakes = dynamo_fakes(list(example_inputs))
        if fakes is None:   # our own front end: real tensors only
            log.info("minicompile: this training graph is compiled per shape (captured outside Dynamo, "
                     "no symbolic inputs to trace with)")
            return PerShapeGraph(gm, knobs, lambda gm, args: compile_training(gm, args, knobs, per_shape=True))
        example_inputs = fakes
    if has_data_dependent_sizes(gm):
        return _eager_training(gm, "data-dependent sizes (nonzero, .item()) are not compiled for training yet")
    try:
        with patch(**knobs):
            joint = measured_first(lambda: trace_joint(gm, list(example_inputs), CPU),   # no stopwatch in make_fx
                                   keep=lambda joint, fix: replace(joint, choices=tuple(map(fix, joint.choices))))
            part = partition(joint, config.partitioner, config.checkpoint)
            if config.debug >= 2:
                print(highlight(artifacts.training_text(joint, part, config.debug), "python"), end="")
            graph = TrainingGraph(part, joint, _training_compiler(knobs), list(example_inputs))
    except TrainingUnsupported as e:
        return _eager_training(gm, str(e))
    except NotSymbolic as e:   # a limit of the symbolic path, not a compiler bug: eager, never per shape
        return _eager_training(gm, f"not compiled with symbolic sizes: {e}")
    except CompilerNotFound:
        raise
    except Exception as e:
        if not config.fallback_on_error:
            raise
        return _eager_training(gm, f"compiling it failed ({type(e).__name__}: {e})")
    return graph


def _training_compiler(knobs: dict):
    """Compiles the forward now and the backward on the first backward, under this graph's knobs:
    each half is ATen already, so it enters the pipeline after the trace (pipeline.compile_aten).
    Not with the inference channels-last pass (cpu/conv_layout.py): in a forward half it converts
    every call and leaves the backward's convolutions on mixed layouts. The joint trace chose the
    training layout already (aot/conv_layout_train.py), for both halves at once. Nor with prepared
    weights (cpu/prepare.py): the parameters change every step. Nor with oneDNN's fused epilogues
    (cpu/epilogues.py): inference only."""
    def compile_part(part_gm, example_inputs, **about):   # about: the half's title and stamps (Partition.about)
        with patch(**{**knobs, "conv_channels_last": False, "prepare_weights": False, "cpu_epilogue": "separate"}):
            return compile_aten(part_gm, example_inputs, **about)
    return compile_part


def _eager_training(gm: torch.fx.GraphModule, reason: str):
    log.warning("minicompile: training graph runs eagerly: %s", reason)
    return gm.forward


def with_call_time_knobs(fn, knobs: dict):
    """Knobs the compiled code reads while it runs (config.CALL_TIME_KNOBS) are set around each call."""
    at_call = {k: v for k, v in knobs.items() if k in CALL_TIME_KNOBS}
    if not at_call:
        return fn

    def run_with_knobs(*args):
        with patch(**at_call):
            return fn(*args)
    return run_with_knobs


def compile_with_knobs(gm, example_inputs) -> CompiledGraph:
    """compile_graph, plus what config.max_autotune and config.cudagraphs ask for."""
    compiled = autotuned_on_cpu(gm, example_inputs) if config.max_autotune else compile_graph(gm, example_inputs)
    if config.cudagraphs:
        use_cudagraphs(compiled, example_inputs)
    return compiled


def autotuned_on_cpu(gm, example_inputs) -> CompiledGraph:
    """Build the graph under each of CPU_VARIANTS, time them on copies of the example inputs, keep the
    fastest; the choice is cached on disk by the graph's generated source. On a GPU, Triton's
    autotuner does the widened search per kernel instead (runtime/triton_launch.py)."""
    first = compile_graph(gm, example_inputs)
    if first.backend != "cpp":
        return first
    variants = {name: make(config) for name, make in CPU_VARIANTS.items()}
    key = cache.digest(first.kernel_source, first.wrapper_source, repr(variants))
    choice = autotune.load_choice(key)
    if choice in variants:
        return first if not variants[choice] else _compile_variant(gm, example_inputs, variants[choice])
    built, seen = {}, {}
    for name, changes in variants.items():
        c = _compile_variant(gm, example_inputs, changes) if changes else first
        source = (c.kernel_source, c.wrapper_source)
        if source not in seen:  # a knob this graph does not feel builds the same code: time it once
            seen[source] = name
            built[name] = c
    if len(built) == 1:
        choice, timings = next(iter(built)), {}
    else:
        choice, timings = autotune.fastest({n: c.run for n, c in built.items()},
                                           list(example_inputs) + list(first.aten.lifted))
    autotune.save_choice(key, choice, timings)
    log.info("minicompile: max-autotune picked %r for this graph (median seconds per call: %s)", choice, timings)
    return built[choice]


def _compile_variant(gm, example_inputs, changes: dict) -> CompiledGraph:
    with patch(**changes):
        return compile_graph(gm, example_inputs)


def use_cudagraphs(compiled: CompiledGraph, example_inputs) -> None:
    """Replay ``compiled``'s kernels from CUDA graphs when every tensor it takes is on a CUDA device."""
    args = list(example_inputs) + list(compiled.aten.lifted)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or not all(t.is_cuda for t in tensors):
        log_once("minicompile: CUDA graphs (mode='reduce-overhead'/'max-autotune', option 'cudagraphs') apply "
                 "only to graphs whose tensors are all on a CUDA device; they have no effect on CPU tensors.")
        return
    n = len(example_inputs)
    static = {i for i, a in enumerate(example_inputs) if isinstance(a, torch.nn.Parameter)}
    static |= set(range(n, len(args)))  # the graph's own attributes: the same tensors every call
    compiled.run = CUDAGraphRunner(compiled.run, static, set(compiled.mutated_inputs))


def log_once(message: str) -> None:
    if message not in _logged_once:
        _logged_once.add(message)
        log.warning(message)


def compile_or_fallback(gm, example_inputs):
    """A missing compiler is the user's to fix (the error says how); a compiler bug must not cost the
    user their program: the graph runs eagerly and the warning says why."""
    try:
        return compile_with_knobs(gm, example_inputs)
    except CompilerNotFound:
        raise
    except Exception as e:
        if not config.fallback_on_error:
            raise
        log.warning("minicompile: compiling this graph failed (%s: %s); running it eagerly. "
                    "Set MINICOMPILE_FALLBACK=0 to raise instead.", type(e).__name__, e)
        return gm.forward
