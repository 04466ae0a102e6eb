"""Code generators: each renders a Schedule's kernels for one kind of device.

A backend is an object with
    name: str
    pass_pointers: bool      wrapper passes ``t.data_ptr()`` (True) or the tensors (False)
    row_scratch: bool        keeps per-row values read by a later loop in a row-sized array
    generate(schedule, buffers, storage, sources) -> GeneratedKernels (codegen/common.py)
    load(generated) -> object with one callable attribute per kernel name
defined next to its generator and registered in BACKENDS under its name. The pipeline picks
one by device and config.
"""
from __future__ import annotations

import importlib.util

from minicompile.codegen.common import GeneratedKernels
from minicompile.codegen.cpp import CppBackend
from minicompile.codegen.triton import TritonBackend

BACKENDS = {"cpp": CppBackend()}

if importlib.util.find_spec("triton") is not None:  # no triton -> no backend; the pipeline says so
    BACKENDS["triton"] = TritonBackend()

__all__ = ["BACKENDS", "CppBackend", "GeneratedKernels", "TritonBackend"]
