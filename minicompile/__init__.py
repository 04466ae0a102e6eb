"""minicompile: a small, readable PyTorch compiler.

    torch.compile(model, backend="minicompile")   # Dynamo captures, minicompile compiles
    minicompile.compile(model)                      # minicompile's own bytecode capture
"""
from minicompile.capture import CaptureReport
from minicompile.capture import compile as _capture_compile
from minicompile.capture import explain as _capture_explain
from minicompile.config import config, patch

__all__ = ["compile", "explain", "CaptureReport", "config", "patch"]


def _default_backend(gm, example_inputs):
    from minicompile.backend import minicompile_backend  # the pipeline loads torch's heavy tracing machinery
    return minicompile_backend(gm, example_inputs)


def compile(fn=None, *, backend=None, dynamic=None):
    """Capture ``fn`` (a function or nn.Module) with minicompile's bytecode tracer and compile each
    graph with ``backend`` (default: the minicompile pipeline). Usable as ``@compile`` too.
    ``dynamic`` as torch.compile's: None (sizes that change become symbolic), True, False."""
    return _capture_compile(fn, backend=backend or _default_backend, dynamic=dynamic)


def explain(fn, backend=None):
    """``explain(fn)(*args)`` -> CaptureReport: graphs, breaks with reasons and lines, guards, ops."""
    return _capture_explain(fn, backend=backend or _default_backend)
