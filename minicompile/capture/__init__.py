"""minicompile's own capture front end: a CPython 3.11/3.12/3.13 bytecode tracer.

    from minicompile.capture import compile, explain
    f = compile(fn)                 # or @compile / compile(fn, backend=...)
    report = explain(fn)(*args)     # CaptureReport: graphs, breaks, guards, ops

See docs/capture.md for how it works.
"""
# The interpreter's opcode table is filled by importing the handler modules.
from minicompile.capture.interp import interpreter as _interpreter  # noqa: F401
from minicompile.capture.interp import opcodes313 as _opcodes313  # noqa: F401
from minicompile.capture.interp import ops_data as _ops_data  # noqa: F401
from minicompile.capture.api import CompiledModule, compile, explain
from minicompile.capture.entries.cache import eager_backend
from minicompile.capture.explain import CaptureReport, GraphBreakError

__all__ = ["compile", "explain", "CaptureReport", "CompiledModule", "eager_backend", "GraphBreakError"]
