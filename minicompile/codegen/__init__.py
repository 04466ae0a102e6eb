"""Code generators: each renders a Schedule's kernels for one kind of device.

A backend is an object with
    name: str
    pass_pointers: bool      wrapper passes ``t.data_ptr()`` (True) or the tensors (False)
    row_scratch: bool        keeps per-row values read by a later loop in a row-sized array
    generate(schedule, buffers, storage, sources) -> GeneratedKernels
    load(generated) -> object with one callable attribute per kernel name
registered in BACKENDS under its name. The pipeline picks one by device and config.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from minicompile.codegen.cpp import CppKernel, generate_cpp
from minicompile.codegen.triton import TritonBackend
from minicompile.runtime.cpp_build import load as load_cpp


@dataclass
class GeneratedKernels:
    source: str
    kernel_args: dict   # kernel name -> [buffer/pointer names, in call order]
    language: str       # "cpp" | "python" (for syntax highlighting and file suffixes)


class CppBackend:
    name = "cpp"
    pass_pointers = True
    row_scratch = True

    def generate(self, schedule, buffers, storage, sources) -> GeneratedKernels:
        kernels = {k.name: CppKernel(k, buffers, storage, sources) for k in schedule.kernels}
        args = {name: [p for p, _, _ in ck.args()] for name, ck in kernels.items()}
        return GeneratedKernels(generate_cpp(schedule, buffers, storage, sources), args, "cpp")

    def load(self, generated: GeneratedKernels):
        if not generated.kernel_args:
            return None
        return load_cpp(generated.source, {n: len(a) for n, a in generated.kernel_args.items()})


BACKENDS = {"cpp": CppBackend()}

if importlib.util.find_spec("triton") is not None:  # no triton -> no backend; the pipeline says so
    BACKENDS["triton"] = TritonBackend()
