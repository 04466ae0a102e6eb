"""Generate the Python that runs a compiled entry.

An entry's ``run(L)`` calls the compiled graph with its inputs (read from their sources
in ``L``), replays the side effects recorded while tracing, and rebuilds real Python
values from graph outputs: the return value, or at a graph break the frame's locals,
cells and stack, which it hands to the break's native step. Everything is one generated
function, so a cache hit costs a guard expression plus this straight-line code.
"""
from __future__ import annotations

import collections
import math
import re
import types

import torch

from minicompile.capture.entries.guards import Namespace
from minicompile.capture.interp.tracer import _DELETED, Tracer
from minicompile.capture.interp.variables import (EMPTY, NULL, GenContext, GenContextExit, GradModeCtx, GradModeExit,
                                                  GradModeFunction, GradRestore, GraphBreak, OpaqueValue, OpenGenContext,
                                                  ResumeIter, SymBoundMethod, SymCell, SymFunction, SymIter, TensorMethod,
                                                  TensorVar, contains_symbolic, real_grad_ctx, unfinished)
from minicompile.capture.python import objects


def _mkcell():
    return types.CellType()


def _mkfunc(code, globals_, name, defaults, kwdefaults, closure, annotations=None):
    fn = types.FunctionType(code, globals_, name, defaults, closure)
    fn.__qualname__ = code.co_qualname
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    if annotations:
        fn.__annotations__ = annotations
    return fn


def _replace_list(target: list, items: list) -> None:
    target[:] = items


def _replace_contents(target, items) -> None:
    """A dict's or a set's contents become ``items``'s, in place."""
    target.clear()
    target.update(items)


def _replace_deque(target: collections.deque, items) -> None:
    target.clear()
    target.extend(items)


_REPLACE = {list: "_replace_list", dict: "_replace_contents", collections.OrderedDict: "_replace_contents",
            set: "_replace_contents", collections.deque: "_replace_deque"}


class Reifier:
    """Turns symbolic values into source text that rebuilds the real values."""

    def __init__(self, tracer: Tracer, ns: Namespace, output_index: dict):
        self.tracer = tracer
        self.ns = ns
        self.output_index = output_index   # id(TensorVar) -> index into the graph's outputs
        self.lines: list[str] = []         # statements that must run before the expressions
        self.late: list[str] = []          # cell fills (cells may refer to themselves)
        self.memo: dict[int, str] = {}
        ns.values.update(_mkcell=_mkcell, _mkfunc=_mkfunc, _MethodType=types.MethodType,
                         _ResumeIter=ResumeIter, _replace_list=_replace_list,
                         _replace_contents=_replace_contents, _replace_deque=_replace_deque)

    def _temp(self, obj, text: str) -> str:
        name = f"t{len(self.memo)}"
        self.memo[id(obj)] = name
        self.lines.append(f"{name} = {text}")
        return name

    def _read(self, v, source: str) -> str:
        """An input read from its source: a path into an argument, a global or a cell
        (``L[1]['b']``, ``L[0].w``) is read into a temporary before any side effect is
        replayed, so ``d.pop('b')`` returns the value, not what ``d`` holds afterwards."""
        if _STABLE_SOURCE.fullmatch(source):
            return source
        return self._temp(v, source)

    def expr(self, v) -> str:
        """Source text that rebuilds ``v``: a graph value or a literal, an object made while
        tracing, a container built again, a value only the tracer has (a cell, a closure, a context
        manager), else what it was read from or a constant."""
        if id(v) in self.memo:
            return self.memo[id(v)]
        text = self._graph_value_or_literal(v)
        if text is not None:
            return text
        if self.tracer.is_new(v):
            return objects.rebuild_text(self, v)
        tracked = self.tracer.tracked_by_id.get(id(v))
        if tracked is not None:
            return self._read(v, tracked.source)   # same object as the caller's, contents replayed already
        for spell in (self._container, self._tracer_value):
            if (text := spell(v)) is not None:
                return text
        if isinstance(v, torch.Tensor):
            raise GraphBreak("a real tensor without a source reached the output")
        src = self.tracer.source_of(v)
        if src is not None and not src.startswith("_"):
            return self._read(v, src)
        return self.ns.const(v)

    def _graph_value_or_literal(self, v) -> str | None:
        """A graph output, an input read from its source, a size computed again from ``L``, a literal."""
        if isinstance(v, TensorVar):
            if id(v) in self.output_index:
                return f"o[{self.output_index[id(v)]}]"
            return self._read(v, v.source)
        if isinstance(v, OpaqueValue):
            return self._read(v, v.source)
        if isinstance(v, (torch.SymInt, torch.SymBool)):   # from int inputs and sizes: computed again from L
            return self.tracer.sym_nodes.text(v)
        if isinstance(v, torch.Size) and _holds_sym(v):
            return f"{self.ns.const(torch.Size, 'T')}(({''.join(self.expr(x) + ', ' for x in v)}))"
        if v is NULL:
            return "_NULL"
        if v is None or type(v) in (bool, int, str, bytes):
            return repr(v)
        if type(v) is float:
            return repr(v) if math.isfinite(v) else self.ns.const(v)
        return None

    def _container(self, v) -> str | None:
        """A tuple, list, dict, deque or set built again from its items (the caller's own object where
        unchanged); a view or bound method read through one; a slice."""
        if type(v) is tuple and _immutable(v):   # the same object: the caller's, or the code constant
            src = self.tracer.source_of(v)
            return self._read(v, src) if src else self.ns.const(v, "c")
        if type(v) is tuple:
            return "(" + "".join(self.expr(x) + ", " for x in v) + ")"
        if isinstance(v, tuple) and self.tracer.source_of(v) and _immutable(tuple(v)):
            return self._read(v, self.tracer.source_of(v))
        if isinstance(v, tuple) and not isinstance(v, torch.Size) and (contains_symbolic(v) or _holds_sym(v)):
            cls = self.ns.const(type(v), "T")
            items = ", ".join(self.expr(x) for x in v)
            if hasattr(type(v), "_fields"):
                return f"{cls}({items})"
            return f"{cls}(({items},))"
        if type(v) is list:
            self.memo[id(v)] = name = f"t{len(self.memo)}"
            self.lines.append(f"{name} = [{', '.join(self.expr(x) for x in v)}]")
            return name
        if type(v) in (dict, collections.OrderedDict):
            self.memo[id(v)] = name = f"t{len(self.memo)}"
            body = "{" + ", ".join(f"{self.expr(k)}: {self.expr(x)}" for k, x in v.items()) + "}"
            kind = "" if type(v) is dict else self.ns.const(collections.OrderedDict, "T")
            self.lines.append(f"{name} = {kind}({body})" if kind else f"{name} = {body}")
            return name
        if type(v) is collections.deque:
            items = ", ".join(self.expr(x) for x in v)
            return self._temp(v, f"{self.ns.const(collections.deque, 'T')}([{items}], {v.maxlen!r})")
        if type(v) is set:
            items = ", ".join(self.expr(x) for x in v)
            return self._temp(v, f"{{{items}}}" if v else "set()")
        if isinstance(v, types.BuiltinMethodType) and _bound_per_read(v):
            # a method of the rebuilt container, or of an object read from its source this call:
            # never the bound method of the traced call's object (``a.copy`` of an old array)
            return f"{self.expr(v.__self__)}.{v.__name__}"
        view = self.tracer.view_owner.get(id(v))
        if view is not None:
            return f"{self.expr(view[0])}.{view[1]}()"
        if type(v) is slice:
            return f"slice({self.expr(v.start)}, {self.expr(v.stop)}, {self.expr(v.step)})"
        return None

    def _tracer_value(self, v) -> str | None:
        """A value only the tracer has: an iterator's rest, a cell, a closure, a bound method, a grad
        mode or @contextmanager context; an unfinished generator or open with-block is a break."""
        if unfinished(v):
            raise GraphBreak("a generator that is not finished outlives the graph (it exists only in the tracer)")
        if isinstance(v, SymIter):
            items = ", ".join(self.expr(x) for x in v.remaining())
            return self._temp(v, f"_ResumeIter([{items}])")
        if isinstance(v, SymCell):
            name = self._temp(v, "_mkcell()")
            if v.value is not EMPTY:
                self.late.append(f"{name}.cell_contents = {self.expr(v.value)}")
            return name
        if isinstance(v, SymFunction):
            closure = "(" + "".join(self.expr(c) + ", " for c in v.closure) + ")" if v.closure else "None"
            return self._temp(v, f"_mkfunc({self.ns.const(v.code, 'code')}, "
                                 f"{self.ns.const(v.globals, 'G')}, {v.name!r}, "
                                 f"{self.expr(v.defaults)}, {self.expr(v.kwdefaults)}, {closure}, "
                                 f"{self.expr(v.annotations)})")
        if isinstance(v, SymBoundMethod):
            return f"_MethodType({self.expr(v.func)}, {self.expr(v.self_value)})"
        if isinstance(v, TensorMethod):
            return f"getattr({self.expr(v.tensor)}, {v.name!r})"
        if isinstance(v, GradModeCtx):
            return f"{self.ns.const(real_grad_ctx, 'grad_ctx')}({v.enabled})"
        if isinstance(v, GradModeFunction):
            return f"{self.ns.const(real_grad_ctx, 'grad_ctx')}({v.enabled})({self.expr(v.func)})"
        if isinstance(v, GenContext):
            args = "".join(f"{self.expr(a)}, " for a in v.args)
            kwargs = "".join(f"{k!r}: {self.expr(a)}, " for k, a in v.kwargs.items())
            return self._temp(v, f"{self.ns.const(v.fn, 'cm')}(*({args}), **{{{kwargs}}})")
        if isinstance(v, GenContextExit):
            if v.enter_offset is None:
                raise GraphBreak("a with-block over a traced @contextmanager is open in an inlined call")
            raise OpenGenContext(v.enter_offset)
        if isinstance(v, GradModeExit):
            return f"{self.ns.const(GradRestore, 'T')}({v.restore})"
        return None


_STABLE_SOURCE = re.compile(r"L\[\d+\]|\w+")   # a local or a namespace constant: no effect changes it


def _holds_sym(v, depth: int = 0) -> bool:
    """``v`` is, or a tuple or list in it holds, a SymInt/SymBool (made from int inputs and sizes)."""
    if isinstance(v, (torch.SymInt, torch.SymBool)):
        return True
    return isinstance(v, (tuple, list)) and depth < 8 and any(_holds_sym(x, depth + 1) for x in v)


def _bound_per_read(m) -> bool:
    """A builtin method bound to an object (``d.update``, ``s.upper``): made per attribute
    read, so rebuilt from its object, not held as a constant."""
    owner = m.__self__
    return owner is not None and not isinstance(owner, (types.ModuleType, type)) and (
        type(owner) in _REPLACE or getattr(owner, m.__name__, None) is not m)


def _immutable(v) -> bool:
    return v is None or type(v) in (bool, int, float, str, bytes) or type(v) is tuple and all(map(_immutable, v))


def side_effect_lines(tracer: Tracer, r: Reifier) -> list[str]:
    """Attribute/global/cell writes in program order, then tracked containers' contents."""
    out = []
    for se in tracer.side_effects:
        if se.value is _DELETED:
            out.append(f"delattr({se.target}, {se.name!r})")
            continue
        value = r.expr(se.value)
        if se.kind == "setattr":
            out.append(f"setattr({se.target}, {se.name!r}, {value})")
        elif se.kind == "setitem_global":
            out.append(f"{se.target}[{se.name!r}] = {value}")
        else:
            out.append(f"{se.target}.cell_contents = {value}")
    for t in tracer.tracked:
        now = list(t.copy.items()) if isinstance(t.copy, dict) else list(t.copy)
        if len(now) == len(t.snapshot) and all(a is b or (
                isinstance(a, tuple) and a[0] == b[0] and a[1] is b[1]) for a, b in zip(now, t.snapshot)):
            continue
        saved = tracer.tracked_by_id.pop(id(t.copy))   # build a fresh value, then copy it in
        fresh = type(t.copy)(t.copy)
        tracer._keep.append(fresh)   # alive while r's memo knows its id: no later temporary reuses it
        out.append(f"{_REPLACE[type(t.copy)]}({t.source}, {r.expr(fresh)})")
        tracer.tracked_by_id[id(t.copy)] = saved
    return out


def compile_function(src: str, ns: Namespace, name: str, filename: str):
    scope = dict(ns.values)
    exec(compile(src, filename, "exec"), scope)
    return scope[name]
