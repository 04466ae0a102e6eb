"""Code generators: each renders a Schedule's kernels for one kind of device.

A backend is an object with
    name: str
    caps: BackendCaps        what it can do (scheduler/caps.py); the pipeline hands it to schedule()
    generate(graph, plan) -> GeneratedKernels     (ir.LoopGraph, scheduler.Schedule)
    load(generated) -> object with one callable attribute per kernel name
registered in BACKENDS under its name. The pipeline picks one by device and config.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from minicompile.codegen.cpp import CppKernel, generate_cpp
from minicompile.codegen.triton import TritonBackend
from minicompile.ir.graph import LoopGraph
from minicompile.runtime.cpp_build import load as load_cpp
from minicompile.scheduler.caps import BackendCaps
from minicompile.scheduler.fusion import Schedule


@dataclass
class GeneratedKernels:
    source: str
    kernel_args: dict   # kernel name -> [buffer/pointer names, in call order]
    language: str       # "cpp" | "python" (for syntax highlighting and file suffixes)


class CppBackend:
    name = "cpp"
    caps = BackendCaps(row_scratch=True, pass_pointers=True)

    def generate(self, graph: LoopGraph, plan: Schedule) -> GeneratedKernels:
        buffers, storage = graph.by_name, graph.mutations
        kernels = {k.name: CppKernel(k, buffers, storage, graph.sources) for k in plan.kernels}
        args = {name: [p for p, _, _ in ck.args()] for name, ck in kernels.items()}
        return GeneratedKernels(generate_cpp(plan, buffers, storage, graph.sources), args, "cpp")

    def load(self, generated: GeneratedKernels):
        if not generated.kernel_args:
            return None
        return load_cpp(generated.source, {n: len(a) for n, a in generated.kernel_args.items()})


BACKENDS = {"cpp": CppBackend()}

if importlib.util.find_spec("triton") is not None:  # no triton -> no backend; the pipeline says so
    BACKENDS["triton"] = TritonBackend()
