"""The compile pipeline, one pass per line: FX graph -> ATen -> loop IR -> kernels -> callable.

    gm, attrs = lift_attributes(gm)                  aot/: parameters/state become inputs
    aten_gm  = trace_inference(gm, example_inputs)   aot/ + decomp/ (fake tensors only)
    lowered  = GraphLowering(aten_gm).run()          lowering/ -> ir/
    plan     = schedule(lowered)                     scheduler/
    code     = generate(lowered, plan)               codegen/ (C++ or Triton, and the wrapper)
    compiled = load(code)                            runtime/

Every stage's artifact is kept on the CompiledGraph and prints readably.
"""
from __future__ import annotations

import linecache
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from minicompile.aot import lift_attributes, trace_inference
from minicompile.codegen import BACKENDS
from minicompile.codegen.wrapper import WrapperCode
from minicompile.config import config
from minicompile.ir.nodes import ComputedBuffer, InputBuffer, StorageView
from minicompile.lowering import GraphLowering
from minicompile.runtime import cache
from minicompile.scheduler.fusion import Schedule, schedule
from minicompile.report import artifacts
from minicompile.report.highlight import highlight

log = logging.getLogger("minicompile")

# make_fx keeps global tracing state (torch.fx's patcher), so two threads cannot trace at once;
# lowering, code generation and the C++ build after it run concurrently.
_trace_lock = threading.Lock()


@dataclass
class CompiledGraph:
    """A compiled FX graph: call it like the graph; every stage's artifact is kept."""
    aten_graph: torch.fx.GraphModule
    lowering: GraphLowering
    schedule: Schedule
    kernel_source: str
    wrapper_source: str
    backend: str
    run: Callable
    out_spec: Any
    timings: dict = field(default_factory=dict)
    lifted: tuple = ()          # the graph's tensor attributes, passed after the caller's inputs

    def __post_init__(self):
        # Dynamo graphs return a flat tuple: the wrapper's result is already the answer
        flat_tuple = pytree.tree_unflatten([0] * self.out_spec.num_leaves, self.out_spec)
        self._returns_flat_tuple = (type(flat_tuple) is tuple and self.out_spec.num_leaves == len(flat_tuple)
                                    and self.out_spec.num_nodes == len(flat_tuple) + 1)

    def __call__(self, *args):
        flat = self.run(args + self.lifted if self.lifted else args)
        if self._returns_flat_tuple:
            return flat
        return pytree.tree_unflatten(list(flat), self.out_spec)

    @property
    def num_kernels(self) -> int:
        return len(self.schedule.kernels)

    @property
    def externs(self):
        return self.lowering.externs

    def explain(self) -> str:
        lines = [f"{self.num_kernels} kernel(s), {len(self.externs)} extern call(s), backend {self.backend}"]
        lines += [f"  extern {e.node} ({e.op}): {e.reason}" for e in self.externs]
        lines.append(str(self.schedule))
        return "\n".join(lines)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> CompiledGraph:
    timings = {}
    t0 = time.perf_counter()

    def stamp(name):
        nonlocal t0
        now = time.perf_counter()
        timings[name] = now - t0
        t0 = now

    out_spec = _output_spec(gm)
    gm, lifted = lift_attributes(gm)
    with _trace_lock:
        aten_gm = trace_inference(gm, list(example_inputs) + list(lifted))
    stamp("trace")
    backend = BACKENDS[_pick_backend(aten_gm)]
    row_scratch = getattr(backend, "row_scratch", False)
    lowered = GraphLowering(aten_gm, sources=_sources(aten_gm), compute_expensive_once=row_scratch).run()
    stamp("lower")
    plan = schedule(lowered, row_scratch=row_scratch)
    stamp("schedule")
    storage = {b.name: b.mutates for b in lowered.buffers if isinstance(b, ComputedBuffer) and b.mutates}
    buffers = {b.name: b for b in lowered.buffers}
    buffers.update({b.name: b for b in lowered.inputs})
    buffers.update({b.name: b for b in lowered.constant_buffers})
    kernels = backend.generate(plan, buffers, storage, lowered.sources)
    wrapper = WrapperCode(lowered, plan, storage, kernels.kernel_args, backend.pass_pointers)
    wrapper_source = wrapper.generate()
    stamp("codegen")
    lib = backend.load(kernels)
    stamp("build")
    run = _load_wrapper(wrapper_source, lib, wrapper.externs, lowered.constants)
    stamp("load")
    compiled = CompiledGraph(aten_gm, lowered, plan, kernels.source, wrapper_source, backend.name, run,
                             out_spec, timings, lifted)
    _debug_dump(compiled, gm)
    return compiled


def _pick_backend(gm: torch.fx.GraphModule) -> str:
    """CUDA tensors -> Triton; CPU tensors -> C++ (or Triton when config.cpu_backend says so)."""
    devices = {v.device.type for n in gm.graph.nodes for v in pytree.tree_leaves(n.meta.get("val"))
               if isinstance(v, torch.Tensor)}
    if "cuda" in devices or config.cpu_backend == "triton":
        if "triton" not in BACKENDS:
            raise NotImplementedError("this graph needs the Triton code generator, which is not available")
        return "triton"
    return "cpp"


def _sources(gm) -> dict:
    """FX node name -> "file.py:LINE: code", the user's source line it came from (when recorded)."""
    out = {}
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if trace:
            out[node.name] = _last_frame(trace)
    return out


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _last_frame(trace: str) -> str:
    # A traceback frame is 'File "f.py", line N, in fn' + the code line, and since Python
    # 3.11 often a '^^^^' marker line, which says nothing to a reader of kernel headers.
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip() and set(ln.strip()) - set("^~ ")]
    for k in range(len(lines) - 1, -1, -1):
        m = _FRAME.search(lines[k])
        if m:
            code = lines[k + 1] if k + 1 < len(lines) else ""
            return f"{os.path.basename(m['file'])}:{m['line']}: {code}".rstrip(": ")
    return lines[-1] if lines else ""


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
        print(artifacts.banner(f"[minicompile] {stage.title}"))
        print(highlight(stage.render(gm, compiled), language), end="")
