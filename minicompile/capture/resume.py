"""Graph breaks: run the one instruction the tracer refused in real Python, then resume.

When tracing stops before instruction ``i``, the entry's generated code rebuilds the real
locals, cells and stack and calls a ``BreakAction``. The action executes instruction ``i``
natively (a table of small "native steps", one per opcode kind that can break), which
yields the offset of the next instruction; tracing then resumes there, in a new graph,
through the same per-code-object cache (keyed by offset) with its own guards on the
live values. So the "resume function" is our interpreter re-entered mid-frame.
"""
from __future__ import annotations

import builtins as _builtins
import dis
import operator

from minicompile.capture.frame import PY311, code_info
from minicompile.capture.registry import registrar
from minicompile.capture.semantics import BINARY_OPS, COMPARE_OPS, split_call
from minicompile.capture.variables import NULL, ResumeIter

_NB_SYMBOLS = [sym for _, sym in dis._nb_ops]
NATIVE_STEPS: dict = {}
native = registrar(NATIVE_STEPS)


class BreakAction:
    """Executes one instruction in real Python and re-enters the cache after it."""

    def __init__(self, cache, inst, kw_names: tuple, reason: str, where: str):
        self.cache = cache
        self.inst = inst
        self.kw_names = kw_names
        self.reason = reason
        self.where = where
        info = code_info(cache.code)
        self.next_offset = info.insts[info.index_of[inst.offset] + 1].offset
        self.step = NATIVE_STEPS[inst.opname]

    def __call__(self, locals_: list, cells: list, stack: list):
        offset = self.step(self, stack)
        return self.cache.resume(offset, (*locals_, *cells, *stack))

    def __repr__(self):
        return f"<graph break at {self.where}: {self.reason}>"


def _iter_items(v) -> ResumeIter:
    if isinstance(v, ResumeIter):
        return v
    return ResumeIter(list(v))


# ---------------------------------------------------------------------- calls
@native("CALL")
def _call(action, stack):
    argc = action.inst.arg
    fn, args, kwargs = split_call(stack, argc, action.kw_names)
    del stack[len(stack) - argc - 2:]
    fn = action.cache.ctx.native_callable(fn)
    stack.append(fn(*args, **kwargs))
    return action.next_offset


@native("CALL_FUNCTION_EX")
def _call_ex(action, stack):
    has_kw = action.inst.arg & 1
    kwargs = stack.pop() if has_kw else {}
    args = stack.pop()
    fn = stack.pop()
    stack.pop()  # NULL
    stack.append(action.cache.ctx.native_callable(fn)(*args, **kwargs))
    return action.next_offset


# ---------------------------------------------------------------------- branches
def _branch(test):
    def step(action, stack):
        v = stack.pop()
        return action.inst.argval if test(v) else action.next_offset
    return step


for _name, _test in {"TRUE": bool, "FALSE": lambda v: not v, "NONE": lambda v: v is None,
                     "NOT_NONE": lambda v: v is not None}.items():
    for _prefix in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
        NATIVE_STEPS[_prefix + _name] = _branch(_test)


@native("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
def _jump_or_pop(action, stack):
    if bool(stack[-1]) == (action.inst.opname == "JUMP_IF_TRUE_OR_POP"):
        return action.inst.argval
    stack.pop()
    return action.next_offset


@native("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def _jump(action, stack):
    return action.inst.argval


# ---------------------------------------------------------------------- operators
@native("BINARY_OP")
def _binary(action, stack):
    b = stack.pop()
    a = stack.pop()
    stack.append(BINARY_OPS[_NB_SYMBOLS[action.inst.arg]](a, b))
    return action.next_offset


@native("COMPARE_OP")
def _compare(action, stack):
    b = stack.pop()
    a = stack.pop()
    stack.append(COMPARE_OPS[action.inst.argval](a, b))
    return action.next_offset


@native("CONTAINS_OP")
def _contains(action, stack):
    b = stack.pop()
    a = stack.pop()
    stack.append((a in b) != bool(action.inst.arg))
    return action.next_offset


def _unary(fn):
    def step(action, stack):
        stack.append(fn(stack.pop()))
        return action.next_offset
    return step


for _name, _fn in {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos,
                   "UNARY_INVERT": operator.invert, "UNARY_NOT": operator.not_}.items():
    NATIVE_STEPS[_name] = _unary(_fn)


@native("CALL_INTRINSIC_1")
def _intrinsic(action, stack):
    v = stack.pop()
    stack.append(+v if action.inst.arg == 5 else tuple(v))
    return action.next_offset


# ---------------------------------------------------------------------- subscripts
@native("BINARY_SUBSCR")
def _subscr(action, stack):
    key = stack.pop()
    obj = stack.pop()
    stack.append(obj[key])
    return action.next_offset


@native("BINARY_SLICE")
def _slice(action, stack):
    stop = stack.pop()
    start = stack.pop()
    obj = stack.pop()
    stack.append(obj[start:stop])
    return action.next_offset


@native("STORE_SUBSCR")
def _store_subscr(action, stack):
    key = stack.pop()
    obj = stack.pop()
    value = stack.pop()
    obj[key] = value
    return action.next_offset


@native("STORE_SLICE")
def _store_slice(action, stack):
    stop = stack.pop()
    start = stack.pop()
    obj = stack.pop()
    obj[start:stop] = stack.pop()
    return action.next_offset


@native("DELETE_SUBSCR")
def _delete_subscr(action, stack):
    key = stack.pop()
    del stack.pop()[key]
    return action.next_offset


# ---------------------------------------------------------------------- attributes
@native("LOAD_ATTR")
def _load_attr(action, stack):
    value = getattr(stack.pop(), action.inst.argval)
    if not PY311 and action.inst.arg & 1:
        stack.append(NULL)
    stack.append(value)
    return action.next_offset


@native("LOAD_METHOD")
def _load_method(action, stack):
    value = getattr(stack.pop(), action.inst.argval)
    stack.append(NULL)
    stack.append(value)
    return action.next_offset


@native("STORE_ATTR")
def _store_attr(action, stack):
    obj = stack.pop()
    setattr(obj, action.inst.argval, stack.pop())
    return action.next_offset


@native("LOAD_GLOBAL")
def _load_global(action, stack):
    name = action.inst.argval
    g = action.cache.globals
    if action.inst.arg & 1:
        stack.append(NULL)
    if name in g:
        stack.append(g[name])
    else:
        b = g.get("__builtins__", _builtins)
        b = b if isinstance(b, dict) else b.__dict__
        if name not in b:
            raise NameError(f"name {name!r} is not defined")
        stack.append(b[name])
    return action.next_offset


# ---------------------------------------------------------------------- iteration & unpacking
@native("GET_ITER")
def _get_iter(action, stack):
    stack.append(_iter_items(iter(stack.pop())))
    return action.next_offset


@native("FOR_ITER")
def _for_iter(action, stack):
    it = stack[-1]
    try:
        stack.append(next(it))
        return action.next_offset
    except StopIteration:
        stack.pop()
        if PY311:
            return action.inst.argval
        info = code_info(action.cache.code)
        return info.insts[info.index_of[action.inst.argval] + 1].offset


@native("UNPACK_SEQUENCE")
def _unpack(action, stack):
    items = list(stack.pop())
    if len(items) != action.inst.arg:
        raise ValueError(f"cannot unpack {len(items)} values into {action.inst.arg}")
    stack.extend(reversed(items))
    return action.next_offset


@native("UNPACK_EX")
def _unpack_ex(action, stack):
    before, after = action.inst.arg & 0xFF, action.inst.arg >> 8
    items = list(stack.pop())
    if len(items) < before + after:
        raise ValueError("not enough values to unpack")
    values = items[:before] + [items[before:len(items) - after]] + items[len(items) - after:]
    stack.extend(reversed(values))
    return action.next_offset


@native("LIST_EXTEND")
def _list_extend(action, stack):
    v = stack.pop()
    stack[-action.inst.arg].extend(v)
    return action.next_offset


@native("DICT_UPDATE", "DICT_MERGE")
def _dict_update(action, stack):
    v = stack.pop()
    stack[-action.inst.arg].update(v)
    return action.next_offset


@native("FORMAT_VALUE")
def _format(action, stack):
    flags = action.inst.arg
    spec = stack.pop() if flags & 0x04 else ""
    value = stack.pop()
    conv = {0: lambda v: v, 1: str, 2: repr, 3: ascii}[flags & 0x03]
    stack.append(format(conv(value), spec))
    return action.next_offset


@native("BUILD_SET")
def _build_set(action, stack):
    n = action.inst.arg
    items = stack[len(stack) - n:]
    del stack[len(stack) - n:]
    stack.append(set(items))
    return action.next_offset


@native("SET_ADD", "SET_UPDATE")
def _set_add(action, stack):
    v = stack.pop()
    target = stack[-action.inst.arg]
    target.add(v) if action.inst.opname == "SET_ADD" else target.update(v)
    return action.next_offset


@native("RAISE_VARARGS")
def _raise(action, stack):
    n = action.inst.arg
    if n == 0:
        raise RuntimeError("No active exception to reraise")
    cause = stack.pop() if n == 2 else None
    exc = stack.pop()
    if isinstance(exc, type):
        exc = exc()
    if n == 2:
        raise exc from cause
    raise exc


@native("IMPORT_NAME")
def _import(action, stack):
    fromlist = stack.pop()
    level = stack.pop()
    stack.append(__import__(action.inst.argval, action.cache.globals, None, fromlist, level))
    return action.next_offset
