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
import collections
import dis
import itertools
import operator
import types

from minicompile.capture.interp.frame import PY311, PY313, code_info, push_callable, split_call
from minicompile.capture.interp.registry import registrar
from minicompile.capture.interp.variables import NULL, ResumeIter
from minicompile.capture.python.semantics import BINARY_OPS, COMPARE_OPS

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
        try:
            offset = self.step(self, stack)
        except BaseException as e:   # noqa: B036 -- a try/with block of the frame may handle it
            error = e
        else:
            return self.cache.resume(offset, (*locals_, *cells, *stack))
        # Raised by this instruction: the frame's exception table says where it goes (a
        # handler runs in Python, native.unwind). What the resumed code raises was either
        # unwound where it was raised or came from a graph; it passes through unchanged.
        return self.cache.unwind(self.inst.offset, error, locals_, cells, stack)

    def __repr__(self):
        return f"<graph break at {self.where}: {self.reason}>"


def _compare(inst, result):
    return bool(result) if PY313 and inst.arg & 16 else result   # 3.13's COMPARE_OP to bool


# An iterator handed over at a break is read to its end up front (a ResumeIter) when that
# runs none of the program's code: an iterator over a builtin container, or a builtin/itertools
# iterator (zip, map, accumulate, ...) over those with builtin functions. Any other -- a
# generator, an iterator class in Python, map(lambda ...), zip(generator, ...) -- stays the real,
# lazy iterator, each step a break where Python calls next(), in the program's order; so does
# itertools.groupby, whose groups share its position.
_EAGER_ITERATORS = {type(iter(c)) for c in ([], (), "", "\u00e9", b"", range(0), {}, {}.values(), {}.items(),
                                             set(), collections.deque(), reversed([]))}
_KEEP_LAZY = (itertools.groupby, type(next(itertools.groupby([1]))[1]), itertools.count, itertools.cycle,
              itertools.repeat)   # groupby's groups share its position; the others may never end


def _runs_no_python(v, depth: int = 0) -> bool:
    """Reading ``v`` ahead runs none of the program's code: the iterators and functions it is
    made of (its ``__reduce__``) are builtin, over data."""
    if depth > 16 or isinstance(v, _KEEP_LAZY):
        return False
    if isinstance(v, (list, tuple)):
        return all(_runs_no_python(x, depth + 1) for x in v)
    if isinstance(v, types.BuiltinFunctionType) or isinstance(v, type) and v.__module__ == "builtins":
        return True
    if not hasattr(type(v), "__next__"):
        return not callable(v)
    if type(v).__module__ not in ("builtins", "itertools"):
        return False   # a generator, an iterator class in Python
    try:
        parts = v.__reduce__()[1:3]
    except Exception:   # noqa: BLE001 -- nothing to look into (itertools.pairwise): keep it lazy
        return False
    return _runs_no_python(parts, depth + 1)


def _iter_items(v):
    if isinstance(v, ResumeIter) or type(v) not in _EAGER_ITERATORS and not _runs_no_python(v):
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
    fn, below = stack.pop(), stack.pop()   # [NULL, callable] until 3.12, [callable, NULL] from 3.13
    fn = below if fn is NULL else fn
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


# ---------------------------------------------------------------------- operators, subscripts
def _pure(n: int, fn):
    """A step that replaces the top ``n`` stack values with ``fn(inst, *values)``."""
    def step(action, stack):
        args = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        stack.append(fn(action.inst, *args))
        return action.next_offset
    return step


def _effect(n: int, fn):
    """A step that pops the top ``n`` stack values into ``fn(inst, *values)`` (a store)."""
    def step(action, stack):
        args = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        fn(action.inst, *args)
        return action.next_offset
    return step


NATIVE_STEPS.update({
    "BINARY_OP": _pure(2, lambda inst, a, b: BINARY_OPS[_NB_SYMBOLS[inst.arg]](a, b)),
    "COMPARE_OP": _pure(2, lambda inst, a, b: _compare(inst, COMPARE_OPS[inst.argval](a, b))),
    "CONTAINS_OP": _pure(2, lambda inst, a, b: (a in b) != bool(inst.arg)),
    "UNARY_NEGATIVE": _pure(1, lambda inst, v: -v),
    "UNARY_POSITIVE": _pure(1, lambda inst, v: +v),
    "UNARY_INVERT": _pure(1, lambda inst, v: ~v),
    "UNARY_NOT": _pure(1, lambda inst, v: not v),
    "CALL_INTRINSIC_1": _pure(1, lambda inst, v: +v if inst.arg == 5 else tuple(v)),
    "BINARY_SUBSCR": _pure(2, lambda inst, obj, key: obj[key]),
    "BINARY_SLICE": _pure(3, lambda inst, obj, start, stop: obj[start:stop]),
    "STORE_SUBSCR": _effect(3, lambda inst, value, obj, key: operator.setitem(obj, key, value)),
    "STORE_SLICE": _effect(4, lambda inst, value, obj, start, stop: operator.setitem(obj, slice(start, stop), value)),
    "DELETE_SUBSCR": _effect(2, lambda inst, obj, key: operator.delitem(obj, key)),
    "STORE_ATTR": _effect(2, lambda inst, value, obj: setattr(obj, inst.argval, value)),
    "GET_ITER": _pure(1, lambda inst, v: _iter_items(iter(v))),
})


# ---------------------------------------------------------------------- attributes
@native("LOAD_ATTR", "LOAD_METHOD")
def _load_attr(action, stack):
    value = getattr(stack.pop(), action.inst.argval)
    return _pushed(action, stack, value, action.inst.opname == "LOAD_METHOD" or not PY311 and action.inst.arg & 1)


def _pushed(action, stack, value, as_callable) -> int:
    """``value`` pushed (with the NULL of "no self" where the instruction asks for it); the next offset."""
    if as_callable:
        push_callable(stack, value)
    else:
        stack.append(value)
    return action.next_offset


@native("LOAD_GLOBAL")
def _load_global(action, stack):
    name = action.inst.argval
    g = action.cache.globals
    if name in g:
        value = g[name]
    else:
        b = g.get("__builtins__", _builtins)
        b = b if isinstance(b, dict) else b.__dict__
        if name not in b:
            raise NameError(f"name {name!r} is not defined")
        value = b[name]
    return _pushed(action, stack, value, action.inst.arg & 1)


# ---------------------------------------------------------------------- iteration & unpacking
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
        info = code_info(action.cache.code)   # past END_FOR (3.12), past END_FOR, POP_TOP (3.13)
        return info.insts[info.index_of[action.inst.argval] + (2 if PY313 else 1)].offset


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


def _into(method: str):
    """LIST_EXTEND and friends: pop a value into the container ``inst.arg`` deep."""
    def step(action, stack):
        v = stack.pop()
        getattr(stack[-action.inst.arg], method)(v)
        return action.next_offset
    return step


NATIVE_STEPS.update(LIST_EXTEND=_into("extend"), DICT_UPDATE=_into("update"), DICT_MERGE=_into("update"),
                    SET_ADD=_into("add"), SET_UPDATE=_into("update"))


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


@native("BEFORE_WITH")
def _before_with(action, stack):
    ctx = stack.pop()
    exit_ = type(ctx).__exit__.__get__(ctx)   # looked up on the type, before __enter__, as CPython
    stack.append(exit_)
    stack.append(type(ctx).__enter__(ctx))
    return action.next_offset


@native("CHECK_EXC_MATCH")
def _check_exc_match(action, stack):
    kind = stack.pop()
    stack.append(isinstance(stack[-1], kind))
    return action.next_offset


@native("WITH_EXCEPT_START")
def _with_except_start(action, stack):
    exc = stack[-1]   # below it: the previous exception, lasti, then the block's __exit__
    stack.append(stack[-4](type(exc), exc, exc.__traceback__))
    return action.next_offset


@native("IMPORT_FROM")
def _import_from(action, stack):
    stack.append(getattr(stack[-1], action.inst.argval))   # the module stays below
    return action.next_offset


NATIVE_STEPS["DELETE_ATTR"] = _effect(1, lambda inst, obj: delattr(obj, inst.argval))


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
