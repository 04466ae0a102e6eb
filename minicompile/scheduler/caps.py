"""BackendCaps: what a code generator can do, as the scheduler needs to know it.

A backend (codegen/) declares one; the pipeline hands it to ``schedule()``, and the Schedule
keeps it, so the code generators and the wrapper read the same value the plan was made for.
It lives here, below codegen/, so the scheduler can take it without importing a backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class BackendCaps:
    row_scratch: bool     # a per-row value read by a later loop of its kernel can live in a row-sized array
    pass_pointers: bool   # kernels take raw data pointers (the wrapper passes t.data_ptr()), not tensors
    split_loops: bool = False  # loops split where indices divide them (nested loops gain unit-stride
    #                            inner loops; a flat Triton index would unravel them again for nothing)
    # (kernel, buffers by name, storage of mutations, sources) -> the plan of where each of its
    # values is computed (codegen/cpp_plan.py), kept on the kernel and printed with the schedule
    plan: Callable | None = None
    horizontal: bool = False  # independent kernels can run as one call, one parallel region (scheduler/groups.py)
    # whole kernels the backend generates for one op (lowering/flex.py: "flex_attention"); the
    # scheduler gives each a step of its own (TemplateKernel). "checked_gather": its kernels read
    # indices from memory and check them as eager does (lowering/gathers.py)
    templates: frozenset = frozenset()
