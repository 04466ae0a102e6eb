"""What Python operations mean on symbolic values: operators, truth, iteration, subscripts
and attributes. Opcode handlers and builtin handlers both call into here.
"""
from __future__ import annotations

import collections
import collections.abc
import inspect
import numbers
import operator
import types

import torch
from torch import nn

from minicompile.capture.interp.tracer import Tracer, is_stable_module
from minicompile.capture.interp.variables import (NULL, GradModeExit, GraphBreak, MissingAttribute, OpaqueValue, ScalarVar,
                                                  SymBoundMethod, SymCell,
                                                  SymFunction, SymIter, TensorMethod, TensorVar, contains_symbolic,
                                                  refuse_opaque)
from minicompile.capture.python import objects

BINARY_OPS = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv, "<<=": operator.ilshift,
    "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod, "|=": operator.ior,
    "**=": operator.ipow, ">>=": operator.irshift, "-=": operator.isub, "/=": operator.itruediv,
    "^=": operator.ixor,
}
# ``n += t`` on a Python number is ``n + t`` (numbers are immutable); a graph node
# ``operator.iadd(0, t)`` would print as ``0 += t``, which is no Python.
_OUT_OF_PLACE = {fn: BINARY_OPS[sym[:-1]] for sym, fn in BINARY_OPS.items() if sym.endswith("=")}
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}
_COMPARES = set(COMPARE_OPS.values())


_OD = collections.OrderedDict()
DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()),
              type(_OD.keys()), type(_OD.values()), type(_OD.items()))
# Containers traced as copies that hold symbolic values (their subclasses are objects).
DICT_TYPES = (dict, collections.OrderedDict)
MUTABLE_CONTAINERS = (list, dict, collections.OrderedDict, collections.deque)
# ``__getitem__`` implementations that only read storage: safe to run on the real object.
_STORAGE_GETITEM = {dict.__getitem__, list.__getitem__, tuple.__getitem__}
_PLAIN = (types.MappingProxyType, collections.deque, int, float, bool, complex, str, bytes, type(None), tuple, list, dict, set, frozenset,
          slice, range, torch.Size, torch.dtype, torch.device, torch.layout, type, *DICT_VIEWS,
          torch.SymInt, torch.SymFloat, torch.SymBool)   # symbolic sizes: Python ops on them guard

# Tensor attributes that are pure metadata: read from the fake tensor, specialized, and
# kept valid by the tensor guards (dtype, device, shape, strides, requires_grad).
_TENSOR_META = {
    "shape": lambda f: f.shape,
    "dtype": lambda f: f.dtype,
    "device": lambda f: f.device,
    "ndim": lambda f: f.dim(),
    "requires_grad": lambda f: f.requires_grad,
    "is_cuda": lambda f: f.device.type == "cuda",
    "is_cpu": lambda f: f.device.type == "cpu",
    "layout": lambda f: f.layout,
    "is_sparse": lambda f: False,
    "is_quantized": lambda f: False,
    "is_nested": lambda f: False,
}
# Tensor attributes that produce a new tensor: recorded as graph ops.
_TENSOR_VIEW_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}


def is_record(v) -> bool:
    """A namedtuple or a structseq (``torch.return_types.max``): a tuple with named fields."""
    return isinstance(v, tuple) and (hasattr(type(v), "_fields") or hasattr(type(v), "n_fields"))


def is_plain(v) -> bool:
    return isinstance(v, (*_PLAIN, numbers.Number))   # numbers include NumPy scalars


_opaque = refuse_opaque
# Operators whose result with a tensor and a Python float the graph computes exactly from a
# 0-d float64 tensor in the float's place (same dtype, same kernel arithmetic).
_SCALAR_GRAPH_OPS = {operator.add, operator.sub, operator.mul, operator.truediv, *_COMPARES}


def _scalar_binary(tracer: Tracer, fn, a, b):
    """``tensor <op> v`` (or ``v <op> tensor``) for an unspecialised float ``v`` (ScalarVar)."""
    scalar, other = (a, b) if isinstance(a, ScalarVar) else (b, a)
    plain = _OUT_OF_PLACE.get(fn, fn)
    if plain not in _SCALAR_GRAPH_OPS or not isinstance(other, TensorVar) or other.fake.dtype.is_complex:
        refuse_opaque(f"operator {fn.__name__}", scalar)
    operand = scalar.tensor
    if not other.fake.dtype.is_floating_point:   # int/bool tensor with a float: the default dtype
        operand = tracer.call_graph("call_method", "to", (operand, torch.get_default_dtype()))
    if scalar is a and plain is operator.truediv:   # Tensor.__rtruediv__: reciprocal, then multiply
        other, plain = tracer.call_graph("call_function", torch.reciprocal, (other,)), operator.mul
    op = fn if isinstance(a, TensorVar) else plain   # ``t += v`` stays in place; ``v += t`` does not
    result = tracer.call_graph("call_function", op, (operand, other) if scalar is a else (other, operand))
    if plain not in _COMPARES and result.fake.dtype != torch.result_type(other.fake, 0.5):
        refuse_opaque(f"operator {fn.__name__}", scalar)
    return result


def binary(tracer: Tracer, fn, a, b):
    if isinstance(a, ScalarVar) or isinstance(b, ScalarVar):
        return _scalar_binary(tracer, fn, a, b)
    _opaque(f"operator {fn.__name__}", a, b)
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        if not isinstance(a, TensorVar) and isinstance(a, numbers.Number):
            fn = _OUT_OF_PLACE.get(fn, fn)
        return tracer.call_graph("call_function", fn, (a, b))
    if fn in _COMPARES and (contains_symbolic(a) or contains_symbolic(b)):
        raise GraphBreak(f"comparing containers that hold tensors ({fn.__name__})")
    python_op = objects.python_container(a) or objects.python_container(b)   # Counter + Counter: in Python
    if not python_op and ((is_plain(a) and is_plain(b)) or (
            fn in (operator.eq, operator.ne) and _default_eq(a) and _default_eq(b))):
        return fn(a, b)
    raise GraphBreak(f"operator {fn.__name__} on {type(a).__name__} and {type(b).__name__}")


def _default_eq(v) -> bool:
    return type(v).__eq__ is object.__eq__ or isinstance(v, (nn.Module, types.FunctionType))


def unary(tracer: Tracer, fn, v):
    _opaque(f"unary {fn.__name__}", v)
    if isinstance(v, TensorVar):
        if fn is operator.not_:
            raise GraphBreak("`not tensor` needs the tensor's value (data-dependent)")
        return tracer.call_graph("call_function", fn, (v,))
    if fn is operator.not_:
        return not truth(tracer, v)
    if isinstance(v, (int, float, complex, bool, torch.SymInt, torch.SymFloat)):
        return fn(v)
    raise GraphBreak(f"unary {fn.__name__} on {type(v).__name__}")


def truth(tracer: Tracer, v) -> bool:
    _opaque("truth value", v)
    if isinstance(v, TensorVar):
        raise GraphBreak("data-dependent control flow: branching on a tensor value")
    if isinstance(v, (SymFunction, SymBoundMethod, TensorMethod, SymCell, GradModeExit)):
        return True
    if isinstance(v, SymIter):
        return True
    if is_plain(v) or isinstance(v, (nn.Module, types.FunctionType, types.ModuleType,
                                     types.BuiltinFunctionType, types.MethodType)):
        return bool(v)
    cls = type(v)
    if getattr(cls, "__bool__", None) is None and getattr(cls, "__len__", None) is None:
        return True
    for method, kind in (("__bool__", bool), ("__len__", int)):   # Python asks __bool__, then __len__
        fn = inspect.getattr_static(cls, method, None)
        if isinstance(fn, types.FunctionType):   # written in Python: inlined
            result = tracer.call(fn, [v], {})
            if type(result) is not kind:
                raise GraphBreak(f"{cls.__name__}.{method} returned a {type(result).__name__}")
            return bool(result)
        if fn is not None:
            break
    if tracer.is_new(v):
        return bool(v)   # a builtin base's length: how many items the traced object holds
    raise GraphBreak(f"truth value of a {cls.__name__} runs user code (__bool__/__len__)")


def identity(a, b) -> bool:
    """``a is b``: one real object is one symbolic value (aliases are guarded), except that two
    opaque values from different sources may be one object on a later call."""
    if a is not b and isinstance(a, OpaqueValue) and isinstance(b, OpaqueValue):
        raise GraphBreak("`is` between two NumPy values (their identity is not guarded)")
    return a is b


# Types ``v`` for which ``tensor == v`` is False: Tensor.__eq__ refuses them and Python falls back
# to identity. A number, array or tensor compares elementwise.
_NEVER_EQUAL_TO_TENSORS = {str, bytes, type(None), tuple, list, dict, set, frozenset, type, torch.Size}


def item_equal(x, item) -> bool:
    """``x is item or x == item`` as ``in``, ``list.count``/``index``/``remove`` test an item:
    a tensor compared with a number or tensor is an elementwise tensor whose truth raises or
    needs its data, so that comparison is a break (Python runs it)."""
    if x is item:
        return True
    if isinstance(x, TensorVar) or isinstance(item, TensorVar):
        other = item if isinstance(x, TensorVar) else x
        if type(other) in _NEVER_EQUAL_TO_TENSORS:
            return False
        raise GraphBreak(f"comparing a tensor with a {type(other).__name__} in a container test "
                         "(its truth needs the tensor's data)")
    return x == item


def contains(tracer: Tracer, item, container) -> bool:
    if isinstance(container, TensorVar):
        raise GraphBreak("`x in tensor` needs the tensor's values (data-dependent)")
    if isinstance(container, nn.ModuleDict):
        return item in container._modules
    if isinstance(container, (str, bytes)):
        if not isinstance(item, (str, bytes)):
            raise GraphBreak(f"`in` on a string with a {type(item).__name__}")
        return item in container   # a substring test, not a test over characters
    if isinstance(container, DICT_VIEWS) and not contains_symbolic(item):
        return item in container
    if isinstance(container, (tuple, list, collections.deque, set, frozenset, range, *DICT_VIEWS)):
        return any(item_equal(x, item) for x in container)
    if isinstance(container, dict):
        return item in container
    hook = inspect.getattr_static(type(container), "__contains__", None)
    if isinstance(hook, types.FunctionType) and not isinstance(container, nn.Module):
        return truth(tracer, tracer.call(hook, [container, item], {}))
    raise GraphBreak(f"`in` on {type(container).__name__}")


# ---------------------------------------------------------------------- iteration
def iterate(tracer: Tracer, v) -> list:
    """The items ``for x in v`` would produce, computed now (loops are unrolled)."""
    if isinstance(v, (tuple, list, collections.deque)):
        return list(v)
    if isinstance(v, dict):
        return list(v.keys())
    if isinstance(v, (range, str, bytes, set, frozenset, *DICT_VIEWS)):
        return list(v)
    if isinstance(v, SymIter):
        items = v.remaining()
        v.pos = len(v.items)
        return items
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            raise GraphBreak("iteration over a 0-d tensor")
        return list(tracer.call_graph("call_method", "unbind", (v, 0)))
    if isinstance(v, (nn.ModuleList, nn.Sequential)):
        return [child_module(tracer, v, name) for name in v._modules]
    if isinstance(v, nn.ModuleDict):
        return list(v._modules.keys())
    if isinstance(v, nn.ParameterList):
        return [module_attr(tracer, v, name) for name in v._parameters]
    return _sequence_items(tracer, v)


def _sequence_items(tracer: Tracer, v) -> list:
    """A ``collections.abc.Sequence`` that keeps the inherited ``__iter__`` (``self[i]`` until
    IndexError) with ``__len__``/``__getitem__`` in Python: its ``len()`` items by index."""
    cls = type(v)
    length, getitem = (inspect.getattr_static(cls, m, None) for m in ("__len__", "__getitem__"))
    if inspect.getattr_static(cls, "__iter__", None) is not collections.abc.Sequence.__iter__ or not (
            isinstance(length, types.FunctionType) and isinstance(getitem, types.FunctionType)):
        raise GraphBreak(f"iteration over a {cls.__name__}")
    n = tracer.call(length, [v], {})
    if type(n) is not int:
        raise GraphBreak(f"len() of a {cls.__name__} is not a constant")
    return [tracer.call(getitem, [v, i], {}) for i in range(n)]


# ---------------------------------------------------------------------- subscripts
def subscr(tracer: Tracer, obj, key):
    if isinstance(obj, TensorVar):
        if isinstance(key, torch.SymInt):   # as Dynamo: select keeps the index symbolic, [] guards its value
            return tracer.call_graph("call_method", "select", (obj, 0, key))
        return tracer.call_graph("call_function", operator.getitem, (obj, key))
    if isinstance(key, TensorVar):
        raise GraphBreak(f"indexing a {type(obj).__name__} with a tensor (data-dependent)")
    if type(obj) in (tuple, list, str, bytes, range, torch.Size, collections.deque) or is_record(obj):
        return obj[key]
    if type(obj) in DICT_TYPES:
        if key not in obj:
            raise GraphBreak(f"KeyError: {key!r}")
        return obj[key]
    if isinstance(obj, (tuple, list, dict)):
        return _subclass_item(tracer, obj, key)
    if isinstance(obj, (nn.ModuleList, nn.Sequential)):
        names = list(obj._modules)
        if isinstance(key, int):
            return child_module(tracer, obj, names[key])
        if isinstance(key, slice):
            result = obj[key]
            for name in names[key]:
                child_module(tracer, obj, name)  # gives the children sources for guards
            return result
    if isinstance(obj, nn.ModuleDict) and isinstance(key, str):
        return child_module(tracer, obj, key)
    if isinstance(obj, (nn.ParameterList, nn.ParameterDict)):
        name = str(key) if isinstance(obj, nn.ParameterList) else key
        return module_attr(tracer, obj, name)
    hook = inspect.getattr_static(type(obj), "__getitem__", None)
    if isinstance(hook, types.FunctionType) and not isinstance(obj, nn.Module):
        return tracer.call(hook, [obj, key], {})
    raise GraphBreak(f"subscript of a {type(obj).__name__}")


def _subclass_item(tracer: Tracer, obj, key):
    """``obj[key]`` on a real tuple/list/dict subclass (an HF ModelOutput): a Python
    ``__getitem__`` is inlined; the builtin one reads the item as an input, with a source."""
    getitem = getattr(type(obj), "__getitem__")
    if isinstance(getitem, types.FunctionType):
        return tracer.call(getitem, [obj, key], {})
    if tracer.is_new(obj):
        return objects.native_method(tracer, getitem.__get__(obj), [key], {})
    src = tracer.source_of(obj)
    if getitem not in _STORAGE_GETITEM or src is None or type(key) not in (int, str):
        raise GraphBreak(f"subscript of a {type(obj).__name__}")
    return tracer.wrap(obj[key], f"{src}[{key!r}]")   # a KeyError is a break, raised in Python


def store_subscr(tracer: Tracer, obj, key, value) -> None:
    if isinstance(obj, TensorVar):
        tracer.call_graph("call_function", operator.setitem, (obj, key, value), mutates=True)
        return
    if isinstance(key, TensorVar):
        raise GraphBreak("storing into a container with a tensor key")
    if type(obj) in MUTABLE_CONTAINERS:
        obj[key] = value  # traced on a copy; tracked input containers are replayed afterwards
        return
    setitem = inspect.getattr_static(type(obj), "__setitem__", None)
    if isinstance(setitem, types.FunctionType) and not isinstance(obj, nn.Module):
        tracer.call(setitem, [obj, key, value], {})
        return
    if tracer.is_new(obj) and setitem is not None:
        objects.native_method(tracer, setitem.__get__(obj), [key, value], {})
        return
    raise GraphBreak(f"item assignment on a {type(obj).__name__}")


def delete_subscr(tracer: Tracer, obj, key) -> None:
    if type(obj) in MUTABLE_CONTAINERS and not isinstance(key, TensorVar):
        del obj[key]
        return
    raise GraphBreak(f"del on a {type(obj).__name__} item")


# ---------------------------------------------------------------------- attributes
def child_module(tracer: Tracer, parent: nn.Module, name: str):
    return module_attr(tracer, parent, name)


def _obj_source(tracer: Tracer, obj) -> str:
    return tracer.source_of(obj) or tracer.const_source(obj, "obj")


def module_attr(tracer: Tracer, m: nn.Module, name: str):
    over = tracer.overlay(m, name)
    if over is not NULL:
        return over
    src = _obj_source(tracer, m)
    d = m.__dict__
    for table in ("_parameters", "_buffers", "_modules"):
        if name in d.get(table, ()):
            var = tracer.wrap(d[table][name], f"{src}.{table}[{name!r}]")
            if table != "_modules" and isinstance(var, TensorVar) and var.node.op == "placeholder":
                var.node.meta["static_input"] = True  # what is computed from it alone is cached (cpu/prepare.py)
            return var
    if name in d:
        return tracer.wrap(d[name], f"{src}.{name}")
    return class_attr(tracer, m, name, src)


def class_attr(tracer: Tracer, obj, name: str, src: str):
    try:
        attr = inspect.getattr_static(type(obj), name)
    except AttributeError:
        hook = inspect.getattr_static(type(obj), "__getattr__", None)
        if isinstance(hook, types.FunctionType) and not isinstance(obj, nn.Module):
            return tracer.call(hook, [obj, name], {})   # the attribute is missing: __getattr__ runs
        if hook is not None and not isinstance(obj, nn.Module):
            raise GraphBreak(f"{type(obj).__name__}.__getattr__ runs user code") from None
        _missing(tracer, obj, name, src)
    if (bound := objects.bind_python_attr(tracer, obj, attr, name)) is not objects.UNBOUND:
        return bound
    getter = inspect.getattr_static(type(attr), "__get__", None)
    if isinstance(getter, types.FunctionType):   # a Python descriptor: its __get__ is traced
        return tracer.call(getter, [attr, obj, type(obj)], {})
    if hasattr(type(attr), "__get__") and not isinstance(attr, (int, float, str, bool, tuple)):
        try:
            value = getattr(obj, name)  # slots, C getsets: read the real value, guard it
        except AttributeError:   # an unset slot
            _missing(tracer, obj, name, src)
        return tracer.wrap(value, f"{src}.{name}")
    if isinstance(getattr(obj, "__dict__", None), dict):
        # a later instance attribute of the same name would shadow this class attribute
        tracer.guards.add(f"{name!r} not in {src}.__dict__")
    return tracer.wrap(attr, f"type({src}).{name}")


def _missing(tracer: Tracer, obj, name: str, src: str | None):
    """``obj.name`` raises AttributeError: guard that it still does on later calls (the object
    is the same type, or the same object, but an attribute may be set on it later)."""
    if src is not None and not tracer.is_new(obj):
        tracer.guards.add(f"not hasattr({src}, {name!r})", kind="HASATTR", what=src, check=f"has no {name!r}")
    raise MissingAttribute(f"AttributeError: {type(obj).__name__} has no attribute {name!r}")


def _read(obj, name: str):
    """``getattr(obj, name)`` of an object whose attributes are fixed by its guards (a constant,
    a class, a library module): an AttributeError is Python's answer, not a tracer gap."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise MissingAttribute(f"AttributeError: {type(obj).__name__} has no attribute {name!r}") from None


def getattr_(tracer: Tracer, obj, name: str, hooks: bool = True):
    if isinstance(obj, TensorVar):
        return tensor_attr(tracer, obj, name)
    _opaque(f"attribute {name!r}", obj)
    over = tracer.overlay(obj, name)
    if over is not NULL:
        return over
    if tracer.is_new(obj):
        hook = inspect.getattr_static(type(obj), "__getattribute__", None) if hooks else None
        if isinstance(hook, types.FunctionType):   # a Python __getattribute__ decides: inline it
            return tracer.call(hook, [obj, name], {})
        return objects.new_attr(tracer, obj, name)
    if type(obj) is super:
        return objects.super_attr(tracer, obj, name)
    if isinstance(obj, nn.Module):
        return module_attr(tracer, obj, name)
    if isinstance(obj, types.ModuleType):
        if not hasattr(obj, name):
            _missing(tracer, obj, name, None if is_stable_module(obj) else _obj_source(tracer, obj))
        value = getattr(obj, name)
        if is_stable_module(obj):
            if isinstance(value, torch.Tensor):
                raise GraphBreak(f"tensor global {obj.__name__}.{name}")
            return value
        return tracer.wrap(value, f"{_obj_source(tracer, obj)}.{name}")
    if isinstance(obj, type):
        if not hasattr(obj, name):
            _missing(tracer, obj, name, _obj_source(tracer, obj))
        value = getattr(obj, name)
        if isinstance(value, torch.Tensor) or type(value) in _GUARDED_CLASS_ATTRS:
            # tensors are inputs, constants are guarded, containers are traced on copies
            return tracer.wrap(value, f"{_obj_source(tracer, obj)}.{name}")
        return value
    if is_record(obj) and name not in getattr(type(obj), "_fields", ()):
        method = inspect.getattr_static(type(obj), name, None)
        if isinstance(method, (types.FunctionType, classmethod)) and contains_symbolic(obj):
            # a Python method of a namedtuple holding traced values (``_replace``): inlined,
            # never a real bound method that would carry the traced values out of the trace
            return objects.bind_class_attr(tracer, obj, method, name)
    if type(obj) in _PLAIN_ATTR_TYPES or isinstance(obj, torch.Size) or is_record(obj) and (
            name in getattr(type(obj), "_fields", ()) or not hasattr(obj, "__dict__")):
        return _read(obj, name)   # (a subclass's attributes are read as an object's)
    if isinstance(obj, _FUNCTIONS):
        return _function_attr(tracer, obj, name)
    if isinstance(obj, (SymIter, SymCell, TensorMethod, GradModeExit)) or obj is NULL:
        raise GraphBreak(f"attribute {name} of {type(obj).__name__}")
    hook = inspect.getattr_static(type(obj), "__getattribute__", None) if hooks else None
    if isinstance(hook, types.FunctionType):   # a Python __getattribute__ decides: inline it
        return tracer.call(hook, [obj, name], {})
    src = _obj_source(tracer, obj)
    d = getattr(obj, "__dict__", None)
    traced = tracer.copy_of.get(id(d)) if isinstance(d, dict) else None
    if traced is not None and name in traced.copy:   # ``obj.__dict__`` was read and written
        return traced.copy[name]
    if isinstance(d, dict) and name in d and not hasattr(type(inspect.getattr_static(type(obj), name, None)), "__set__"):
        return tracer.wrap(d[name], f"{src}.{name}")
    return class_attr(tracer, obj, name, src)


_FUNCTIONS = (SymFunction, SymBoundMethod, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _function_attr(tracer: Tracer, obj, name: str):
    """An attribute of a function or bound method: its name, code, self and function; what a
    decorator set on a Python function (guarded); anything else is a break."""
    if isinstance(obj, SymFunction):
        if name in ("__name__", "__qualname__"):
            return obj.name
        if name == "__code__":
            return obj.code
        if name == "__annotations__":
            return obj.annotations if obj.annotations is not None else {}
        raise GraphBreak(f"attribute {name} of a function made while tracing")
    if isinstance(obj, SymBoundMethod):
        if name == "__self__":
            return obj.self_value
        if name == "__func__":
            return obj.func
        raise GraphBreak(f"attribute {name} of a bound method")
    # a Python or builtin function, a bound method
    if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__", "__wrapped__", "__self__", "__func__"):
        return getattr(obj, name)
    d = getattr(obj, "__dict__", None)
    if isinstance(obj, types.FunctionType) and isinstance(d, dict):   # set by a decorator
        src = _obj_source(tracer, obj)
        if name in d:
            return tracer.wrap(d[name], f"{src}.{name}")
        if not hasattr(obj, name):
            _missing(tracer, obj, name, src)
    raise GraphBreak(f"attribute {name} of a function")


_GUARDED_CLASS_ATTRS = {int, float, bool, str, type(None), list, dict, collections.OrderedDict, set}
_PLAIN_ATTR_TYPES = {types.MappingProxyType, inspect.Signature, inspect.Parameter, list, dict, collections.OrderedDict,
                     collections.deque, tuple, str, bytes, set, frozenset, range, slice,
                     torch.dtype, torch.device, int, float, complex, bool, type(None)}


def tensor_attr(tracer: Tracer, t: TensorVar, name: str):
    meta = _TENSOR_META.get(name)
    if meta is not None:
        return meta(t.fake)
    if name in _TENSOR_VIEW_ATTRS:
        return tracer.call_graph("call_function", getattr, (t, name))
    if name == "data":
        return tracer.call_graph("call_method", "detach", (t,))
    if name in ("grad", "grad_fn", "is_leaf", "_base", "names", "untyped_storage"):
        raise GraphBreak(f"tensor.{name} depends on autograd/runtime state the graph cannot see")
    if name == "__class__":
        return t.cls
    attr = getattr(torch.Tensor, name, None)
    if callable(attr) and not isinstance(attr, type):
        return TensorMethod(t, name)
    if not hasattr(t.cls, name):   # an input's own attributes (``t.foo = 1``) are guarded absent
        if t.source is not None:
            real = next((i.real for i in tracer.inputs if i.var is t), None)
            if real is None or hasattr(real, name):
                raise GraphBreak(f"tensor instance attribute {name!r}")
            tracer.guards.add(f"not hasattr({t.source}, {name!r})", kind="HASATTR", what=t.source,
                              check=f"has no {name!r}")
        raise MissingAttribute(f"AttributeError: '{t.cls.__name__}' object has no attribute {name!r}")
    raise GraphBreak(f"tensor attribute {name!r}")


def setattr_(tracer: Tracer, obj, name: str, value, hooks: bool = True) -> None:
    if isinstance(obj, TensorVar):
        raise GraphBreak(f"setting tensor.{name}")
    _opaque(f"setting attribute {name!r}", obj)
    if tracer.is_new(obj):
        objects.set_new_attr(tracer, obj, name, value)
        return
    if isinstance(obj, (SymFunction, SymIter, SymCell, SymBoundMethod, TensorMethod)) or is_plain(obj):
        raise GraphBreak(f"setting attribute {name} on {type(obj).__name__}")
    hook = inspect.getattr_static(type(obj), "__setattr__", None) if hooks else None
    if isinstance(hook, types.FunctionType) and not isinstance(obj, nn.Module):
        tracer.call(hook, [obj, name, value], {})   # a Python __setattr__ decides: inline it
        return
    if isinstance(obj, nn.Module) and isinstance(value, TensorVar) and (
            name in obj._parameters or name in obj._buffers):
        raise GraphBreak(f"assigning a traced tensor to parameter/buffer {name!r}")
    static = inspect.getattr_static(type(obj), name, NULL)
    if hasattr(type(static), "__set__") and not isinstance(obj, nn.Module):
        _descriptor_set(tracer, static, obj, name, value)   # a data descriptor decides the write
        return
    if tracer.source_of(obj) is None:
        tracer.const_source(obj, "obj")
    tracer.record_setattr(obj, name, value)


def _descriptor_set(tracer: Tracer, desc, obj, name: str, value) -> None:
    """``obj.name = value`` through a class's data descriptor: a property's setter or a Python
    ``__set__`` inlined; any other descriptor (slots, C getset) a break."""
    if isinstance(desc, property):
        if not isinstance(desc.fset, types.FunctionType):
            raise GraphBreak(f"setting property {name!r} (no Python setter)")
        tracer.call(desc.fset, [obj, value], {})
        return
    setter = inspect.getattr_static(type(desc), "__set__")
    if not isinstance(setter, types.FunctionType):
        raise GraphBreak(f"setting {name!r} through a {type(desc).__name__} descriptor")
    tracer.call(setter, [desc, obj, value], {})


def delattr_(tracer: Tracer, obj, name: str) -> None:
    """``del obj.name``: on an object made while tracing, from its ``__dict__``; on another
    plain object, a recorded write (later reads in the trace raise AttributeError)."""
    hook = inspect.getattr_static(type(obj), "__delattr__", None)
    if tracer.is_new(obj) and hook is object.__delattr__ and name in obj.__dict__:
        del obj.__dict__[name]
        return
    if (isinstance(obj, (TensorVar, nn.Module)) or tracer.is_new(obj) or is_plain(obj)
            or hook is not object.__delattr__
            or not (name in getattr(obj, "__dict__", {}) or (id(obj), name) in tracer.attr_overlay)):
        raise GraphBreak(f"del of attribute {name} on a {type(obj).__name__}")
    getattr_(tracer, obj, name)   # its source and guards; an earlier del in the trace raises
    tracer.record_delattr(obj, name)


objects._SOURCED_C_METHODS.update({   # super().__getattribute__/__setattr__: the plain path
    (object, "__getattribute__"): lambda tracer, obj, name: getattr_(tracer, obj, name, hooks=False),
    (object, "__setattr__"): lambda tracer, obj, name, value: setattr_(tracer, obj, name, value, hooks=False),
})
