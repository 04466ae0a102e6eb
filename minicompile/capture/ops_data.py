"""Opcode handlers for data: operators, containers, subscripts, attributes and calls.

Every handler that can refuse (raise ``GraphBreak``) does so before it changes the stack,
so a graph break can hand the untouched stack to real Python.
"""
from __future__ import annotations

import dis
import operator

from minicompile.capture import semantics
from minicompile.capture.calls import call
from minicompile.capture.frame import PY311
from minicompile.capture.registry import op
from minicompile.capture.variables import NULL, GraphBreak, contains_symbolic

_NB_SYMBOLS = [sym for _, sym in dis._nb_ops]


# ---------------------------------------------------------------------- operators
@op("BINARY_OP")
def _binary_op(frame, inst):
    _apply_binary(frame, semantics.BINARY_OPS[_NB_SYMBOLS[inst.arg]])


@op("COMPARE_OP")
def _compare_op(frame, inst):
    _apply_binary(frame, semantics.COMPARE_OPS[inst.argval])


def _apply_binary(frame, fn):
    # operands stay on the stack until the result exists (a graph break sees them there)
    a, b = frame.stack[-2], frame.stack[-1]
    result = semantics.binary(frame.tracer, fn, a, b)
    frame.popn(2)
    frame.push(result)


@op("IS_OP")
def _is_op(frame, inst):
    b = frame.pop()
    a = frame.pop()
    frame.push((a is b) != bool(inst.arg))


@op("CONTAINS_OP")
def _contains_op(frame, inst):
    item, container = frame.stack[-2], frame.stack[-1]
    result = semantics.contains(frame.tracer, item, container)
    frame.popn(2)
    frame.push(result != bool(inst.arg))


def _unary(fn):
    def handler(frame, inst):
        result = semantics.unary(frame.tracer, fn, frame.stack[-1])
        frame.stack[-1] = result
    return handler


for _name, _fn in {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos,
                   "UNARY_INVERT": operator.invert, "UNARY_NOT": operator.not_}.items():
    op(_name)(_unary(_fn))


@op("CALL_INTRINSIC_1")
def _call_intrinsic_1(frame, inst):
    if inst.arg == 5:    # INTRINSIC_UNARY_POSITIVE
        frame.stack[-1] = semantics.unary(frame.tracer, operator.pos, frame.stack[-1])
    elif inst.arg == 6:  # INTRINSIC_LIST_TO_TUPLE
        frame.stack[-1] = tuple(frame.stack[-1])
    else:
        raise GraphBreak(f"CALL_INTRINSIC_1 {inst.argrepr}")


# ---------------------------------------------------------------------- subscripts
@op("BINARY_SUBSCR")
def _binary_subscr(frame, inst):
    obj, key = frame.stack[-2], frame.stack[-1]
    result = semantics.subscr(frame.tracer, obj, key)
    frame.popn(2)
    frame.push(result)


@op("BINARY_SLICE")
def _binary_slice(frame, inst):
    obj, start, stop = frame.stack[-3:]
    result = semantics.subscr(frame.tracer, obj, slice(start, stop))
    frame.popn(3)
    frame.push(result)


@op("STORE_SUBSCR")
def _store_subscr(frame, inst):
    value, obj, key = frame.stack[-3:]
    semantics.store_subscr(frame.tracer, obj, key, value)
    frame.popn(3)


@op("STORE_SLICE")
def _store_slice(frame, inst):
    value, obj, start, stop = frame.stack[-4:]
    semantics.store_subscr(frame.tracer, obj, slice(start, stop), value)
    frame.popn(4)


@op("DELETE_SUBSCR")
def _delete_subscr(frame, inst):
    obj, key = frame.stack[-2:]
    semantics.delete_subscr(frame.tracer, obj, key)
    frame.popn(2)


@op("BUILD_SLICE")
def _build_slice(frame, inst):
    frame.push(slice(*frame.popn(inst.arg)))


# ---------------------------------------------------------------------- containers
@op("BUILD_TUPLE")
def _build_tuple(frame, inst):
    frame.push(tuple(frame.popn(inst.arg)))


@op("BUILD_LIST")
def _build_list(frame, inst):
    frame.push(frame.popn(inst.arg))


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


@op("BUILD_STRING")
def _build_string(frame, inst):
    frame.push("".join(frame.popn(inst.arg)))


@op("FORMAT_VALUE")
def _format_value(frame, inst):
    has_spec = bool(inst.arg & 0x04)
    value = frame.stack[-2] if has_spec else frame.stack[-1]
    if contains_symbolic(value) or not semantics.is_plain(value):
        raise GraphBreak("formatting a tensor or object into a string needs its value")
    spec = frame.pop() if has_spec else ""
    frame.pop()
    conv = {0: lambda v: v, 1: str, 2: repr, 3: ascii}[inst.arg & 0x03]
    frame.push(format(conv(value), spec))


@op("LIST_APPEND")
def _list_append(frame, inst):
    v = frame.pop()
    frame.stack[-inst.arg].append(v)


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


@op("LIST_TO_TUPLE")
def _list_to_tuple(frame, inst):
    frame.stack[-1] = tuple(frame.stack[-1])


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
        frame.push(NULL)
    frame.push(value)


@op("LOAD_METHOD")
def _load_method(frame, inst):
    obj = frame.stack[-1]
    value = semantics.getattr_(frame.tracer, obj, inst.argval)
    frame.pop()
    frame.push(NULL)
    frame.push(value)


@op("STORE_ATTR")
def _store_attr(frame, inst):
    obj, value = frame.stack[-1], frame.stack[-2]
    semantics.setattr_(frame.tracer, obj, inst.argval, value)
    frame.popn(2)


# ---------------------------------------------------------------------- calls
@op("CALL")
def _call(frame, inst):
    fn, args, kwargs = semantics.split_call(frame.stack, inst.arg, frame.kw_names)
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
    if not isinstance(kwargs, dict):
        raise GraphBreak("** of a non-dict")
    args = semantics.iterate(frame.tracer, star)
    result = call(frame.tracer, fn, args, dict(kwargs))
    frame.popn(3 + has_kw)
    frame.push(result)


