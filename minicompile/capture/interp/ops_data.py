"""Opcode handlers for data: operators, containers, subscripts, attributes and calls.

Every handler that can refuse (raise ``GraphBreak``) does so before it changes the stack,
so a graph break can hand the untouched stack to real Python.
"""
from __future__ import annotations

import builtins
import dis
import operator

from minicompile.capture.dynamic import concrete
from minicompile.capture.interp.frame import PY311, push_callable, split_call
from minicompile.capture.interp.registry import HANDLERS, op
from minicompile.capture.interp.variables import NULL, GraphBreak, contains_symbolic
from minicompile.capture.python import objects, semantics
from minicompile.capture.python.calls import call

BINARY = [semantics.BINARY_OPS[sym] for _, sym in dis._nb_ops]   # BINARY_OP's arg -> operator


# ---------------------------------------------------------------------- operators, subscripts
def _on_top(n: int, fn, push: bool = True):
    """A handler that replaces the top ``n`` stack values with ``fn(tracer, inst, *values)``.
    The operands stay on the stack until the result exists (a graph break sees them there)."""
    def handler(frame, inst):
        result = fn(frame.tracer, inst, *frame.stack[len(frame.stack) - n:])
        frame.popn(n)
        if push:
            frame.push(result)
    return handler


def _intrinsic(tracer, inst, v):
    if inst.arg == 5:    # INTRINSIC_UNARY_POSITIVE
        return semantics.unary(tracer, operator.pos, v)
    if inst.arg == 6:    # INTRINSIC_LIST_TO_TUPLE
        return tuple(v)
    raise GraphBreak(f"CALL_INTRINSIC_1 {inst.argrepr}")


HANDLERS.update({
    "BINARY_OP": _on_top(2, lambda tr, inst, a, b: semantics.binary(tr, BINARY[inst.arg], a, b)),
    "COMPARE_OP": _on_top(2, lambda tr, inst, a, b: semantics.binary(tr, semantics.COMPARE_OPS[inst.argval], a, b)),
    "IS_OP": _on_top(2, lambda tr, inst, a, b: semantics.identity(a, b) != bool(inst.arg)),
    "CONTAINS_OP": _on_top(2, lambda tr, inst, item, c: semantics.contains(tr, item, c) != bool(inst.arg)),
    "UNARY_NEGATIVE": _on_top(1, lambda tr, inst, v: semantics.unary(tr, operator.neg, v)),
    "UNARY_POSITIVE": _on_top(1, lambda tr, inst, v: semantics.unary(tr, operator.pos, v)),
    "UNARY_INVERT": _on_top(1, lambda tr, inst, v: semantics.unary(tr, operator.invert, v)),
    "UNARY_NOT": _on_top(1, lambda tr, inst, v: semantics.unary(tr, operator.not_, v)),
    "CALL_INTRINSIC_1": _on_top(1, _intrinsic),
    "BINARY_SUBSCR": _on_top(2, lambda tr, inst, obj, key: semantics.subscr(tr, obj, key)),
    "BINARY_SLICE": _on_top(3, lambda tr, inst, obj, start, stop: semantics.subscr(tr, obj, slice(start, stop))),
    "STORE_SUBSCR": _on_top(3, lambda tr, inst, value, obj, key: semantics.store_subscr(tr, obj, key, value),
                            push=False),
    "STORE_SLICE": _on_top(4, lambda tr, inst, value, obj, start, stop: semantics.store_subscr(
        tr, obj, slice(start, stop), value), push=False),
    "DELETE_SUBSCR": _on_top(2, lambda tr, inst, obj, key: semantics.delete_subscr(tr, obj, key), push=False),
    "DELETE_ATTR": _on_top(1, lambda tr, inst, obj: semantics.delattr_(tr, obj, inst.argval), push=False),
    "STORE_ATTR": _on_top(2, lambda tr, inst, value, obj: semantics.setattr_(tr, obj, inst.argval, value),
                          push=False),
})


# ---------------------------------------------------------------------- containers
HANDLERS.update({
    "BUILD_SLICE": lambda frame, inst: frame.push(slice(*frame.popn(inst.arg))),
    "BUILD_TUPLE": lambda frame, inst: frame.push(tuple(frame.popn(inst.arg))),
    "BUILD_LIST": lambda frame, inst: frame.push(frame.popn(inst.arg)),
    "BUILD_STRING": lambda frame, inst: frame.push("".join(frame.popn(inst.arg))),
    "LIST_APPEND": lambda frame, inst: frame.stack[-inst.arg - 1].append(frame.pop()),
    "LIST_TO_TUPLE": lambda frame, inst: frame.stack.append(tuple(frame.pop())),
})


@op("BUILD_SET")
def _build_set(frame, inst):
    items = frame.stack[len(frame.stack) - inst.arg:]
    if contains_symbolic(items):
        raise GraphBreak("set of tensors")
    frame.push(set(frame.popn(inst.arg)))


@op("BUILD_MAP")
def _build_map(frame, inst):
    items = frame.popn(2 * inst.arg)
    frame.push({items[i]: items[i + 1] for i in range(0, len(items), 2)})


@op("BUILD_CONST_KEY_MAP")
def _build_const_key_map(frame, inst):
    keys = frame.pop()
    frame.push(dict(zip(keys, frame.popn(inst.arg))))


@op("FORMAT_VALUE")
def _format_value(frame, inst):
    has_spec = bool(inst.arg & 0x04)
    value = frame.stack[-2] if has_spec else frame.stack[-1]
    if contains_symbolic(value) or not semantics.is_plain(value):
        raise GraphBreak("formatting a tensor or object into a string needs its value")
    spec = frame.pop() if has_spec else ""
    frame.pop()
    conv = {0: lambda v: v, 1: str, 2: repr, 3: ascii}[inst.arg & 0x03]
    frame.push(format(conv(concrete(value)), spec))   # a symbolic size formats as its value


@op("SET_ADD")
def _set_add(frame, inst):
    if contains_symbolic(frame.stack[-1]):
        raise GraphBreak("set of tensors")
    v = frame.pop()
    frame.stack[-inst.arg].add(v)


@op("MAP_ADD")
def _map_add(frame, inst):
    v = frame.pop()
    k = frame.pop()
    frame.stack[-inst.arg][k] = v


@op("LIST_EXTEND")
def _list_extend(frame, inst):
    items = semantics.iterate(frame.tracer, frame.stack[-1])
    frame.pop()
    frame.stack[-inst.arg].extend(items)


@op("SET_UPDATE")
def _set_update(frame, inst):
    if contains_symbolic(frame.stack[-1]):
        raise GraphBreak("set of tensors")
    items = semantics.iterate(frame.tracer, frame.stack[-1])
    frame.pop()
    frame.stack[-inst.arg].update(items)


@op("DICT_UPDATE", "DICT_MERGE")
def _dict_update(frame, inst):
    other = frame.stack[-1]
    if not isinstance(other, dict):
        raise GraphBreak(f"** unpacking of a {type(other).__name__}")
    frame.pop()
    frame.stack[-inst.arg].update(other)


@op("UNPACK_SEQUENCE")
def _unpack_sequence(frame, inst):
    items = semantics.iterate(frame.tracer, frame.stack[-1])
    if len(items) != inst.arg:
        raise GraphBreak(f"ValueError: cannot unpack {len(items)} values into {inst.arg}")
    frame.pop()
    frame.stack.extend(reversed(items))


@op("UNPACK_EX")
def _unpack_ex(frame, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = semantics.iterate(frame.tracer, frame.stack[-1])
    if len(items) < before + after:
        raise GraphBreak("ValueError: not enough values to unpack")
    frame.pop()
    middle = items[before:len(items) - after]
    values = items[:before] + [list(middle)] + items[len(items) - after:]
    frame.stack.extend(reversed(values))


# ---------------------------------------------------------------------- attributes
@op("LOAD_ATTR")
def _load_attr(frame, inst):
    obj = frame.stack[-1]
    value = semantics.getattr_(frame.tracer, obj, inst.argval)
    frame.pop()
    if not PY311 and inst.arg & 1:  # 3.12 method form: [NULL, bound] behaves like [meth, self]
        push_callable(frame.stack, value)
    else:
        frame.push(value)


@op("LOAD_SUPER_ATTR")
def _load_super_attr(frame, inst):
    """3.12's ``super().name``: [super, __class__, self] on the stack."""
    glob, cls, self_ = frame.stack[-3:]
    if glob is not builtins.super:
        raise GraphBreak("LOAD_SUPER_ATTR with a shadowed super")
    value = semantics.getattr_(frame.tracer, objects.make_super(frame.tracer, [cls, self_]), inst.argval)
    frame.popn(3)
    if inst.arg & 1:
        push_callable(frame.stack, value)
    else:
        frame.push(value)


@op("LOAD_METHOD")
def _load_method(frame, inst):
    obj = frame.stack[-1]
    value = semantics.getattr_(frame.tracer, obj, inst.argval)
    frame.pop()
    frame.push(NULL)
    frame.push(value)


# ---------------------------------------------------------------------- calls
@op("CALL")
def _call(frame, inst):
    fn, args, kwargs = split_call(frame.stack, inst.arg, frame.kw_names)
    result = call(frame.tracer, fn, args, kwargs)
    frame.kw_names = ()
    frame.popn(inst.arg + 2)
    frame.push(result)


@op("CALL_FUNCTION_EX")
def _call_function_ex(frame, inst):
    has_kw = inst.arg & 1
    kwargs = frame.stack[-1] if has_kw else {}
    star = frame.stack[-1 - has_kw]
    fn = frame.stack[-2 - has_kw]
    if fn is NULL:   # 3.13: [callable, NULL, args]
        fn = frame.stack[-3 - has_kw]
    if not isinstance(kwargs, dict):
        raise GraphBreak("** of a non-dict")
    args = semantics.iterate(frame.tracer, star)
    result = call(frame.tracer, fn, args, dict(kwargs))
    frame.popn(3 + has_kw)
    frame.push(result)


