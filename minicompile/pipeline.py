"""The compile pipeline, one pass per line: FX graph -> ATen -> loop IR -> kernels -> callable.

    aten  = trace(gm, example_inputs, CPU)   aot/ + decomp/ + the CPU's policy (cpu/), fake tensors only:
                                             an AtenProgram (the graph, lifted attributes, stamps, ...)
                                             (compile_aten: a graph that is ATen already, e.g. a half of
                                             the joint graph, starts after the trace: after_trace_passes)
    be    = pick_backend(aten)               codegen/: C++ on CPU, Triton on CUDA
    loops = lower(aten, row_scratch)         lowering/ -> ir.LoopGraph (see lower() for row_scratch)
    plan  = schedule(loops, be.caps)         scheduler/
    code  = generate(be, loops, plan)        codegen/: kernels and the host wrapper
    run   = load(code)                       runtime/

Every stage's artifact is kept on the CompiledGraph and prints readably.
"""
from __future__ import annotations

import linecache
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from minicompile.aot.autocast import autocast_enabled, autocast_off
from minicompile.aot.global_state import kept_global_state
from minicompile.aot.passes import AtenProgram, compile_passes, prepare_aten, trace_inference, traced_as
from minicompile.aot.runtime import InTracedLayouts, in_layouts, traced_inputs
from minicompile.codegen import BACKENDS
from minicompile.codegen.wrapper import WrapperCode
from minicompile.config import config
from minicompile.cpu import CPU
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import StorageView
from minicompile.lowering import lower
from minicompile.runtime import cache
from minicompile.runtime.cpp_build import start_precompiled_prelude
from minicompile.scheduler.fusion import Schedule, schedule
from minicompile.testing.check import DifferentialCheck
from minicompile.report import artifacts
from minicompile.report.highlight import highlight

log = logging.getLogger("minicompile")

# make_fx keeps global tracing state (torch.fx's patcher), so two threads cannot trace at once;
# lowering, code generation and the C++ build after it run concurrently.
_trace_lock = threading.Lock()


@dataclass
class CompiledGraph:
    """A compiled FX graph: call it like the graph; every stage's artifact is kept."""
    aten: AtenProgram           # the ATen graph and what tracing learned (aot/runner.py)
    loop_graph: LoopGraph
    schedule: Schedule
    kernel_source: str
    wrapper_source: str
    backend: str
    run: Callable
    out_spec: Any
    timings: dict = field(default_factory=dict)
    code: Any = None            # the generated Code and the loaded kernels: MINICOMPILE_CHECK reruns
    lib: Any = None             # them step by step (testing/check.py)
    check: Any = None           # MINICOMPILE_CHECK=1: a DifferentialCheck every call goes through
    title: str | None = None    # what the graph is when it was not captured ("forward half of the joint graph")
    building: Any = None        # the kernels' build, running in the background (a future), until ready()
    source_graph: Any = None    # the graph compiled, while the build runs (for MINICOMPILE_CHECK)

    @property
    def kernel_args(self) -> dict:
        """Kernel (or group) name -> its pointer/size argument names (the report counts bytes with it)."""
        return self.code.kernels.kernel_args if self.code is not None else {}

    def __post_init__(self):
        # Kernels write mutated inputs through raw pointers; eager's in-place ops also bump the
        # tensor's version counter, which autograd checks ("modified by an inplace operation").
        self.mutated_inputs = _written_inputs(self.aten.gm)
        # Dynamo graphs return a flat tuple: the wrapper's result is already the answer
        flat_tuple = pytree.tree_unflatten([0] * self.out_spec.num_leaves, self.out_spec)
        self._returns_flat_tuple = (type(flat_tuple) is tuple and self.out_spec.num_leaves == len(flat_tuple)
                                    and self.out_spec.num_nodes == len(flat_tuple) + 1)

    def __call__(self, *args):
        if self.check is not None:
            return self.check(self.run_compiled, args)
        return self.run_compiled(args)

    def ready(self) -> "CompiledGraph":
        """Waits for a build started in the background; its errors raise here."""
        if self.building is not None:
            lib, self.building = self.building.result(), None
            self.finish(lib, self.source_graph)
        return self

    def finish(self, lib, gm: torch.fx.GraphModule) -> None:
        """The built kernels bound into the host wrapper."""
        self.lib, t0 = lib, time.perf_counter()
        self.run = _load_wrapper(self.code.wrapper_source, lib, self.code.wrapper_refs, self.loop_graph.constants)
        self.timings["load"] = time.perf_counter() - t0
        if config.check:
            self.check = DifferentialCheck(gm, self)

    def run_compiled(self, args: tuple):
        if self.building is not None:
            self.ready()
        if self.aten.lifted:
            args = args + self.aten.lifted
        if autocast_enabled():    # the graph holds autocast's casts already (aot/autocast.py)
            with autocast_off():
                flat = self.run(args)
        else:
            flat = self.run(args)
        if self.mutated_inputs:
            torch.autograd.graph.increment_version([args[k] for k in self.mutated_inputs])
        if self._returns_flat_tuple:
            return flat
        return pytree.tree_unflatten(list(flat), self.out_spec)

    def output_layouts(self) -> list | None:
        """Per flat output, what a call returns, known before it runs: a tensor's (size, stride,
        dtype, device), a number as itself; None if one is not known (a symbolic size)."""
        out = []
        for o in self.loop_graph.outputs:
            if isinstance(o, StorageView) and all(isinstance(v, int) for v in (*o.size, *o.stride)):
                out.append((tuple(o.size), tuple(o.stride), o.dtype, o.device))
            elif isinstance(o, (int, float, bool)) or o is None:
                out.append(o)
            else:
                return None
        return out

    @property
    def num_kernels(self) -> int:
        return len(self.schedule.kernels) + len(self.schedule.templates)

    @property
    def externs(self):
        return self.loop_graph.externs

    def explain(self) -> str:
        lines = [f"{self.num_kernels} kernel(s), {len(self.externs)} extern call(s), backend {self.backend}"]
        lines += [f"  extern {e.node} ({e.op}): {e.reason}" for e in self.externs]
        lines.append(str(self.schedule))
        return "\n".join(lines)


class StageTimer:
    """``t(name, fn, *args)`` runs one pass and records its wall time under ``name``."""

    def __init__(self):
        self.timings: dict = {}

    def __call__(self, name: str, fn: Callable, *args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        self.timings[name] = time.perf_counter() - t0
        return result


@dataclass
class Code:
    """What code generation hands the runtime: the kernels' module and the host wrapper."""
    kernels: Any                # the backend's generated-kernels value (source, kernel_args, language)
    wrapper_source: str
    wrapper_refs: list          # ops and odd constants the wrapper refers to as externs[k]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> CompiledGraph:
    with kept_global_state():  # a failed trace leaves no functorch layer or mode behind
        return _compile_graph(gm, example_inputs)


def compile_aten(aten_gm: torch.fx.GraphModule, example_inputs: list, title: str = "ATen graph (compiled by compile_aten)",
                 constructed_by: tuple = (), wait: bool = True) -> CompiledGraph:
    """compile_graph for a graph that is functional ATen already, traced by us with its
    ``meta["val"]`` on every node (a half of the joint graph, aot/partition.py): it starts at the
    passes after the trace (after_trace_passes: lift, restride, the CPU folds, ...), so node names
    and source lines stay as they are. ``title`` says what the graph is, for MINICOMPILE_DEBUG, and
    ``constructed_by`` is its stamps so far (a half's: ``Partition.about``).

    Inputs laid out otherwise than the graph was traced with (in a dimension larger than 1: a
    saved value the compiled forward laid out its own way) are copied into the traced layouts
    at each call: the graph is compiled as traced, never traced again (tracing a half again with
    other layouts gave wrong gradients, convbn fuzzer seed 402075). ``wait=False``: its kernels
    build in the background (``CompiledGraph.ready``)."""
    prepare = lambda gm, inputs: prepare_aten(gm, inputs, CPU, constructed_by)  # noqa: E731
    with kept_global_state():
        if traced_as(aten_gm, example_inputs):
            return _compile_graph(aten_gm, example_inputs, prepare, "aten passes", title, wait)
        as_traced = in_layouts(example_inputs, traced_inputs(aten_gm))
        return InTracedLayouts(aten_gm, _compile_graph(aten_gm, as_traced, prepare, "aten passes", title, wait))


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: list, to_aten=None, stage: str = "trace",
                   title: str | None = None, wait: bool = True) -> CompiledGraph:
    """``wait=False``: the kernels are built in the background; the first call (or ``ready()``) waits."""
    t = StageTimer()
    start_precompiled_prelude()   # in the background, while the graph is traced
    out_spec = _output_spec(gm)
    aten = t(stage, to_aten or _trace, gm, list(example_inputs))   # aot/ + decomp/, with the CPU's policy
    be = BACKENDS[_pick_backend(aten.gm)]
    loops = t("lower", lower, aten.gm, compute_expensive_once=be.caps.row_scratch,   # lowering/ -> ir/
              templates=be.caps.templates)
    plan = t("schedule", schedule, loops, be.caps)                  # scheduler/
    code = t("codegen", _generate, be, loops, plan, aten.prepared)  # codegen/
    compiled = CompiledGraph(aten, loops, plan, code.kernels.source, code.wrapper_source, be.name, None,
                             out_spec, t.timings, code, title=title)
    building = be.start_load(code.kernels) if not wait and hasattr(be, "start_load") else None
    if building is None:
        compiled.finish(t("build", be.load, code.kernels), gm)   # runtime/
    else:                                                         # runtime/, in the background
        compiled.building, compiled.source_graph = building, gm
    _debug_dump(compiled, gm)
    return compiled


def _trace(gm: torch.fx.GraphModule, example_inputs: list) -> AtenProgram:
    with _trace_lock:
        return trace_inference(gm, example_inputs, compile_passes(CPU), CPU)


def _generate(backend, loops: LoopGraph, plan: Schedule, prepared=None) -> Code:
    kernels = backend.generate(loops, plan)
    wrapper = WrapperCode(loops, plan, kernels.kernel_args, prepared)
    return Code(kernels, wrapper.generate(), wrapper.externs)


def _written_inputs(aten: torch.fx.GraphModule) -> tuple:
    """Positions of the inputs the graph writes: functionalization leaves one ``copy_`` into each
    (aot/trace.py), whether it lowers to a kernel or runs as an extern."""
    position = {n: k for k, n in enumerate(n for n in aten.graph.nodes if n.op == "placeholder")}
    return tuple(sorted({position[n.args[0]] for n in aten.graph.nodes if n.op == "call_function"
                         and n.target is torch.ops.aten.copy_.default and n.args[0] in position}))


def _pick_backend(gm: torch.fx.GraphModule) -> str:
    """CUDA tensors -> Triton; CPU tensors -> C++ (or Triton when config.cpu_backend says so)."""
    devices = {v.device.type for n in gm.graph.nodes for v in pytree.tree_leaves(n.meta.get("val"))
               if isinstance(v, torch.Tensor)}
    if "cuda" in devices or config.cpu_backend == "triton":
        if "triton" not in BACKENDS:
            raise NotImplementedError("this graph needs the Triton code generator, which is not available")
        return "triton"
    return "cpp"


def _output_spec(gm):
    for node in gm.graph.nodes:
        if node.op == "output":
            _, spec = pytree.tree_flatten(node.args[0])
            return spec
    raise ValueError("graph has no output node")


def _load_wrapper(source: str, lib, externs, constants) -> Callable:
    key = cache.digest(source)
    filename = f"<minicompile-wrapper-{key}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["make"](lib, externs, constants)


def _debug_dump(compiled: CompiledGraph, gm: torch.fx.GraphModule) -> None:
    """MINICOMPILE_DEBUG=1..5: the same printers as ``minicompile inspect`` (docs/cli.md has the table)."""
    level = config.debug
    if level <= 0:
        return
    print(f"[minicompile] graph: {artifacts.summary(compiled)}")
    for name in artifacts.debug_stages(level):
        stage = artifacts.STAGES[name]
        _, language = artifacts.stage_file(stage, compiled)
        print(artifacts.banner(f"[minicompile] {artifacts.stage_title(stage, compiled)}"))
        print(highlight(stage.render(gm, compiled), language), end="")
