"""Public entry points: ``compile`` and ``explain``.

    @compile                       # or compile(fn), compile(fn, backend=my_backend)
    def f(x): ...

    report = explain(f)(x)         # graphs, breaks (reason + file:line), guards, ops
    print(report)
"""
from __future__ import annotations

import functools
import sys
import types
import warnings

from torch import nn

from minicompile.capture.entries.cache import CaptureContext, _module_hooks, eager_backend
from minicompile.capture.explain import CaptureReport
from minicompile.capture.python.calls import class_call

SUPPORTED_PYTHON = ((3, 11), (3, 12), (3, 13))


def _python_version() -> tuple:
    """The running interpreter's (major, minor); a function so tests can pretend."""
    return sys.version_info[:2]


def _version_problem() -> str | None:
    v = _python_version()
    if tuple(v) in SUPPORTED_PYTHON:
        return None
    return (f"minicompile capture reads CPython 3.11-3.13 bytecode, but this is Python "
            f"{v[0]}.{v[1]}; falling back to torch.fx.symbolic_trace (or eager)")


class CompiledModule:
    """A module whose forward runs through capture; everything else is the module's."""

    is_capture_wrapper = True   # lets a compiled caller inline the module instead of breaking

    def __init__(self, module: nn.Module, forward):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_forward", forward)
        object.__setattr__(self, "capture_report", forward.capture_report)

    def __call__(self, *args, **kwargs):
        m = self._module
        if _module_hooks(m):  # hooks run through nn.Module.__call__, uncompiled
            return m(*args, **kwargs)
        return self._forward(m, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def __setattr__(self, name, value):
        setattr(self._module, name, value)

    def __repr__(self):
        return f"CompiledModule({self._module!r})"


def compile(fn=None, *, backend=None, dynamic=None, fullgraph: bool = False):
    """Capture ``fn`` (a function or nn.Module) with minicompile's bytecode tracer.

    ``backend(gm, example_inputs) -> callable`` compiles each captured FX graph; the
    default runs graphs eagerly. Usable as ``@compile``, ``@compile(backend=...)`` or
    ``compile(fn)``. The result has ``capture_report`` (a CaptureReport). ``dynamic`` has
    torch.compile's meaning (capture/dynamic.py): None makes the sizes that change between
    calls symbolic (and ``torch._dynamo.mark_dynamic``'s dimensions from the first call),
    True every size from the first call, False none. ``fullgraph=True`` raises
    GraphBreakError at the first graph break or fallback instead of running that code in Python.
    """
    if fn is None:
        return functools.partial(compile, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    problem = _version_problem()
    if problem:
        warnings.warn(problem, stacklevel=2)
    ctx = CaptureContext(backend or eager_backend, force_fallback=problem, dynamic=dynamic,
                         fullgraph=fullgraph)
    return _compile_with(ctx, fn)


def _compile_with(ctx: CaptureContext, fn):
    if isinstance(fn, nn.Module):
        forward = fn.__dict__.get("forward")
        if isinstance(forward, types.MethodType):
            return _bound(ctx, forward)
        if isinstance(forward, types.FunctionType):
            return _with_report(ctx.wrapper_for(forward), ctx)
        call = class_call(type(fn))   # a class's own __call__ runs first, as calling the module does
        if call is nn.Module.__call__:
            call = type(fn).forward
        elif not isinstance(call, types.FunctionType):
            call = _call_module     # traced as a call of the module: a break into its __call__
        return CompiledModule(fn, ctx.wrapper_for(call))
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return _bound(ctx, fn)
    if isinstance(fn, types.FunctionType):
        return ctx.wrapper_for(fn)
    raise TypeError(f"minicompile.compile expects a Python function or an nn.Module, "
                    f"got {type(fn).__name__}; wrap it in a function (def f(*a): return obj(*a)).")


def _call_module(module, *args, **kwargs):
    return module(*args, **kwargs)


def _bound(ctx: CaptureContext, method: types.MethodType):
    wrapper = ctx.wrapper_for(method.__func__)
    bound = functools.partial(wrapper, method.__self__)
    return _with_report(bound, ctx)


def _with_report(fn, ctx):
    try:
        fn.capture_report = ctx.report
    except AttributeError:
        pass
    return fn


def explain(fn, backend=None):
    """``explain(fn)(*args, **kwargs)`` runs one call under a fresh capture and returns its
    CaptureReport (graphs, ops per graph, graph breaks with reasons and file:line,
    fallbacks, guards of each entry). ``report.output`` is what the call returned. An already
    compiled ``fn`` (``@compile``) is explained as its original function or module."""
    fn = fn._module if isinstance(fn, CompiledModule) else fn
    fn = fn.__wrapped__ if hasattr(fn, "capture_report") and hasattr(fn, "__wrapped__") else fn

    def run(*args, **kwargs) -> CaptureReport:
        problem = _version_problem()
        if problem:
            warnings.warn(problem, stacklevel=2)
        ctx = CaptureContext(backend or eager_backend, force_fallback=problem)
        compiled = _compile_with(ctx, fn)
        ctx.report.output = compiled(*args, **kwargs)
        return ctx.report
    return run
