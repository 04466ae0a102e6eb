"""minicompile: a small, readable PyTorch compiler.

    torch.compile(model, backend="minicompile")   # Dynamo captures, minicompile compiles
    minicompile.compile(model)                      # minicompile's own bytecode capture
"""
from minicompile.capture import CaptureReport, GraphBreakError
from minicompile.capture import compile as _capture_compile
from minicompile.capture import explain as _capture_explain
from minicompile.compile_options import graph_compiler
from minicompile.config import config, patch

__all__ = ["compile", "explain", "CaptureReport", "GraphBreakError", "config", "patch"]


def compile(fn=None, *, fullgraph: bool = False, dynamic=None, backend=None, mode=None, options=None):
    """Capture ``fn`` (a function or nn.Module) with minicompile's bytecode tracer and compile each
    graph; torch.compile's arguments, usable as ``@compile`` or ``@compile(...)`` too.

    ``fullgraph=True``: the first graph break (or fallback) raises GraphBreakError with its reason
    and source line. ``dynamic``: None (sizes that change become symbolic), True, False.
    ``backend``: the minicompile pipeline (default, or "minicompile"), a registered Dynamo backend
    name ("inductor", "eager", "aot_eager", ...) or a callable(gm, example_inputs).
    ``mode``/``options``: the pipeline's modes and knobs (docs/modes.md), checked now; for another
    backend they are passed on as torch.compile passes them."""
    compiler = graph_compiler(backend, mode, options, dynamic)
    return _capture_compile(fn, backend=compiler, dynamic=dynamic, fullgraph=fullgraph)


def explain(fn, backend=None):
    """``explain(fn)(*args)`` -> CaptureReport: graphs, breaks with reasons and lines, guards, ops."""
    return _capture_explain(fn, backend=graph_compiler(backend))
