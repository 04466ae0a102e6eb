"""Code generators: each renders a Schedule's kernels for one kind of device.

A backend is an object with
    name: str
    caps: BackendCaps        what it can do (scheduler/caps.py); the pipeline hands it to schedule()
    generate(graph, plan) -> GeneratedKernels     (ir.LoopGraph, scheduler.Schedule; codegen/common.py)
    load(generated) -> object with one callable attribute per kernel name
    start_load(generated) -> a future of load's result (optional: the build runs in the background)
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
