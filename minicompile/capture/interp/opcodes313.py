"""CPython 3.13's new opcodes, for the tracer (``HANDLERS``) and for graph breaks (``NATIVE_STEPS``).

3.13 fuses two local moves into one superinstruction (``argval`` names both locals), passes
keyword names on the stack (CALL_KW), makes truth tests explicit (TO_BOOL before a branch or
``not``), sets a new function's defaults, annotations and closure one SET_FUNCTION_ATTRIBUTE at
a time after a bare MAKE_FUNCTION, and splits FORMAT_VALUE into CONVERT_VALUE, FORMAT_SIMPLE and
FORMAT_WITH_SPEC. Older Pythons never emit these names, so registering them always is harmless.
The changes to opcodes that 3.11 and 3.12 share (where CALL's NULL lies, FOR_ITER's exit) live in
their handlers.
"""
from __future__ import annotations

from minicompile.capture.dynamic import concrete
from minicompile.capture.entries.resume import NATIVE_STEPS, native
from minicompile.capture.interp.frame import split_call
from minicompile.capture.interp.interpreter import load_local, store_local
from minicompile.capture.interp.registry import HANDLERS, op
from minicompile.capture.interp.variables import GraphBreak, contains_symbolic
from minicompile.capture.python import semantics
from minicompile.capture.python.calls import call

_CONVERSIONS = {1: str, 2: repr, 3: ascii}


# ---------------------------------------------------------------------- superinstructions
@op("LOAD_FAST_LOAD_FAST")
def _load_fast_load_fast(frame, inst):
    first, second = inst.argval
    values = load_local(frame, first), load_local(frame, second)   # both found before either is pushed
    frame.stack.extend(values)


@op("STORE_FAST_LOAD_FAST")
def _store_fast_load_fast(frame, inst):
    stored, loaded = inst.argval
    if loaded != stored:
        load_local(frame, loaded)   # an unbound local refuses before the store
    store_local(frame, stored, frame.pop())
    frame.push(load_local(frame, loaded))


@op("STORE_FAST_STORE_FAST")
def _store_fast_store_fast(frame, inst):
    first, second = inst.argval
    store_local(frame, first, frame.pop())
    store_local(frame, second, frame.pop())


# ---------------------------------------------------------------------- truth, calls, functions
@op("TO_BOOL")
def _to_bool(frame, inst):
    """Where a branch follows, the branch takes the truth value itself, as on 3.11 (so a graph
    break on a tensor's truth is at the branch and resumes on either side of it); COMPARE_OP's
    bool bit is left to the branch in the same way."""
    if frame.insts[frame.ip].opname not in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"):
        frame.stack[-1] = semantics.truth(frame.tracer, frame.stack[-1])


def _split_call_kw(stack: list, argc: int):
    """CALL_KW's (callable, args, kwargs): the keyword names are a tuple on top of the stack."""
    return split_call(stack[:-1], argc, stack[-1])


@op("CALL_KW")
def _call_kw(frame, inst):
    fn, args, kwargs = _split_call_kw(frame.stack, inst.arg)
    result = call(frame.tracer, fn, args, kwargs)
    frame.popn(inst.arg + 3)
    frame.push(result)


_FUNCTION_PARTS = {0x01: "defaults", 0x02: "kwdefaults", 0x04: "annotations", 0x08: "closure"}


@op("SET_FUNCTION_ATTRIBUTE")
def _set_function_attribute(frame, inst):
    """Stack [value, function] -> [function]. Only the tracer's SymFunction gets here: a graph break
    runs MAKE_FUNCTION and the SET_FUNCTION_ATTRIBUTEs after it as one step (native.py)."""
    fn, value = frame.pop(), frame.pop()
    if inst.arg == 0x04 and type(value) is tuple:   # (name, value, name, value, ...)
        value = dict(zip(value[::2], value[1::2]))
    setattr(fn, _FUNCTION_PARTS[inst.arg], tuple(value) if inst.arg == 0x08 else value)
    frame.push(fn)


# ---------------------------------------------------------------------- f-strings
def _plain(value):
    if contains_symbolic(value) or not semantics.is_plain(value):
        raise GraphBreak("formatting a tensor or object into a string needs its value")
    return concrete(value)   # a symbolic size formats as its value


HANDLERS.update({
    "CONVERT_VALUE": lambda frame, inst: frame.stack.__setitem__(
        -1, _CONVERSIONS[inst.arg](_plain(frame.stack[-1]))),
    "FORMAT_SIMPLE": lambda frame, inst: frame.stack.__setitem__(-1, format(_plain(frame.stack[-1]))),
    "FORMAT_WITH_SPEC": lambda frame, inst: frame.push(format(_plain(frame.stack[-2]), frame.popn(2)[1])),
})


# ---------------------------------------------------------------------- the same in real Python
@native("CALL_KW")
def _native_call_kw(action, stack):
    fn, args, kwargs = _split_call_kw(stack, action.inst.arg)
    del stack[len(stack) - action.inst.arg - 3:]
    stack.append(action.cache.ctx.native_callable(fn)(*args, **kwargs))
    return action.next_offset


def _replace_top(fn):
    def step(action, stack):
        stack[-1] = fn(action.inst, stack[-1])
        return action.next_offset
    return step


NATIVE_STEPS.update({
    "TO_BOOL": _replace_top(lambda inst, v: bool(v)),
    "CONVERT_VALUE": _replace_top(lambda inst, v: _CONVERSIONS[inst.arg](v)),
    "FORMAT_SIMPLE": _replace_top(lambda inst, v: format(v)),
})


@native("FORMAT_WITH_SPEC")
def _native_format_with_spec(action, stack):
    spec = stack.pop()
    stack[-1] = format(stack[-1], spec)
    return action.next_offset
