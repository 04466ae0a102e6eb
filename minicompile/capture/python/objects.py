"""Objects made while tracing (user classes called in traced code) and ``super()``.

Calling a user class makes a real instance with its builtin base's ``__new__`` (no user code
runs) and registers it with the tracer as *new*; its ``__init__`` is inlined, and its
attributes and items are stored on the real object, symbolic values included, so later
reads in the trace see them. Nothing outside the trace can have seen a new object, so it has
no source and no guards; the generated code rebuilds it (``rebuild``) from its class, its
builtin base's items and its ``__dict__``. HF's ``ModelOutput`` (an OrderedDict dataclass),
caches and small config holders are such objects.

``super()`` is a real ``super`` object; reading an attribute through it walks the MRO the
way CPython does and returns what ``getattr_`` would for a class attribute.
"""
from __future__ import annotations

import collections
import inspect
import types

import torch
from torch import nn

from minicompile.capture.interp.variables import NULL, GraphBreak, MissingAttribute, SymBoundMethod, SymCell, TensorVar

# Builtin bases a new object may have: their C storage holds symbolic values opaquely.
_BASES = (collections.OrderedDict, dict, list, object)
_DICT_BASES = (collections.OrderedDict, dict)


def builtin_base(cls: type) -> type | None:
    """The first builtin class in ``cls``'s MRO, if it is one whose storage we model."""
    for k in cls.__mro__:
        if k.__module__ == "builtins" or k is collections.OrderedDict:
            return k if k in _BASES else None
    return None


def _new_of(cls: type):
    """``cls.__new__`` when it is a builtin's (runs no user code), else None."""
    for k in cls.__mro__:
        if "__new__" in k.__dict__:
            return k.__dict__["__new__"] if builtin_base(k) is k else None
    return None


def instantiate(tracer, cls: type, args: list, kwargs: dict):
    """``cls(*args, **kwargs)`` for a user class: a new object, ``__init__`` inlined."""
    if type(cls).__call__ is not type.__call__ or issubclass(cls, (nn.Module, torch.Tensor, BaseException)):
        raise GraphBreak(f"constructing a {cls.__name__} (custom metaclass call, module, tensor or exception)")
    new = _new_of(cls)
    if new is None or builtin_base(cls) is None:
        raise GraphBreak(f"constructing a {cls.__name__} (its __new__ runs user code)")
    obj = new(cls)
    if not isinstance(getattr(obj, "__dict__", None), dict):
        raise GraphBreak(f"constructing a {cls.__name__} (__slots__ without __dict__)")
    tracer.add_new(obj)
    init = inspect.getattr_static(cls, "__init__")
    if isinstance(init, types.FunctionType):
        if tracer.call(init, [obj, *args], kwargs) is not None:
            raise GraphBreak(f"{cls.__name__}.__init__ returned a value")
    elif init is object.__init__:
        if args or kwargs:
            raise GraphBreak(f"TypeError: {cls.__name__}() takes no arguments")
    else:
        native_method(tracer, init.__get__(obj, cls), args, kwargs)
    return obj


_KEYED = {"__getitem__", "__setitem__", "__delitem__", "__contains__", "get", "pop", "setdefault"}


def native_method(tracer, fn, args, kwargs):
    """A builtin container/object method bound to a new object: it stores or reads values
    without looking at them (keys must be constants), so it runs on the real object."""
    if fn.__name__ in _KEYED and args and isinstance(args[0], TensorVar):
        raise GraphBreak(f"{fn.__name__}() with a tensor key on a traced object")
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise GraphBreak(f"{type(e).__name__}: {e} (in {fn.__name__} of a traced object)") from None


def is_native_on_new(tracer, fn) -> bool:
    return isinstance(fn, (types.BuiltinMethodType, types.MethodWrapperType)) and tracer.is_new(
        getattr(fn, "__self__", None))


def new_attr(tracer, obj, name: str):
    """An attribute of a new object: its own ``__dict__`` first, else the class's."""
    cls = type(obj)
    static = inspect.getattr_static(cls, name, NULL)
    if name in obj.__dict__ and not hasattr(type(static), "__set__"):   # data descriptors win
        return obj.__dict__[name]
    if name == "__dict__":
        return obj.__dict__   # the real dict of an object only this trace holds
    if name == "__class__":
        return cls
    if static is NULL:
        getattr_hook = inspect.getattr_static(cls, "__getattr__", None)
        if isinstance(getattr_hook, types.FunctionType):
            return tracer.call(getattr_hook, [obj, name], {})
        raise MissingAttribute(f"AttributeError: {cls.__name__} has no attribute {name!r}")
    return bind_class_attr(tracer, obj, static, name)


UNBOUND = object()


def bind_python_attr(tracer, obj, attr, name: str):
    """A class attribute written in Python (function, staticmethod, classmethod, property) read
    through ``obj``, bound as Python binds it (a property's getter inlined); ``UNBOUND`` for
    any other attribute."""
    if isinstance(attr, types.FunctionType):
        return SymBoundMethod(attr, obj)
    if isinstance(attr, staticmethod):
        return attr.__func__
    if isinstance(attr, classmethod):
        return SymBoundMethod(attr.__func__, type(obj))
    if isinstance(attr, property):
        if attr.fget is None:
            raise MissingAttribute(f"AttributeError: property {name!r} has no getter")
        return tracer.call(attr.fget, [obj], {})
    return UNBOUND


def bind_class_attr(tracer, obj, attr, name: str):
    """What reading class attribute ``attr`` through ``obj`` (a new object) gives."""
    if (bound := bind_python_attr(tracer, obj, attr, name)) is not UNBOUND:
        return bound
    if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType,
                         types.BuiltinMethodType, types.ClassMethodDescriptorType)):
        return attr.__get__(obj, type(obj))
    if hasattr(type(attr), "__get__") and not isinstance(attr, type):
        raise GraphBreak(f"descriptor {type(attr).__name__} {name!r} of a traced object")
    owner = next(k for k in type(obj).__mro__ if name in k.__dict__)
    return tracer.wrap(attr, f"{tracer.const_source(owner, 'cls')}.__dict__[{name!r}]")


def set_new_attr(tracer, obj, name: str, value) -> None:
    cls = type(obj)
    hook = inspect.getattr_static(cls, "__setattr__")
    if isinstance(hook, types.FunctionType):
        tracer.call(hook, [obj, name, value], {})
        return
    static = inspect.getattr_static(cls, name, NULL)
    if isinstance(static, property):
        if static.fset is None:
            raise GraphBreak(f"AttributeError: property {name!r} has no setter")
        tracer.call(static.fset, [obj, value], {})
        return
    if hook is not object.__setattr__ or hasattr(type(static), "__set__"):
        raise GraphBreak(f"attribute write {cls.__name__}.{name} through a descriptor")
    obj.__dict__[name] = value


# ---------------------------------------------------------------------- super()
def make_super(tracer, args: list):
    """``super()`` / ``super(cls, obj)`` in traced code: a real super object."""
    if not args:
        frame = tracer.frames[-1]
        cell = frame.cells.get("__class__")
        if cell is None or not frame.code.co_argcount:
            raise GraphBreak("RuntimeError: super(): no arguments")
        cls = cell.value if isinstance(cell, SymCell) else cell.cell_contents
        first = frame.code.co_varnames[0]
        obj = frame.locals.get(first, NULL)
        if obj is NULL and first in frame.cells:
            c = frame.cells[first]
            obj = c.value if isinstance(c, SymCell) else c.cell_contents
    elif len(args) == 2:
        cls, obj = args
    else:
        raise GraphBreak("super() with one argument")
    if not isinstance(cls, type) or isinstance(obj, (TensorVar, type)) or not isinstance(obj, cls):
        raise GraphBreak("super() of a tensor, a class, or a value the tracer does not hold")
    return super(cls, obj)


def super_attr(tracer, sup: super, name: str):
    cls, obj = sup.__thisclass__, sup.__self__
    mro = type(obj).__mro__
    for k in mro[mro.index(cls) + 1:]:
        if name in k.__dict__:
            attr = k.__dict__[name]
            break
    else:
        raise MissingAttribute(f"AttributeError: 'super' object has no attribute {name!r}")
    if attr is object.__getattribute__ and tracer.is_new(obj):   # the plain path, values may be symbolic
        return TracerCall(lambda tracer, args, kwargs: new_attr(tracer, obj, *args, **kwargs))
    if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)) and not tracer.is_new(obj):
        base = _SOURCED_C_METHODS.get((k, name))
        if base is None:
            raise GraphBreak(f"super().{name} (a C method) on an object from outside the trace")
        return TracerCall(lambda tracer, args, kwargs: base(tracer, obj, *args, **kwargs))
    return bind_class_attr(tracer, obj, attr, name)


class TracerCall:
    """A callable the tracer runs itself (``fn(tracer, args, kwargs)``) instead of inlining."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


def _dict_get(tracer, obj, key, default=None):
    """``dict.get`` on a dict subclass read from a source: the item is an input of its own."""
    if type(key) not in (int, str):
        raise GraphBreak("dict.get with a non-constant key on an object from outside the trace")
    src = tracer.source_of(obj)
    if src is None:
        raise GraphBreak("dict.get on an object the tracer cannot read again")
    tracer.ns.values.update(_dict_contains=dict.__contains__, _dict_getitem=dict.__getitem__)
    present = dict.__contains__(obj, key)
    tracer.guards.add(f"_dict_contains({src}, {key!r}) is {present}")
    return tracer.wrap(dict.__getitem__(obj, key), f"_dict_getitem({src}, {key!r})") if present else default


# C methods reached through ``super()`` on an object from a source: what they mean.
# semantics.py adds object.__getattribute__/__setattr__ (the plain attribute path).
_SOURCED_C_METHODS = {(dict, "get"): _dict_get}


# ---------------------------------------------------------------------- rebuilding
def _fill(obj, base: type, items: list, attrs: dict):
    """Give a freshly made object its traced contents without running its Python methods."""
    if base in _DICT_BASES:
        for k, v in items:
            base.__setitem__(obj, k, v)
    elif base is list:
        list.extend(obj, items)
    obj.__dict__.update(attrs)
    return obj


def rebuild_text(r, v) -> str:
    """Source text (for codegen's Reifier ``r``) that makes a copy of new object ``v``."""
    cls = type(v)
    name = r._temp(v, f"{r.ns.const(_new_of(cls), 'new')}({r.ns.const(cls, 'T')})")
    base = builtin_base(cls)
    if base in _DICT_BASES:
        items = "[" + ", ".join(f"({r.expr(k)}, {r.expr(x)})" for k, x in base.items(v)) + "]"
    elif base is list:
        items = "[" + ", ".join(r.expr(x) for x in list.__iter__(v)) + "]"
    else:
        items = "[]"
    attrs = "{" + ", ".join(f"{k!r}: {r.expr(x)}" for k, x in v.__dict__.items()) + "}"
    r.ns.values["_fill"] = _fill
    r.lines.append(f"_fill({name}, {r.ns.const(base, 'T')}, {items}, {attrs})")
    return name


def children(v) -> list:
    """The values a new object holds (for finding graph outputs)."""
    base = builtin_base(type(v))
    items = list(dict.values(v)) if base in _DICT_BASES else list(list.__iter__(v)) if base is list else []
    return items + list(v.__dict__.values())


def python_container(v) -> bool:
    """A subclass of dict, list or set other than those the tracer models (``collections.Counter``,
    a user's dict subclass): only its type is guarded, so an operator on it must not run while
    tracing (fuzz_py seed 100169: ``Counter + Counter`` was folded into a constant)."""
    return isinstance(v, (dict, list, set, frozenset)) and type(v) not in _MODELLED_CONTAINERS


_MODELLED_CONTAINERS = (dict, list, set, frozenset, collections.OrderedDict, collections.defaultdict)


__all__ = ["TracerCall", "python_container", "instantiate", "make_super", "super_attr", "new_attr", "set_new_attr",
           "native_method", "is_native_on_new", "rebuild_text", "children", "builtin_base"]

