"""Per-code-object caches and the call interception ("PEP 523-style", in Python).

``make_wrapper`` returns the function users call instead of theirs. On a call it tries the
cache entries of the code object at offset 0 (one generated guard+run function each); on
a miss it traces (or recompiles, logging the guard that failed). Resume points after
graph breaks have their own entry lists in the same cache, keyed by offset.
"""
from __future__ import annotations

import functools
import inspect
import logging
import re
import types
import warnings

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from minicompile.capture.dynamic import FrameSizes
from minicompile.capture.entries.fallback import try_fx
from minicompile.capture.entries.native import NativeEntry, runs_natively, unwind
from minicompile.capture.entries.segment import MISS, CannotCapture, trace_segment
from minicompile.capture.explain import CaptureReport, FallbackRecord, GraphBreakError, RecompileRecord
from minicompile.capture.interp.frame import arg_names, bind_arguments, code_info, frame_value_names, loop_bodies, prescan
from minicompile.capture.python.calls import class_call
from minicompile.config import config

log = logging.getLogger("minicompile.capture")

# A resume point inside a loop gets one entry per iteration state (loop counter, items
# left), so it may hold this many times the recompile limit before the function goes eager;
# any other offset holds ``config.recompile_limit`` entries.
LOOP_LIMIT_FACTOR = 8


def eager_backend(gm: torch.fx.GraphModule, example_inputs: list):
    """The default capture backend: run the captured graph with eager PyTorch."""
    return gm.forward


class CaptureContext:
    """Shared by everything one ``compile()`` produced: backend, report, nested wrappers."""

    def __init__(self, backend=None, force_fallback: str | None = None, dynamic: bool | None = None,
                 fullgraph: bool = False):
        self.backend = backend or eager_backend
        self.dynamic = dynamic        # torch.compile's ``dynamic``: None (automatic), True, False
        self.fullgraph = fullgraph    # a graph break or fallback raises GraphBreakError
        self.report = CaptureReport()
        self.force_fallback = force_fallback     # e.g. unsupported Python version
        self.caches: dict = {}        # code object -> CodeCache
        self._wrappers: dict = {}     # function -> its wrapper (user-compiled functions)

    def cache_for(self, fn: types.FunctionType) -> "CodeCache":
        cache = self.caches.get(fn.__code__)
        if cache is None:
            cache = self.caches[fn.__code__] = CodeCache(fn, self)
        return cache

    def wrapper_for(self, fn: types.FunctionType):
        w = self._wrappers.get(fn)
        if w is None:
            w = make_wrapper(self.cache_for(fn), fn)
            if "<locals>" not in fn.__qualname__:  # closures are made per call: do not pile up
                self._wrappers[fn] = w
        return w

    def native_callable(self, fn):
        """What a graph break calls: user Python functions go through their own cache, except
        generator functions and generator expressions: calling one runs nothing, and the real
        generator it returns runs lazily in Python, each item when its consumer asks for it."""
        func = fn.__func__ if isinstance(fn, types.MethodType) else fn
        if isinstance(func, types.FunctionType) and func.__code__.co_flags & inspect.CO_GENERATOR:
            return fn
        if isinstance(fn, types.FunctionType) and not _is_library(fn):
            return self.wrapper_for(fn)
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType) \
                and not _is_library(fn.__func__):
            return functools.partial(self.wrapper_for(fn.__func__), fn.__self__)
        if isinstance(fn, nn.Module) and not _module_hooks(fn) and "forward" not in fn.__dict__:
            call = class_call(type(fn))
            if call is nn.Module.__call__ and not _is_library(type(fn).forward):
                return functools.partial(self.wrapper_for(type(fn).forward), fn)
            if isinstance(call, types.FunctionType) and not _is_library(call):   # the class's own __call__
                return functools.partial(self.wrapper_for(call), fn)
        return fn


def _is_library(fn) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    return mod.split(".")[0] in ("torch", "functools", "typing", "builtins")


def _module_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


class CodeCache:
    """All cache entries of one code object, keyed by offset (0 = the call).

    Shared by every function object made from the code (closures made per call share it);
    the closure cells travel in ``L`` after the arguments, so guards read them from there.
    """

    def __init__(self, fn: types.FunctionType, ctx: CaptureContext):
        self.fn = fn                   # a representative function: name, globals
        self.code = fn.__code__
        self.globals = fn.__globals__
        self.ctx = ctx
        self.entries: dict[int, list] = {0: []}
        self.sizes: dict[int, FrameSizes] = {}   # per offset: the sizes its traces saw
        self.specialised_floats: dict[int, set] = {}   # per offset: float sources a trace needed the value of
        self.fast0: list = []          # entries[0]'s fast functions, what the wrapper loops over
        self.eager = False
        self._warned = False
        self.names = arg_names(self.code)
        flags = self.code.co_flags
        self.simple_nargs = (self.code.co_argcount if not (flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS))
                             and not self.code.co_kwonlyargcount else -1)

    def frame_sizes(self, offset: int) -> FrameSizes:
        fs = self.sizes.get(offset)
        if fs is None:
            fs = self.sizes[offset] = FrameSizes(self.code.co_name, offset, self.ctx.report, self.ctx.dynamic)
        return fs

    # ------------------------------------------------------------------ binding
    def bind(self, fn, args: tuple, kwargs: dict) -> tuple:
        bound = bind_arguments(self.code, fn.__defaults__, fn.__kwdefaults__, args, kwargs)
        return tuple(bound[n] for n in self.names) + (fn.__closure__ or ())

    # ------------------------------------------------------------------ misses
    def miss(self, fn, L: tuple, args: tuple, kwargs: dict):
        """No entry at the call's start matched: compile one (or run eagerly)."""
        if self.eager:
            return fn(*args, **kwargs)
        entries = self.entries[0]
        if entries:
            guard = self._failed_guard(entries, 0, L)
            limit_hit = len(entries) >= config.recompile_limit
            self.ctx.report.recompiles.append(RecompileRecord(self.code.co_name, 0, guard, limit_hit))
            log.info("recompiling %s: guard failed: %s", self.code.co_name, guard)
            if limit_hit:
                self._go_eager(guard, 0)
                return fn(*args, **kwargs)
        reason = self.ctx.force_fallback or prescan(self.code)
        if reason is None:
            try:
                entry = trace_segment(self, 0, L)
            except CannotCapture as e:
                reason, where = e.reason, e.where
            else:
                entries.append(entry)
                self.fast0.append(entry.fast)
                return entry.run(L)
        else:
            where = f"{self.code.co_filename}:{self.code.co_firstlineno}"
        return self._fallback(fn, L, args, kwargs, reason, where)

    def resume(self, offset: int, L: tuple):
        """Continue the frame at ``offset`` after a graph break ran in Python."""
        entries = self.entries.setdefault(offset, [])
        for e in entries:
            r = e.fast(L)
            if r is not MISS:
                return r
        if entries:
            guard = self._failed_guard(entries, offset, L)
            limit_hit = len(entries) >= self.limit(offset)
            self.ctx.report.recompiles.append(RecompileRecord(self.code.co_name, offset, guard, limit_hit))
            log.info("recompiling %s at offset %d: guard failed: %s", self.code.co_name, offset, guard)
            if limit_hit:
                # Halfway through a call there is no eager frame to return to: finish this call
                # in Python where every instruction left can be stepped, else compiled; later
                # calls run eagerly from the start.
                self._go_eager(guard, offset)
                if runs_natively(self.code):
                    return NativeEntry(self, offset, "recompile limit", None, trace=False).run(L)
        return self.new_resume_entry(offset, L).run(L)

    def unwind(self, offset: int, error: BaseException, locals_: list, cells: list, stack: list):
        """``error`` raised where a break ran the instruction at ``offset`` in Python: to the
        frame's handler for it (run in Python), or out of the frame (native.unwind)."""
        return unwind(self, offset, error, locals_, cells, stack)

    def new_resume_entry(self, offset: int, L: tuple, record: bool = True):
        """Trace the frame from ``offset``; where impossible (too late for fx/eager) run it in Python
        until tracing can resume (a NativeEntry, recorded once per stretch as a "python" fallback)."""
        try:
            entry = trace_segment(self, offset, L)
        except CannotCapture as e:
            entry = NativeEntry(self, offset, e.reason, e.where)
            if record:
                reason = f"from offset {offset}: {e.reason}"
                self.ctx.report.fallbacks.append(FallbackRecord(self.code.co_name, "python", reason, e.where))
            log.info("running %s from offset %d in Python: %s", self.code.co_name, offset, e.reason)
        self.entries.setdefault(offset, []).append(entry)
        return entry

    def limit(self, offset: int) -> int:
        """Entries allowed at ``offset``: the recompile limit, times LOOP_LIMIT_FACTOR at a resume
        point inside a loop (one entry per iteration state)."""
        return config.recompile_limit * (LOOP_LIMIT_FACTOR if offset in loop_bodies(self.code) else 1)

    def _failed_guard(self, entries: list, offset: int, L: tuple) -> str:
        guards = entries[-1].guards
        failed = (guards.first_failure(L) if guards is not None else None) or "(no single guard failed)"
        names = frame_value_names(self.code, offset)
        def name(m):
            i = int(m.group(1))
            return f"{m.group(0)} ({names[i] if i < len(names) else 'a value on the stack'})"
        return re.sub(r"\bL\[(\d+)\]", name, failed, count=1)

    def _go_eager(self, guard: str, offset: int) -> None:
        self.eager = True
        self.fast0.clear()
        if not self._warned:
            self._warned = True
            limit = self.limit(offset)
            where = (f"{limit} entries at its start" if offset == 0 else
                     f"{limit} entries at the resume point after the graph break at line "
                     f"{code_info(self.code).lines.get(offset)}"
                     + (f" (recompile_limit x {LOOP_LIMIT_FACTOR}: it is inside a loop)"
                        if limit != config.recompile_limit else ""))
            warnings.warn(
                f"minicompile: {self.code.co_name}() hit the recompile limit ({where}); running "
                f"it eagerly from now on. The guard that kept failing: {guard}. Raise "
                f"minicompile.config.recompile_limit (MINICOMPILE_RECOMPILE_LIMIT) if this is "
                f"expected.", stacklevel=4)

    def _fallback(self, fn, L, args, kwargs, reason: str, where: str | None):
        name = self.code.co_name
        if self.ctx.fullgraph:
            raise GraphBreakError(name, reason, where)
        entry, why_not = try_fx(self, fn, L[:len(self.names)]) if not fn.__closure__ else (None, "closure")
        if entry is not None:
            self.ctx.report.fallbacks.append(FallbackRecord(name, "fx", reason, where))
            self.entries[0].append(entry)
            self.fast0.append(entry.fast)
            return entry.fast(L)
        self.ctx.report.fallbacks.append(FallbackRecord(name, "eager", f"{reason}; fx: {why_not}", where))
        log.info("running %s eagerly: %s (%s)", name, reason, why_not)
        self.eager = True
        self.fast0.clear()
        return fn(*args, **kwargs)


def make_wrapper(cache: CodeCache, fn: types.FunctionType):
    """The function that replaces ``cache.fn``: guard checks, then the compiled entry."""
    fast0 = cache.fast0
    nargs = cache.simple_nargs if not fn.__closure__ else -1
    bind = cache.bind
    miss = cache.miss
    _MISS = MISS

    def wrapper(*args, **kwargs):
        L = args if (not kwargs and len(args) == nargs) else bind(fn, args, kwargs)
        for fast in fast0:
            r = fast(L)
            if r is not _MISS:
                return r
        return miss(fn, L, args, kwargs)

    functools.update_wrapper(wrapper, fn)
    wrapper.__wrapped__ = fn
    wrapper.capture_cache = cache
    wrapper.capture_report = cache.ctx.report
    return wrapper
