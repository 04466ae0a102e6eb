"""Calls: which callee gets inlined, which becomes a graph op, which is pure Python.

The dispatch order is a short list of kinds; builtins and torch special cases live in
tables (``builtins_table.BUILTINS``, ``TORCH_SPECIAL``), not in if-chains.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import copyreg
import functools
import inspect
import math
import numbers
import operator
import os
import types

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from minicompile.capture.dynamic import concrete
from minicompile.capture.interp.frame import Frame, bind_arguments, is_generator, prescan
from minicompile.capture.interp.interpreter import BROKEN_GENERATORS, generator, run_frame
from minicompile.capture.interp.tracer import _DELETED, Tracer
from minicompile.capture.interp.variables import (NULL, GenContext, GenContextExit, GradModeCtx, GradModeExit,
                                                  GradModeFunction, GraphBreak, LazyIter, OpaqueValue, SymBoundMethod,
                                                  SymFunction, refuse_opaque,
                                                  TensorMethod, TensorVar, contains_symbolic)
from minicompile.capture.python import objects, semantics
from minicompile.capture.python.builtins_table import BUILTINS
from minicompile.capture.python.semantics import is_plain

MAX_INLINE_DEPTH = 32
# Classes of these modules are not user classes: calling one is not inlined as a constructor.
_LIBRARY_MODULES = ("builtins", "torch", "numpy", "collections", "functools", "itertools", "typing",
                    "threading", "contextvars", "enum", "abc", "re", "weakref")

# Tensor methods that only read metadata: their (non-tensor) result is specialized.
_META_METHODS = {"size", "dim", "ndimension", "stride", "numel", "nelement", "is_contiguous",
                 "element_size", "is_floating_point", "is_complex", "get_device", "type",
                 "__len__", "storage_offset", "is_signed"}
# Tensor methods whose result needs real data or touches autograd/runtime state.
_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "data_ptr", "backward", "register_hook", "retain_grad", "requires_grad_",
                 "__repr__", "__str__", "__format__", "equal", "untyped_storage", "storage"}
_TORCH_META_FUNCS = {torch.numel, torch.is_floating_point, torch.is_complex}

_MATH_FUNCS = {v for v in vars(math).values() if callable(v)}
_OPERATOR_FUNCS = {v for v in vars(operator).values() if callable(v)}
# Methods of builtin containers/strings that are safe to run on the traced copies.
_CONTAINER_METHODS = {
    list: {"append", "extend", "insert", "pop", "index", "count", "reverse", "copy", "clear", "remove"},
    dict: {"get", "items", "keys", "values", "update", "pop", "setdefault", "copy", "clear"},
    tuple: {"index", "count"},
    collections.deque: {"append", "appendleft", "pop", "popleft", "extend", "extendleft", "rotate", "clear",
                        "copy", "reverse", "insert"},
    collections.OrderedDict: {"get", "items", "keys", "values", "update", "pop", "setdefault", "copy",
                              "clear", "move_to_end", "popitem"},
    set: {"add", "discard", "remove", "pop", "clear", "update", "copy", "union", "intersection",
          "difference", "symmetric_difference", "issubset", "issuperset", "isdisjoint",
          "intersection_update", "difference_update", "symmetric_difference_update"},
}
# Immutable values whose builtin methods are pure functions of constants.
_CONSTANT_TYPES = {str, bytes, int, float, bool, complex, tuple, frozenset, range, slice, torch.Size,
                   torch.dtype, torch.device}
# Methods that put values into a set: a set only holds constants (tensors hash by identity).
_SET_INSERTS = {"add", "update", "union", "symmetric_difference", "symmetric_difference_update"}


def _torch_special():
    def const(value):
        return lambda tracer, args, kwargs: value
    return {
        torch.is_grad_enabled: lambda tracer, args, kwargs: tracer.grad_enabled,  # grad mode is always guarded
        torch.is_tensor: lambda tracer, args, kwargs: isinstance(args[0], TensorVar),
        torch.get_default_dtype: const(torch.get_default_dtype()),
        torch.jit.is_scripting: const(False),
        torch.jit.is_tracing: const(False),
        torch.compiler.is_compiling: const(True),
        torch.compiler.is_dynamo_compiling: const(True),   # library code takes its compile-friendly path
        torch.compiler.is_exporting: const(False),
        torch.fx._symbolic_trace.is_fx_tracing: const(False),
        torch._assert: _assert,
        torch.overrides.has_torch_function: _has_torch_function,
        torch.overrides.has_torch_function_unary: _has_torch_function,
        torch.overrides.has_torch_function_variadic: _has_torch_function,
        torch.no_grad: lambda tracer, args, kwargs: _grad_ctx(False, args, kwargs),
        torch.enable_grad: lambda tracer, args, kwargs: _grad_ctx(True, args, kwargs),
        nn.Module.__call__: _module_call_impl,   # super().__call__(...) in a module's own __call__
        nn.Module._call_impl: _module_call_impl,
    }


def _module_call_impl(tracer: Tracer, args, kwargs):
    if not args or not isinstance(args[0], nn.Module):
        raise GraphBreak("nn.Module.__call__ on something other than a module")
    return _module_forward(tracer, args[0], args[1:], kwargs)


def _has_torch_function(tracer: Tracer, args, kwargs) -> bool:
    """False for plain tensors and parameters (their types are guarded); a subclass breaks."""
    items = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    if any(isinstance(v, TensorVar) and v.cls not in (torch.Tensor, nn.Parameter) for v in items):
        raise GraphBreak("a tensor subclass with __torch_function__")
    return False


def _assert(tracer: Tracer, args, kwargs):
    """``torch._assert`` on a condition known while tracing (shapes, guarded values): removed when
    true; a break when false, so Python raises eager's AssertionError."""
    cond = args[0] if args else kwargs.get("condition")
    if isinstance(cond, TensorVar):
        raise GraphBreak("torch._assert on a tensor value (data-dependent)")
    if not semantics.truth(tracer, cond):
        raise GraphBreak("torch._assert fails here (raised in Python)")
    return None


def _grad_ctx(enabled: bool, args, kwargs) -> GradModeCtx:
    if args or kwargs:
        raise GraphBreak("grad-mode context manager with arguments")
    return GradModeCtx(enabled)


TORCH_SPECIAL = _torch_special()


def call(tracer: Tracer, fn, args: list, kwargs: dict):
    """The symbolic result of ``fn(*args, **kwargs)``: a callee only the tracer has, a builtin or
    torch special case of the tables, a torch op recorded in the graph, else Python run or inlined."""
    if isinstance(fn, _TRACER_CALLEES):
        return _call_tracer_value(tracer, fn, args, kwargs)
    if getattr(fn, "capture_cache", None) is not None:  # another compiled function: trace its body
        return call(tracer, fn.__wrapped__, args, kwargs)
    if type(fn).__dict__.get("is_capture_wrapper"):    # a CompiledModule: inline its module
        return call_module(tracer, fn.__dict__["_module"], args, kwargs)
    handler = _lookup(BUILTINS, fn)
    if handler is not None:
        return handler(tracer, args, kwargs)
    if objects.is_native_on_new(tracer, fn):
        return objects.native_method(tracer, fn, args, kwargs)
    handler = _lookup(TORCH_SPECIAL, fn)
    if handler is not None:
        return handler(tracer, args, kwargs)
    if isinstance(fn, nn.Module):
        return call_module(tracer, fn, args, kwargs)
    if getattr(fn, "__code__", None) is _CONTEXTLIB_WRAPPER:
        inner = _grad_decorated(fn)
        if inner is None:
            raise GraphBreak(f"call to {describe(fn)} (a function decorated with a torch context manager)")
        return call(tracer, GradModeFunction(*inner), args, kwargs)
    if getattr(fn, "__code__", None) is _CONTEXTMANAGER_HELPER:
        return _contextmanager(tracer, fn, args, kwargs)
    if fn is copy.deepcopy:
        return _deepcopy(tracer, args, kwargs)
    if fn is inspect.signature:
        return _signature(args, kwargs)
    if isinstance(fn, types.MethodType) and fn.__name__ == "apply" and isinstance(fn.__self__, type) \
            and issubclass(fn.__self__, torch.autograd.Function):
        return _function_apply(tracer, fn.__self__, args, kwargs)
    if is_torch_callable(fn):
        try:
            return tracer.call_graph("call_function", fn, tuple(args), kwargs,
                                     allow_constant_result=fn in _TORCH_META_FUNCS)
        except GraphBreak as e:
            if "returns a non-tensor value" not in e.reason:
                raise
            if isinstance(fn, types.FunctionType):   # a Python helper that computes no tensor
                return inline(tracer, fn, args, kwargs)   # (F._none_or_dtype): its body
            return _state_query(tracer, fn, args, kwargs, e)
    return _call_python(tracer, fn, args, kwargs)


# Callees made by the tracer (capture.variables, capture.objects), each handled by _call_tracer_value.
_TRACER_CALLEES = (TensorMethod, SymFunction, objects.TracerCall, SymBoundMethod, GradModeCtx, GradModeFunction,
                   GradModeExit, GenContextExit, TensorVar, OpaqueValue)


def _call_tracer_value(tracer: Tracer, fn, args: list, kwargs: dict):
    """A tensor's method, a traced function or bound method, a grad-mode context or decorated
    function, a with-block's exit; calling a tensor or a NumPy value's method is a break."""
    if isinstance(fn, TensorMethod):
        return call_tensor_method(tracer, fn, args, kwargs)
    if isinstance(fn, SymFunction):
        return inline(tracer, fn, args, kwargs)
    if isinstance(fn, objects.TracerCall):
        return fn.fn(tracer, args, kwargs)
    if isinstance(fn, SymBoundMethod):
        if fn.self_value is os.environ and fn.func.__name__ in _ENVIRON_READS:
            return _environ(tracer, fn.func.__name__, args)
        return call(tracer, fn.func, [fn.self_value, *args], kwargs)
    if isinstance(fn, GradModeCtx):   # `@torch.no_grad()` applied to a function
        if len(args) != 1 or kwargs or not isinstance(args[0], (SymFunction, types.FunctionType)):
            raise GraphBreak("calling a grad-mode context manager on something other than a function")
        return GradModeFunction(args[0], fn.enabled)
    if isinstance(fn, GradModeFunction):
        restore = tracer.grad_enabled
        tracer.set_grad(fn.enabled)
        result = call(tracer, fn.func, args, kwargs)
        tracer.set_grad(restore)
        return result
    if isinstance(fn, GradModeExit):  # leaving `with torch.no_grad():` normally
        tracer.set_grad(fn.restore)
        return None
    if isinstance(fn, GenContextExit):
        return _contextmanager_exit(fn, args)
    if isinstance(fn, TensorVar):
        raise GraphBreak("calling a tensor")
    raise GraphBreak(f"calling {fn.source}, a method of a NumPy value (its data is not traced)")   # OpaqueValue


def _call_python(tracer: Tracer, fn, args: list, kwargs: dict):
    """A Python function or method inlined; builtin methods of constants and containers, math
    and operator functions, and constructors of numbers, named tuples, sizes and user classes."""
    if isinstance(fn, types.FunctionType):
        return inline(tracer, fn, args, kwargs)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return call(tracer, fn.__func__, [fn.__self__, *args], kwargs)
    if type(fn) is functools.partial and tracer.source_of(fn) is not None:
        return _partial(tracer, fn, args, kwargs)
    if isinstance(fn, types.BuiltinMethodType) and type(fn.__self__) in _CONSTANT_TYPES and not contains_symbolic(
            (fn.__self__, args, kwargs)):
        # str.startswith, int.bit_length, ...: pure on constants; a size as its value ("{}".format(n))
        return fn(*concrete(args), **{k: concrete(v) for k, v in kwargs.items()})
    if isinstance(fn, types.BuiltinMethodType) and type(fn.__self__) in _CONTAINER_METHODS:
        return _container_method(tracer, fn, args, kwargs)
    if isinstance(fn, types.BuiltinMethodType) and fn.__self__ is dict and fn.__name__ == "fromkeys":
        return _fromkeys(tracer, args, kwargs)
    if fn in _MATH_FUNCS or fn in _OPERATOR_FUNCS:
        return _pure_or_graph(tracer, fn, args, kwargs)
    if isinstance(fn, type) and issubclass(fn, numbers.Number) and not contains_symbolic((args, kwargs)):
        return fn(*args, **kwargs)   # NumPy scalar types: numbers made from constants
    if isinstance(fn, type) and issubclass(fn, tuple) and hasattr(fn, "_fields"):
        return fn(*args, **kwargs)  # namedtuple construction holds symbolic values fine
    if (fn in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo) or _is_numpy_type_info(fn)) \
            and not contains_symbolic((args, kwargs)):
        return fn(*args, **kwargs)
    if isinstance(fn, type) and not fn.__module__.startswith(_LIBRARY_MODULES):
        return objects.instantiate(tracer, fn, args, kwargs)
    raise GraphBreak(f"call to {describe(fn)} is not supported by the tracer")


_PLAIN = (type(None), bool, int, float, str, torch.dtype)


def same_data(a, b) -> bool:
    """``a == b`` for plain data (constants, lists, tuples, dicts), types included (1 is not True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_data(a[k], b[k]) for k in a)
    return a == b


def _plain_data(v, depth: int = 0) -> bool:
    if type(v) in _PLAIN:
        return True
    if type(v) in (list, tuple) and depth < 4:
        return all(_plain_data(x, depth + 1) for x in v)
    return type(v) is dict and depth < 4 and all(type(k) in _PLAIN and _plain_data(x, depth + 1) for k, x in v.items())


def _default_copy(cls: type) -> bool:
    """Copied by Python's default protocol (``__reduce_ex__`` -> ``__dict__`` copied, no user code)."""
    return (cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is object.__getstate__ and not hasattr(cls, "__setstate__")
            and not hasattr(cls, "__deepcopy__") and cls not in copyreg.dispatch_table
            and "__slots__" not in cls.__dict__ and type(cls) is type)


def _deepcopy(tracer: Tracer, args, kwargs):
    """``copy.deepcopy(x)`` of plain data, or of an object whose state is plain data (HF's
    configs, copied by ``get_text_config``), read from a source or made in this trace: copied
    now, a new object of the trace. A source's state, which the copy depends on, is guarded
    (``same_data``), and this trace's writes to it apply."""
    obj = args[0] if len(args) == 1 and not kwargs else None
    if type(obj) in (list, tuple, dict) and _plain_data(obj):
        return copy.deepcopy(obj)   # its items are the trace's constants, guarded where read
    src = tracer.source_of(obj) if obj is not None else None
    state = getattr(obj, "__dict__", None)
    if not (src or tracer.is_new(obj)) or type(state) is not dict or not _default_copy(type(obj)) \
            or not _plain_data(state):
        raise GraphBreak(f"copy.deepcopy of {describe(obj)} (copied while tracing: plain data, or an object "
                         f"whose state is plain data)")
    if not tracer.is_new(obj):
        tracer.guards.add(f"{tracer.ns.const(same_data, 'same_data')}({src}.__dict__, "
                          f"{tracer.ns.const(copy.deepcopy(state), 'state')})")
    result = copy.deepcopy(obj)
    for (owner, name), written in tracer.attr_overlay.items():
        if owner != id(obj):
            continue
        if written is _DELETED:
            result.__dict__.pop(name, None)
        elif _plain_data(written):
            result.__dict__[name] = copy.deepcopy(written)
        else:
            raise GraphBreak(f"copy.deepcopy of {describe(obj)} after this trace wrote a non-constant to it")
    tracer.add_new(result)
    return result


class FunctionCtx:
    """The ``ctx`` a custom autograd.Function's forward gets where no backward can be needed."""

    def save_for_backward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _function_apply(tracer: Tracer, cls: type, args, kwargs):
    """``MyFunction.apply(...)`` (BLOOM's GeLUFunction) where nothing requires grad: its
    ``forward`` inlined, run with grad off as ``apply`` runs it; with inputs that require grad
    its backward would be needed: a break."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, TensorVar)]
    if tracer.grad_enabled and any(v.fake.requires_grad for v in tensors):
        raise GraphBreak(f"{cls.__name__}.apply on tensors that require grad (its backward is not traced)")
    forward = inspect.getattr_static(cls, "forward")
    if not isinstance(forward, staticmethod) or not isinstance(forward.__func__, types.FunctionType):
        raise GraphBreak(f"{cls.__name__}.forward is not a Python staticmethod")
    if cls.setup_context is not torch.autograd.function._SingleLevelFunction.setup_context:
        raise GraphBreak(f"{cls.__name__} has a separate setup_context")
    ctx = objects.instantiate(tracer, FunctionCtx, [], {})
    restore = tracer.grad_enabled
    tracer.set_grad(False)
    result = call(tracer, forward.__func__, [ctx, *args], kwargs)
    tracer.set_grad(restore)
    return result


def _partial(tracer: Tracer, fn: functools.partial, args, kwargs):
    """A ``functools.partial`` read from a source (HF's ``self.act = partial(F.gelu, ...)``): its
    function, arguments and keywords read through that source, then called as Python would."""
    src = tracer.source_of(fn)
    func = tracer.wrap(fn.func, f"{src}.func")
    bound = tracer.wrap(fn.args, f"{src}.args")
    keywords = tracer.wrap(fn.keywords, f"{src}.keywords")
    return call(tracer, func, [*bound, *args], {**keywords, **kwargs})


def _is_numpy_type_info(fn) -> bool:
    """``np.finfo``/``np.iinfo``: constants of a dtype, as torch.finfo (no NumPy import here)."""
    return isinstance(fn, type) and fn.__module__.split(".")[0] == "numpy" and fn.__name__ in ("finfo", "iinfo")


_CONTEXTLIB_WRAPPER = torch.no_grad()(lambda: None).__code__   # torch.utils._contextlib's wrapper


def _grad_decorated(fn):
    """(function, grad enabled) for a function decorated with ``@torch.no_grad()`` or
    ``@torch.enable_grad()`` (torch.utils._contextlib's wrapper), else None."""
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return None
    cells = dict(zip(code.co_freevars, fn.__closure__))
    try:
        factory, func = cells["ctx_factory"].cell_contents, cells["func"].cell_contents
    except (KeyError, ValueError):
        return None
    kind = type(getattr(factory, "__self__", None))
    if kind not in (torch.no_grad, torch.enable_grad) or not isinstance(func, types.FunctionType):
        return None
    return func, kind is torch.enable_grad


_CONTEXTMANAGER_HELPER = contextlib.contextmanager(lambda: None).__code__


def _contextmanager(tracer: Tracer, fn, args, kwargs) -> GenContext:
    """``cm(...)`` for ``cm`` decorated with ``@contextlib.contextmanager``: the generator of the
    function it wraps (held in the helper's closure), entered by BEFORE_WITH."""
    func = dict(zip(fn.__code__.co_freevars, fn.__closure__))["func"].cell_contents
    gen = call(tracer, func, list(args), kwargs)
    if not isinstance(gen, LazyIter):
        raise GraphBreak(f"contextmanager over {describe(func)}, which is not a generator function")
    gen.managed = True
    return GenContext(gen, fn, list(args), dict(kwargs))


def _contextmanager_exit(fn: GenContextExit, args):
    """Leaving the with-block normally: the generator runs past its yield and must stop there."""
    if any(a is not None for a in args):
        raise GraphBreak("contextmanager __exit__ with an exception")
    if fn.gen.next() is not NULL:
        raise GraphBreak("RuntimeError: generator didn't stop (contextmanager)")
    return False


_ENVIRON_READS = ("get", "__getitem__", "__contains__")


def _environ(tracer: Tracer, method: str, args):
    """A read of ``os.environ``: the value now, guarded (a changed variable recompiles)."""
    key = args[0] if args else None
    if type(key) is not str:
        raise GraphBreak("os.environ read with a non-constant key")
    value = os.environ.get(key)
    tracer.guards.add(f"{tracer.const_source(os.environ, 'environ')}.get({key!r}) == {value!r}")
    if method == "__contains__":
        return value is not None
    if value is None and method == "__getitem__":
        raise GraphBreak(f"KeyError: {key!r} (os.environ)")
    return value if value is not None else (args[1] if len(args) > 1 else None)


def _signature(args, kwargs):
    """``inspect.signature`` of a function the tracer holds as a real object: a function of its
    code and defaults, which identity guards keep fixed, so it is computed now."""
    target = args[0] if args else None
    if isinstance(target, SymBoundMethod) and isinstance(target.func, types.FunctionType) \
            and not contains_symbolic(target.self_value):
        target = types.MethodType(target.func, target.self_value)
    if not callable(target) or contains_symbolic((target, args[1:], kwargs)):
        raise GraphBreak("inspect.signature of a function made while tracing")
    return inspect.signature(target, *args[1:], **kwargs)


_QUERY_PREFIXES = ("is_", "_is_", "get_", "_get_", "has_", "_has_", "are_")
_QUERY_RESULTS = (bool, int, float, str, type(None), torch.dtype)


def _state_query(tracer: Tracer, fn, args, kwargs, why: GraphBreak):
    """A torch query of global state with constant arguments (``torch.is_autocast_enabled()``,
    ``torch._C._get_mha_fastpath_enabled()``): read now and guarded, as grad mode is."""
    name = getattr(fn, "__name__", "")
    if not name.startswith(_QUERY_PREFIXES) or contains_symbolic((args, kwargs)) or not all(
            type(a) in _QUERY_RESULTS for a in (*args, *kwargs.values())):
        raise why
    value = fn(*args, **kwargs)
    if type(value) not in _QUERY_RESULTS:
        raise why
    call_args = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    tracer.guards.add(f"{tracer.const_source(fn, 'query')}({call_args}) == {value!r}")
    return value


def _lookup(table: dict, fn):
    try:
        return table.get(fn)
    except TypeError:  # unhashable callables
        return None


def describe(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    mod = getattr(fn, "__module__", None)
    return f"{mod}.{name}" if mod and mod != "builtins" else f"{name}"


def is_torch_callable(fn) -> bool:
    if isinstance(fn, type):
        return False
    objclass = getattr(fn, "__objclass__", None)
    if objclass is not None and objclass in (torch._C.TensorBase, torch.Tensor):
        return True
    mod = getattr(fn, "__module__", None) or ""
    if isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)) or type(fn).__name__ in (
            "builtin_function_or_method", "function", "_OpNamespace", "OpOverloadPacket", "OpOverload"):
        return mod.startswith("torch") and not mod.startswith(("torch.nn.modules", "torch.fx"))
    return False


def call_tensor_method(tracer: Tracer, m: TensorMethod, args, kwargs):
    name = m.name
    if name in _DATA_METHODS:
        raise GraphBreak(f"Tensor.{name}() needs the tensor's data (graph break)")
    return tracer.call_graph("call_method", name, (m.tensor, *args), kwargs,
                             allow_constant_result=name in _META_METHODS)


def _has_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None)
                or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
                or nn_module._global_backward_hooks)


def class_call(cls: type):
    """``cls.__call__`` as the class stores it: a plain function is a method; anything else
    (staticmethod, partialmethod, a C callable) binds in its own way."""
    for k in cls.__mro__:
        if "__call__" in k.__dict__:
            return k.__dict__["__call__"]
    return None


def call_module(tracer: Tracer, m: nn.Module, args, kwargs):
    """``m(*args, **kwargs)``: a class's own ``__call__`` (in Python) is inlined, and reaches
    ``nn.Module.__call__`` through ``super().__call__``, which runs ``forward``."""
    override = class_call(type(m))
    if override is not nn.Module.__call__:
        if isinstance(override, staticmethod):
            return call(tracer, override.__func__, list(args), kwargs)
        if not isinstance(override, types.FunctionType):
            raise GraphBreak(f"module {type(m).__name__} overrides __call__ with {describe(override)}")
        return inline(tracer, override, [m, *args], kwargs)
    return _module_forward(tracer, m, args, kwargs)


def _module_forward(tracer: Tracer, m: nn.Module, args, kwargs):
    """``nn.Module.__call__(m, ...)``: ``forward`` (hooks are not traced: a break)."""
    if _has_hooks(m):
        raise GraphBreak(f"module {type(m).__name__} has hooks (they are not traced)")
    forward = m.__dict__.get("forward")
    if forward is None:
        forward = type(m).forward
        return call(tracer, forward, [m, *args], kwargs)
    return call(tracer, forward, list(args), kwargs)


def inline(tracer: Tracer, fn, args: list, kwargs: dict):
    """Run a Python function's bytecode in a child frame of the same trace."""
    depth = tracer.frames[-1].depth + 1 if tracer.frames else 1
    if depth > MAX_INLINE_DEPTH:
        raise GraphBreak(f"call depth over {MAX_INLINE_DEPTH} (recursion?)")
    if isinstance(fn, SymFunction):
        code, globals_, name = fn.code, fn.globals, fn.name
        defaults, kwdefaults, closure = fn.defaults, fn.kwdefaults, fn.closure
    else:
        code, globals_, name = fn.__code__, fn.__globals__, fn.__qualname__
        defaults, kwdefaults, closure = fn.__defaults__, fn.__kwdefaults__, fn.__closure__ or ()
        src = tracer.source_of(fn)
        if src is not None:  # defaults are state of the function object: read them as inputs
            defaults = tracer.wrap(defaults, f"{src}.__defaults__") if defaults else defaults
            kwdefaults = tracer.wrap(kwdefaults, f"{src}.__kwdefaults__") if kwdefaults else kwdefaults
    reason = prescan(code, inlined=True)
    if reason:
        raise GraphBreak(f"{reason} in {name}()")
    try:
        bound = bind_arguments(code, defaults, kwdefaults, args, kwargs)
    except TypeError as e:
        raise GraphBreak(f"TypeError calling {name}(): {e}") from None
    cells = dict(zip(code.co_freevars, closure))
    frame = Frame(tracer, code, globals_, bound, cells, depth)
    if is_generator(code):
        if code in BROKEN_GENERATORS or code in tracer.forced_breaks:
            raise GraphBreak(tracer.forced_breaks.get(code) or f"generator function {name}() breaks when inlined "
                                                               "(it runs in Python)")
        return generator(frame, cleanup=any(i.opname == "PUSH_EXC_INFO" for i in frame.insts))
    return run_frame(frame)


def _container_method(tracer: Tracer, fn, args, kwargs):
    owner = fn.__self__
    if fn.__name__ not in _CONTAINER_METHODS[type(owner)]:
        raise GraphBreak(f"{type(owner).__name__}.{fn.__name__}() on a traced container")
    if fn.__name__ in ("index", "count", "remove") and args:
        for item in owner:   # the comparisons Python makes; a tensor's truth is a break
            if semantics.item_equal(item, args[0]) and fn.__name__ != "count":
                break
    if type(owner) is set and fn.__name__ in _SET_INSERTS and contains_symbolic((args, kwargs)):
        raise GraphBreak("a set holding tensors or traced objects")
    result = fn(*args, **kwargs)
    if type(result) in semantics.DICT_VIEWS:
        tracer.register_view(result, owner, fn.__name__)   # live: later writes to owner show
    return result


def _fromkeys(tracer: Tracer, args, kwargs):
    keys = semantics.iterate(tracer, args[0]) if args else []
    if contains_symbolic(keys):
        raise GraphBreak("dict.fromkeys with tensor keys")
    return dict.fromkeys(keys, *args[1:], **kwargs)


def _pure_or_graph(tracer: Tracer, fn, args, kwargs):
    refuse_opaque(describe(fn), *args, *kwargs.values())
    if any(isinstance(a, TensorVar) for a in args):
        if fn in _MATH_FUNCS:
            raise GraphBreak(f"math.{fn.__name__} on a tensor needs its value")
        return tracer.call_graph("call_function", fn, tuple(args), kwargs)
    if all(is_plain(a) or isinstance(a, nn.Module) for a in args) and not contains_symbolic((args, kwargs)):
        return fn(*args, **kwargs)
    if fn in (operator.getitem, operator.setitem, operator.contains):
        if fn is operator.getitem:
            return semantics.subscr(tracer, *args)
        if fn is operator.setitem:
            return semantics.store_subscr(tracer, *args)
        return semantics.contains(tracer, args[1], args[0])
    raise GraphBreak(f"{describe(fn)} on symbolic values")


__all__ = ["call", "inline", "call_module", "class_call", "describe"]
