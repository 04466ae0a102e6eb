"""A symbolic frame: one code object being interpreted, plus facts about code objects.

``code_info`` decodes a code object once (instructions, offset -> index, line numbers);
``prescan`` says up front whether the tracer can run a code object at all, so an
unsupported construct is found before any graph is built rather than halfway through.
"""
from __future__ import annotations

import dis
import functools
import inspect
import sys
import types
from dataclasses import dataclass

from minicompile.capture.interp.registry import HANDLERS
from minicompile.capture.interp.variables import NULL

PY311 = sys.version_info[:2] == (3, 11)
PY312 = sys.version_info[:2] == (3, 12)
PY313 = sys.version_info[:2] == (3, 13)

_GENERATOR_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                    | inspect.CO_ITERABLE_COROUTINE)

# Opcodes whose presence means "a construct we do not model", with the user-facing reason.
_UNMODELED = {
    "SETUP_WITH": "with-block (context managers are not modeled)",
    "YIELD_VALUE": "generator",
    "RETURN_GENERATOR": "generator",
    "LOAD_BUILD_CLASS": "class definition inside the function",
    "MATCH_CLASS": "match statement",
    "MATCH_MAPPING": "match statement",
    "MATCH_SEQUENCE": "match statement",
    "MATCH_KEYS": "match statement",
    "GET_LEN": "match statement",
    "SETUP_ANNOTATIONS": "annotations in function body",
    "IMPORT_STAR": "import *",
    "DELETE_GLOBAL": "del of a global",
    "DELETE_DEREF": "del of a closure variable",
    "GET_AWAITABLE": "await",
    "BEFORE_ASYNC_WITH": "async with",
}
# Only reached while an exception propagates, which traced code never does: a Python error
# while tracing is a graph break, and an exception raised where a break runs in Python is
# handled there (``handler_for``, native.py runs the handler).
_EXCEPTION_PATH_ONLY = {"PUSH_EXC_INFO", "RERAISE", "POP_EXCEPT", "CHECK_EXC_MATCH", "WITH_EXCEPT_START",
                        "CLEANUP_THROW", "END_ASYNC_FOR"}


@dataclass
class CodeInfo:
    insts: list
    index_of: dict
    lines: dict           # offset -> line number
    unsupported: str | None
    handles_exceptions: bool = False   # has a try or with block (PUSH_EXC_INFO)
    handlers: tuple = ()               # the exception table: (start, end, target, depth, lasti)


@functools.lru_cache(maxsize=4096)
def code_info(code: types.CodeType) -> CodeInfo:
    insts = list(dis.get_instructions(code))
    index_of = {inst.offset: i for i, inst in enumerate(insts)}
    lines, line = {}, code.co_firstlineno
    starts = dict(dis.findlinestarts(code))
    for inst in insts:
        if starts.get(inst.offset) is not None:
            line = starts[inst.offset]
        lines[inst.offset] = line
    return CodeInfo(insts, index_of, lines, _scan(code, insts),
                    any(inst.opname == "PUSH_EXC_INFO" for inst in insts),
                    tuple(tuple(e) for e in dis._parse_exception_table(code)))


def handler_for(code: types.CodeType, offset: int):
    """The exception table's entry for an exception raised at ``offset``: (start, end, target,
    stack depth, push lasti), or None when it leaves the frame."""
    for entry in code_info(code).handlers:
        if entry[0] <= offset < entry[1]:
            return entry
    return None


@functools.lru_cache(maxsize=1024)
def loop_bodies(code: types.CodeType) -> frozenset:
    """Offsets inside a loop: between a backward jump's target and the jump."""
    inside = set()
    info = code_info(code)
    for inst in info.insts:
        if inst.opname.startswith("JUMP_BACKWARD") or inst.opname == "POP_JUMP_BACKWARD_IF_TRUE" or (
                "JUMP" in inst.opname and isinstance(inst.argval, int) and inst.argval < inst.offset):
            inside.update(i.offset for i in info.insts if inst.argval <= i.offset <= inst.offset)
    return frozenset(inside)


def frame_value_names(code: types.CodeType, offset: int) -> list:
    """What ``L[i]`` is at ``offset``: the arguments and closure cells at 0, else the locals,
    cells and then the stack (generated code's and guards' ``L``)."""
    if offset == 0:
        return [*arg_names(code), *code.co_freevars]
    return [*code.co_varnames, *code.co_cellvars, *code.co_freevars]


def _scan(code: types.CodeType, insts: list) -> str | None:
    # A generator function or expression is run lazily by a traced caller (``interpreter.generator``).
    generator = code.co_flags & _GENERATOR_FLAGS == inspect.CO_GENERATOR
    if code.co_flags & _GENERATOR_FLAGS and not generator:
        return "coroutine or async generator function"
    for i, inst in enumerate(insts):
        if generator and inst.opname in ("RETURN_GENERATOR", "YIELD_VALUE"):
            continue
        if inst.opname == "PUSH_EXC_INFO" and insts[i + 1].opname == "WITH_EXCEPT_START":
            continue  # a with-block's cleanup; BEFORE_WITH decides if the block is modeled
        if inst.opname in _UNMODELED:
            return _UNMODELED[inst.opname]
        if inst.opname not in HANDLERS and inst.opname not in _EXCEPTION_PATH_ONLY:
            return f"bytecode {inst.opname} is not supported by the tracer"
    return None


def is_generator(code: types.CodeType) -> bool:
    """A generator function's or generator expression's code: traced lazily, each item when
    its consumer asks (``interpreter.generator``), so side effects interleave as in Python."""
    return bool(code.co_flags & inspect.CO_GENERATOR)


def prescan(code: types.CodeType, inlined: bool = False) -> str | None:
    """None when the tracer can interpret ``code``, else the reason it cannot. A generator
    function is traced only where a traced caller consumes it."""
    if not inlined and is_generator(code):
        return "generator function (traced only when a traced caller consumes it)"
    return code_info(code).unsupported


class Frame:
    """The symbolic state of one running code object."""

    def __init__(self, tracer, code: types.CodeType, globals_: dict, locals_: dict,
                 cells: dict, depth: int, start_offset: int = 0, stack: list | None = None):
        info = code_info(code)
        self.tracer = tracer
        self.code = code
        self.info = info
        self.insts = info.insts
        self.globals = globals_
        self.builtins = globals_.get("__builtins__", __builtins__)
        if isinstance(self.builtins, types.ModuleType):
            self.builtins = self.builtins.__dict__
        self.locals = locals_
        self.cells = cells
        self.depth = depth
        self.stack = stack if stack is not None else []
        self.ip = info.index_of[start_offset]
        self.kw_names: tuple = ()
        self.current = None
        self.returned = False
        self.return_value = None
        self.suspended: bool | None = None   # False/True in a generator function's frame

    def where(self) -> str:
        offset = self.current.offset if self.current is not None else 0
        return f"{self.code.co_filename}:{self.info.lines.get(offset, self.code.co_firstlineno)}"

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, offset: int) -> None:
        self.ip = self.info.index_of[offset]


def bind_arguments(code: types.CodeType, defaults, kwdefaults, args, kwargs) -> dict:
    """Map call arguments to parameter names the way CPython does (for tracing and calls)."""
    nargs = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    posonly = code.co_posonlyargcount
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: dict = {}
    args = list(args)
    if len(args) > nargs and not has_varargs:
        raise TypeError(f"{code.co_name}() takes {nargs} positional arguments but {len(args)} were given")
    for name, value in zip(names[:nargs], args):
        bound[name] = value
    extra_kw = {}
    kwonly = names[nargs:nargs + nkw]
    for k, v in kwargs.items():
        if k in names[posonly:nargs] or k in kwonly:
            if k in bound:
                raise TypeError(f"{code.co_name}() got multiple values for argument '{k}'")
            bound[k] = v
        elif has_varkw:
            extra_kw[k] = v
        else:
            raise TypeError(f"{code.co_name}() got an unexpected keyword argument '{k}'")
    defaults = defaults or ()
    first_default = nargs - len(defaults)
    for i, name in enumerate(names[:nargs]):
        if name not in bound:
            if i >= first_default:
                bound[name] = defaults[i - first_default]
            else:
                raise TypeError(f"{code.co_name}() missing required argument '{name}'")
    for name in kwonly:
        if name not in bound:
            if kwdefaults and name in kwdefaults:
                bound[name] = kwdefaults[name]
            else:
                raise TypeError(f"{code.co_name}() missing required keyword-only argument '{name}'")
    i = nargs + nkw
    if has_varargs:
        bound[names[i]] = tuple(args[nargs:])
        i += 1
    if has_varkw:
        bound[names[i]] = extra_kw
    return bound


def arg_names(code: types.CodeType) -> tuple:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:n]


__all__ = ["Frame", "code_info", "handler_for", "prescan", "is_generator", "bind_arguments", "arg_names", "PY311",
           "PY312", "PY313", "split_call", "push_callable"]


# Where the NULL that marks "no self" lies under a CALL's callable: before it until 3.12, after it from 3.13.
NULL_FIRST = sys.version_info < (3, 13)


def split_call(stack: list, argc: int, kw_names: tuple):
    """(callable, positional args, kwargs) of a CALL, without touching the stack. Below the
    arguments lie [NULL, callable] (3.11/3.12), [callable, NULL] (3.13) or [method, self]."""
    args = stack[len(stack) - argc:] if argc else []
    first, second = stack[-argc - 2], stack[-argc - 1]
    if first is NULL or second is NULL:
        fn = second if first is NULL else first
    else:
        fn, args = first, [second, *args]
    nkw = len(kw_names)
    kwargs = dict(zip(kw_names, args[len(args) - nkw:])) if nkw else {}
    if nkw:
        args = args[:len(args) - nkw]
    return fn, list(args), kwargs


def push_callable(stack: list, fn) -> None:
    """Push ``fn`` with the NULL that marks "no self" where this Python puts it (LOAD_GLOBAL's and
    LOAD_ATTR's low bit, CALL_FUNCTION_EX): before the callable until 3.12, after it from 3.13."""
    stack.extend((NULL, fn) if NULL_FIRST else (fn, NULL))
