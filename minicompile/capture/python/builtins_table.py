"""Python builtins the tracer understands: one handler per builtin, in one table.

A handler gets ``(tracer, args, kwargs)`` with symbolic values and returns a symbolic
value. A builtin missing from this table (``print``, ``open``, ``input``, ...) is a graph
break: it runs in real Python between two graphs.
"""
from __future__ import annotations

import builtins
import collections
import functools
import inspect
import itertools
import types
import operator

import torch
from torch import nn

from minicompile.capture.dynamic import SYM_TYPES, concrete
from minicompile.capture.interp.tracer import Tracer
from minicompile.capture.interp.variables import (NULL, GraphBreak, LazyIter, MissingAttribute, OpaqueValue, SymBoundMethod,
                                                  SymFunction, SymIter, refuse_opaque,
                                                  TensorMethod, TensorVar, contains_symbolic, unfinished)
from minicompile.capture.python import objects, semantics

BUILTINS: dict = {}


def builtin(*fns):
    def register(handler):
        for fn in fns:
            BUILTINS[fn] = handler
        return handler
    return register


def _constant_args(name: str, args, kwargs) -> None:
    refuse_opaque(f"{name}()", *args, *kwargs.values())
    if contains_symbolic((list(args), kwargs)):
        raise GraphBreak(f"{name}() on tensors or traced objects needs their values")


# Pure functions of constants: computed now, the result is a constant.
def _pure(fn):
    def handler(tracer: Tracer, args, kwargs):
        _constant_args(fn.__name__, args, kwargs)
        if any(tracer.sym_nodes.reads_int_input(a) for a in args):   # as Dynamo: not a reason to specialise
            raise GraphBreak(f"{fn.__name__}() of an int the graph takes as an input needs its value")
        return fn(*concrete(args), **kwargs)   # str(SymInt) would be its symbol's name
    return handler


for _fn in (builtins.round, builtins.divmod, builtins.pow, builtins.chr, builtins.ord,
            builtins.str, builtins.repr, builtins.hash, builtins.format, builtins.slice,
            builtins.complex, builtins.bin, builtins.hex, builtins.oct, builtins.issubclass,
            builtins.frozenset, builtins.set):
    BUILTINS[_fn] = _pure(_fn)


def _make_number(fn):
    def handler(tracer: Tracer, args, kwargs):
        if args and isinstance(args[0], TensorVar):
            raise GraphBreak(f"{fn.__name__}(tensor) needs the tensor's value (graph break)")
        if fn is builtins.bool and args:
            return semantics.truth(tracer, args[0])
        _constant_args(fn.__name__, args, kwargs)
        return fn(*args, **kwargs)
    return handler


for _fn in (builtins.int, builtins.float, builtins.bool):
    BUILTINS[_fn] = _make_number(_fn)


@builtin(builtins.len)
def _len(tracer: Tracer, args, kwargs):
    (v,) = args
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            raise GraphBreak("len() of a 0-d tensor")
        return v.fake.shape[0]
    if isinstance(v, SymIter):
        raise GraphBreak("len() of an iterator")
    if isinstance(v, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
        return len(v._modules)
    if isinstance(v, (nn.ParameterList, nn.ParameterDict)):
        return len(v._parameters)
    hook = inspect.getattr_static(type(v), "__len__", None)
    if isinstance(hook, types.FunctionType):
        n = tracer.call(hook, [v], {})
        if type(n) is not int:
            raise GraphBreak(f"len() of a {type(v).__name__} is not a constant")
        return n
    if semantics.is_plain(v) or tracer.is_new(v):
        return len(v)
    raise GraphBreak(f"len() of a {type(v).__name__}")


@builtin(builtins.range)
def _range(tracer: Tracer, args, kwargs):
    _constant_args("range", args, kwargs)
    return range(*args)


def _lazy(columns: list, make):
    """A LazyIter over unfinished generators in ``columns``: each item ``make(values)`` from one
    ``next`` per column, in order, stopping at the first exhausted one (Python's order, so a
    generator runs no further than its consumer asks)."""
    its = [c if isinstance(c, SymIter) else SymIter(c) for c in columns]

    def produce():
        values = []
        for it in its:
            v = it.next()
            if v is NULL:
                return NULL
            values.append(v)
        return make(values)
    return LazyIter(produce)


@builtin(itertools.pairwise)
def _pairwise(tracer: Tracer, args, kwargs):
    """Its pairs computed now (read ahead at a break, Python could not look inside it)."""
    if kwargs or len(args) != 1 or unfinished(args[0]):
        raise GraphBreak("itertools.pairwise over an unfinished generator")
    items = semantics.iterate(tracer, args[0])
    return SymIter(list(zip(items, items[1:])))


@builtin(builtins.enumerate)
def _enumerate(tracer: Tracer, args, kwargs):
    start = args[1] if len(args) > 1 else kwargs.get("start", 0)
    if unfinished(args[0]):
        count = itertools.count(start)
        return _lazy([args[0]], lambda vs: (next(count), vs[0]))
    items = semantics.iterate(tracer, args[0])
    return SymIter([(start + i, v) for i, v in enumerate(items)])


@builtin(builtins.zip)
def _zip(tracer: Tracer, args, kwargs):
    if any(unfinished(a) for a in args) and not kwargs.get("strict"):
        return _lazy([a if isinstance(a, SymIter) else semantics.iterate(tracer, a) for a in args], tuple)
    if kwargs.get("strict"):
        lists = [semantics.iterate(tracer, a) for a in args]
        if len({len(x) for x in lists}) > 1:
            raise GraphBreak("zip(strict=True) with unequal lengths")
    return SymIter(list(zip(*[semantics.iterate(tracer, a) for a in args])))


@builtin(builtins.reversed)
def _reversed(tracer: Tracer, args, kwargs):
    return SymIter(list(reversed(semantics.iterate(tracer, args[0]))))


@builtin(builtins.iter)
def _iter(tracer: Tracer, args, kwargs):
    if len(args) != 1:
        raise GraphBreak("iter(callable, sentinel)")
    if isinstance(args[0], SymIter):
        return args[0]
    return SymIter(semantics.iterate(tracer, args[0]))


@builtin(builtins.next)
def _next(tracer: Tracer, args, kwargs):
    it = args[0]
    if not isinstance(it, SymIter):
        raise GraphBreak(f"next() on a {type(it).__name__}")
    v = it.next()
    if v is NULL:
        if len(args) > 1:
            return args[1]
        raise GraphBreak("StopIteration from next()")
    return v


@builtin(builtins.list)
def _list(tracer: Tracer, args, kwargs):
    return list(semantics.iterate(tracer, args[0])) if args else []


@builtin(builtins.tuple)
def _tuple(tracer: Tracer, args, kwargs):
    return tuple(semantics.iterate(tracer, args[0])) if args else ()


def _dict_of(cls):
    def handler(tracer: Tracer, args, kwargs):
        return _fill_dict(tracer, cls(), args, kwargs)
    return handler


BUILTINS[builtins.dict] = _dict_of(dict)
BUILTINS[collections.OrderedDict] = _dict_of(collections.OrderedDict)


def _fill_dict(tracer: Tracer, result: dict, args, kwargs):
    if args:
        src = args[0]
        if type(src) in semantics.DICT_TYPES:
            result.update(src)
        elif isinstance(src, dict):
            raise GraphBreak(f"dict() of a {type(src).__name__} (its items would be read untraced)")
        else:
            for pair in semantics.iterate(tracer, src):
                k, v = semantics.iterate(tracer, pair)
                result[k] = v
    result.update(kwargs)
    return result


@builtin(builtins.sorted)
def _sorted(tracer: Tracer, args, kwargs):
    items = semantics.iterate(tracer, args[0])
    _constant_args("sorted", [], kwargs)
    try:  # tuples with constant keys first sort fine; reaching a tensor raises TypeError
        return sorted(items, **kwargs)
    except TypeError:
        raise GraphBreak("sorted() would compare tensors") from None


@builtin(builtins.isinstance)
def _isinstance(tracer: Tracer, args, kwargs):
    v, cls = args
    return _issub(_type_of(v), cls)


def _issub(tp, cls) -> bool:
    if isinstance(cls, tuple):
        return any(_issub(tp, c) for c in cls)
    return issubclass(tp, cls)


_SYM_PYTHON = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _type_of(v) -> type:
    if isinstance(v, SYM_TYPES):   # a symbolic size stands for an int
        return _SYM_PYTHON[type(v)]
    if isinstance(v, (TensorVar, OpaqueValue)):
        return v.cls
    if isinstance(v, SymFunction):
        return type(_type_of)
    if isinstance(v, LazyIter):
        return types.GeneratorType
    if isinstance(v, SymIter):
        return type(iter([]))
    if isinstance(v, (SymBoundMethod, TensorMethod)):
        return type(Tracer.wrap.__get__(object()))
    return type(v)


@builtin(builtins.type)
def _type(tracer: Tracer, args, kwargs):
    if len(args) != 1:
        raise GraphBreak("type() with 3 arguments (class creation)")
    return _type_of(args[0])


@builtin(builtins.callable)
def _callable(tracer: Tracer, args, kwargs):
    v = args[0]
    if isinstance(v, (SymFunction, SymBoundMethod, TensorMethod)):
        return True
    if isinstance(v, (TensorVar, OpaqueValue)):
        return False
    return callable(v)


def _attr_name(name) -> str:
    if type(name) is not str:
        raise GraphBreak(f"attribute name is a {type(name).__name__}, not a str (TypeError in Python)")
    return name


@builtin(builtins.getattr)
def _getattr(tracer: Tracer, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        raise GraphBreak("getattr() with other arguments than (obj, name[, default])")
    obj, name = args[0], _attr_name(args[1])
    if len(args) == 3:
        try:
            return semantics.getattr_(tracer, obj, name)
        except MissingAttribute as e:   # only where Python raises AttributeError (guarded absent)
            if e.retrace:
                raise
            return args[2]
    return semantics.getattr_(tracer, obj, name)


@builtin(builtins.hasattr)
def _hasattr(tracer: Tracer, args, kwargs):
    if kwargs or len(args) != 2:
        raise GraphBreak("hasattr() with other arguments than (obj, name)")
    obj, name = args[0], _attr_name(args[1])
    try:
        semantics.getattr_(tracer, obj, name)
    except MissingAttribute as e:
        if e.retrace:
            raise
        return False
    return True


# Objects whose identity every trace that sees them guards (or that exist once per process):
# ``id()`` of them is a constant of the entry.
_STABLE_IDENTITY = (type(None), bool, type(NotImplemented), type(...), type, types.ModuleType, nn.Module)


@builtin(builtins.id)
def _id(tracer: Tracer, args, kwargs):
    (v,) = args
    if isinstance(v, _STABLE_IDENTITY) or (
            isinstance(v, types.FunctionType) and "<locals>" not in v.__qualname__):
        return id(v)
    raise GraphBreak(f"id() of a {_type_of(v).__name__} (not the same object on every call)")


@builtin(builtins.setattr)
def _setattr(tracer: Tracer, args, kwargs):
    semantics.setattr_(tracer, *args)
    return None


@builtin(builtins.delattr)
def _delattr(tracer: Tracer, args, kwargs):
    obj, name = args
    if type(name) is not str:
        raise GraphBreak("delattr with a name that is not a constant string")
    semantics.delattr_(tracer, obj, name)
    return None


@builtin(builtins.abs)
def _abs(tracer: Tracer, args, kwargs):
    (v,) = args
    if isinstance(v, TensorVar):
        return tracer.call_graph("call_function", torch.abs, (v,))
    _constant_args("abs", args, kwargs)
    return abs(v)


def _minmax(fn):
    def handler(tracer: Tracer, args, kwargs):
        items = semantics.iterate(tracer, args[0]) if len(args) == 1 else list(args)
        if any(isinstance(v, TensorVar) for v in items):
            raise GraphBreak(f"{fn.__name__}() comparing tensors needs their values")
        _constant_args(fn.__name__, items, kwargs)
        if not kwargs and len(items) > 1 and all(type(v) in (int, torch.SymInt) for v in items) and any(
                isinstance(v, torch.SymInt) for v in items):   # as Dynamo: a symbolic max, no guard
            return functools.reduce(_SYM_MINMAX[fn], items)
        return fn(items, **kwargs)
    return handler


_SYM_MINMAX = {builtins.min: torch.sym_min, builtins.max: torch.sym_max}


BUILTINS[builtins.min] = _minmax(builtins.min)
BUILTINS[builtins.max] = _minmax(builtins.max)


@builtin(builtins.sum)
def _sum(tracer: Tracer, args, kwargs):
    items = semantics.iterate(tracer, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", 0)
    for v in items:
        total = semantics.binary(tracer, operator.add, total, v)
    return total


def _until_null(it: SymIter):
    while (v := it.next()) is not NULL:
        yield v


def _anyall(fn):
    def handler(tracer: Tracer, args, kwargs):
        it = args[0] if isinstance(args[0], SymIter) else SymIter(semantics.iterate(tracer, args[0]))
        return fn(semantics.truth(tracer, v) for v in _until_null(it))   # stops where Python does
    return handler


BUILTINS[builtins.any] = _anyall(builtins.any)
BUILTINS[builtins.all] = _anyall(builtins.all)


@builtin(builtins.super)
def _super(tracer: Tracer, args, kwargs):
    return objects.make_super(tracer, list(args))


@builtin(collections.deque)
def _deque(tracer: Tracer, args, kwargs):
    """A deque made while tracing holds symbolic items like a list (rebuilt by codegen)."""
    _constant_args("deque", args[1:], kwargs)
    return collections.deque(semantics.iterate(tracer, args[0]) if args else [], *args[1:], **kwargs)


@builtin(builtins.map)
def _map(tracer: Tracer, args, kwargs):
    """``map``'s results computed now (as generator expressions are): the order of calls is
    the consumer's as long as ``fn`` writes nothing the consumer reads in between."""
    fn, *iterables = args
    if any(unfinished(a) for a in iterables):
        return _lazy([a if isinstance(a, SymIter) else semantics.iterate(tracer, a) for a in iterables],
                     lambda vs: tracer.call(fn, vs, {}))
    columns = [semantics.iterate(tracer, it) for it in iterables]
    return SymIter([tracer.call(fn, list(items), {}) for items in zip(*columns)])


@builtin(builtins.filter)
def _filter(tracer: Tracer, args, kwargs):
    fn, iterable = args
    keep = (lambda v: semantics.truth(tracer, v)) if fn is None else (
        lambda v: semantics.truth(tracer, tracer.call(fn, [v], {})))
    if unfinished(iterable):
        return LazyIter(lambda: next((v for v in _until_null(iterable) if keep(v)), NULL))
    return SymIter([v for v in semantics.iterate(tracer, iterable) if keep(v)])


@builtin(tuple.__new__)
def _tuple_new(tracer: Tracer, args, kwargs):
    """``tuple.__new__(cls, items)`` (namedtuple's ``_make``): a real tuple of traced items."""
    cls = args[0]
    if kwargs or not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise GraphBreak("tuple.__new__ of something other than a tuple class")
    return tuple.__new__(cls, semantics.iterate(tracer, args[1]) if len(args) > 1 else ())
