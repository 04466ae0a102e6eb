"""The symbolic bytecode interpreter: the run loop and the control-flow / variable opcodes.

Handlers for CPython 3.11 and 3.12 opcodes share this table; where the two versions
differ (``LOAD_ATTR``'s method bit, ``FOR_ITER``'s exhaustion target, ``PRECALL``), the
handler checks ``PY311``. Data opcodes (operators, containers, calls, attributes) are in
``ops_data.py``.
"""
from __future__ import annotations

import inspect
import types
import weakref

from minicompile.capture.interp.frame import PY311, PY313, Frame, push_callable
from minicompile.capture.interp.registry import HANDLERS, op
from minicompile.capture.interp.variables import (EMPTY, NULL, GenContext, GenContextExit, GradModeCtx, GradModeExit,
                                                  GraphBreak, LazyIter, MissingAttribute,
                                                  SymBoundMethod, SymCell, SymFunction, SymIter)
from minicompile.capture.python import semantics

MAX_STEPS = 200_000   # instructions per trace before a long loop becomes a graph break


class StopAtBreak(Exception):
    """The top frame reached an instruction marked as a graph break; stop before it."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


def run_frame(frame: Frame):
    """Interpret ``frame`` until it returns; returns the symbolic return value."""
    tracer = frame.tracer
    tracer.frames.append(frame)
    top = frame.depth == 0
    insts = frame.insts
    try:
        while True:
            inst = insts[frame.ip]
            if top:
                if inst.offset in tracer.forced_breaks:
                    raise StopAtBreak(inst.offset)
                tracer.top_offset = inst.offset
            frame.current = inst
            frame.ip += 1
            tracer.steps += 1
            try:
                HANDLERS[inst.opname](frame, inst)
            except (GraphBreak, StopAtBreak) as e:
                if isinstance(e, GraphBreak) and e.where is None:
                    e.where = frame.where()
                if isinstance(e, MissingAttribute) and frame.info.handles_exceptions:
                    # a try/with block here might have caught the AttributeError: not an answer
                    # hasattr/getattr may give, only a break
                    raise GraphBreak(e.reason, e.where) from None
                raise
            except Exception as e:  # a real Python error in user code, or a tracer gap
                raise GraphBreak(f"{type(e).__name__}: {e} (at {inst.opname})", frame.where()) from e
            if frame.returned:
                return frame.return_value
    finally:
        tracer.frames.pop()


# ---------------------------------------------------------------------- no-ops
@op("NOP", "RESUME", "EXTENDED_ARG", "PRECALL", "CACHE", "COPY_FREE_VARS", "MAKE_CELL_DONE")
def _nop(frame, inst):
    pass


# ---------------------------------------------------------------------- locals
@op("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(frame, inst):
    frame.push(load_local(frame, inst.argval))


@op("STORE_FAST")
def _store_fast(frame, inst):
    store_local(frame, inst.argval, frame.pop())


def load_local(frame, name: str):
    if name in frame.locals:
        return frame.locals[name]
    if name in frame.cells:   # 3.13 loads a cell itself (to build a closure) with LOAD_FAST
        return frame.cells[name]
    raise GraphBreak(f"UnboundLocalError: {name}")


def store_local(frame, name: str, v) -> None:
    if v is NULL:   # LOAD_FAST_AND_CLEAR's saved "unbound", restored after a comprehension
        frame.locals.pop(name, None)
    else:
        frame.locals[name] = v


# ---------------------------------------------------------------------- cells
@op("MAKE_CELL")
def _make_cell(frame, inst):
    name = inst.argval
    frame.cells[name] = SymCell(frame.locals.pop(name, EMPTY))


@op("LOAD_DEREF", "LOAD_CLASSDEREF")
def _load_deref(frame, inst):
    frame.push(cell_get(frame.tracer, frame.cells[inst.argval], inst.argval))


@op("STORE_DEREF")
def _store_deref(frame, inst):
    cell = frame.cells[inst.argval]
    v = frame.pop()
    if isinstance(cell, SymCell):
        cell.value = v
    else:
        frame.tracer.record_cell(cell, v)


def cell_get(tracer, cell, name: str):
    if isinstance(cell, SymCell):
        if cell.value is EMPTY:
            raise GraphBreak(f"NameError: free variable {name!r} referenced before assignment")
        return cell.value
    over = tracer.overlay(cell, "cell_contents")
    if over is not NULL:
        return over
    try:
        value = cell.cell_contents
    except ValueError:
        raise GraphBreak(f"NameError: free variable {name!r} is empty") from None
    src = tracer.source_of(cell) or tracer.const_source(cell, "cell")
    return tracer.wrap(value, f"{src}.cell_contents")


# ---------------------------------------------------------------------- globals
@op("LOAD_GLOBAL")
def _load_global(frame, inst):
    value = load_global(frame, inst.argval)
    if inst.arg & 1:
        push_callable(frame.stack, value)
    else:
        frame.push(value)


def load_global(frame: Frame, name: str):
    tracer = frame.tracer
    g = frame.globals
    over = tracer.overlay(g, name)
    if over is not NULL:
        return over
    if name in g:
        src = tracer.source_of(g) or tracer.const_source(g, "G")
        return tracer.wrap(g[name], f"{src}[{name!r}]")
    if name in frame.builtins:
        return frame.builtins[name]
    raise GraphBreak(f"NameError: name {name!r} is not defined")


@op("STORE_GLOBAL")
def _store_global(frame, inst):
    frame.tracer.record_global(frame.globals, inst.argval, frame.pop())


# ---------------------------------------------------------------------- moves, returns
@op("SWAP")
def _swap(frame, inst):
    s, n = frame.stack, inst.arg
    s[-1], s[-n] = s[-n], s[-1]


HANDLERS.update({
    "LOAD_FAST_AND_CLEAR": lambda frame, inst: frame.push(frame.locals.pop(inst.argval, NULL)),
    "DELETE_FAST": lambda frame, inst: frame.locals.__delitem__(inst.argval),
    "LOAD_CONST": lambda frame, inst: frame.push(inst.argval),
    "LOAD_CLOSURE": lambda frame, inst: frame.push(frame.cells[inst.argval]),
    "POP_TOP": lambda frame, inst: frame.pop(),
    "PUSH_NULL": lambda frame, inst: frame.push(NULL),
    "COPY": lambda frame, inst: frame.push(frame.stack[-inst.arg]),
    "END_FOR": lambda frame, inst: frame.popn(1 if PY313 else 2),
    "RETURN_VALUE": lambda frame, inst: _return(frame, frame.pop()),
    "RETURN_CONST": lambda frame, inst: _return(frame, inst.argval),
    "KW_NAMES": lambda frame, inst: setattr(frame, "kw_names", frame.code.co_consts[inst.arg]),
    "LOAD_ASSERTION_ERROR": lambda frame, inst: frame.push(AssertionError),
})


def _return(frame, value):
    frame.return_value = value
    frame.returned = True


# ---------------------------------------------------------------------- jumps
@op("JUMP_FORWARD", "JUMP", "JUMP_NO_INTERRUPT")
def _jump(frame, inst):
    frame.jump(inst.argval)


@op("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def _jump_backward(frame, inst):
    if frame.tracer.steps > MAX_STEPS:
        raise GraphBreak(f"loop runs over {MAX_STEPS} traced instructions")
    frame.jump(inst.argval)


def _pop_jump(test):
    def handler(frame, inst):
        v = frame.stack[-1]
        taken = test(frame.tracer, v)  # may raise before the stack changes
        frame.pop()
        if taken:
            frame.jump(inst.argval)
    return handler


_truth = semantics.truth
for _name, _test in {
    "TRUE": lambda t, v: _truth(t, v),
    "FALSE": lambda t, v: not _truth(t, v),
    "NONE": lambda t, v: v is None,
    "NOT_NONE": lambda t, v: v is not None,
}.items():
    HANDLERS[f"POP_JUMP_IF_{_name}"] = _pop_jump(_test)
    HANDLERS[f"POP_JUMP_FORWARD_IF_{_name}"] = _pop_jump(_test)
    HANDLERS[f"POP_JUMP_BACKWARD_IF_{_name}"] = _pop_jump(_test)


@op("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
def _jump_or_pop(frame, inst):
    v = frame.stack[-1]
    t = semantics.truth(frame.tracer, v)
    if t == (inst.opname == "JUMP_IF_TRUE_OR_POP"):
        frame.jump(inst.argval)
    else:
        frame.pop()


# ---------------------------------------------------------------------- iteration
@op("GET_ITER")
def _get_iter(frame, inst):
    v = frame.stack[-1]
    it = v if isinstance(v, SymIter) else SymIter(semantics.iterate(frame.tracer, v))
    frame.stack[-1] = it


@op("FOR_ITER")
def _for_iter(frame, inst):
    it = frame.stack[-1]
    if not isinstance(it, SymIter):
        raise GraphBreak(f"for-loop over a {type(it).__name__}")
    v = it.next()
    if v is NULL:
        frame.pop()
        if PY311:
            frame.jump(inst.argval)
        else:  # 3.12 jumps to END_FOR and skips it, 3.13 to END_FOR, POP_TOP and skips both
            frame.ip = frame.info.index_of[inst.argval] + (2 if PY313 else 1)
    else:
        frame.push(v)


# ---------------------------------------------------------------------- functions
@op("MAKE_FUNCTION")
def _make_function(frame, inst):
    code = frame.pop()
    flags = inst.arg or 0   # 3.13: no flags, SET_FUNCTION_ATTRIBUTE sets each part after
    closure = frame.pop() if flags & 0x08 else ()
    annotations = frame.pop() if flags & 0x04 else None
    if type(annotations) is tuple:   # (name, value, name, value, ...) since Python 3.10
        annotations = dict(zip(annotations[::2], annotations[1::2]))
    kwdefaults = frame.pop() if flags & 0x02 else None
    defaults = frame.pop() if flags & 0x01 else None
    frame.push(SymFunction(code, frame.globals, code.co_name, defaults, kwdefaults, tuple(closure), annotations))


@op("RAISE_VARARGS")
def _raise(frame, inst):
    raise GraphBreak("raise statement (runs in Python)")


@op("BEFORE_WITH")
def _before_with(frame, inst):
    ctx = frame.stack[-1]
    tracer = frame.tracer
    if isinstance(ctx, GenContext):   # @contextlib.contextmanager: run up to its yield
        value = ctx.gen.next()
        if value is NULL:
            raise GraphBreak("RuntimeError: generator didn't yield (contextmanager)")
        frame.pop()
        frame.push(GenContextExit(ctx.gen, inst.offset if frame.depth == 0 else None))
        frame.push(value)
        return
    if not isinstance(ctx, GradModeCtx):
        # A context manager written in Python: __enter__ inlined now, __exit__ when the
        # block is left normally (exception paths are not traced).
        enter, exit_ = (inspect.getattr_static(type(ctx), m, None) for m in ("__enter__", "__exit__"))
        if not (isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType)):
            raise GraphBreak(f"with-block over a {type(ctx).__name__} (its __enter__/__exit__ are not Python)")
        result = tracer.call(enter, [ctx], {})
        frame.pop()
        frame.push(SymBoundMethod(exit_, ctx))
        frame.push(result)
        return
    frame.pop()
    frame.push(GradModeExit(tracer.grad_enabled))
    tracer.set_grad(ctx.enabled)
    frame.push(None)  # what `as` would bind


@op("RETURN_GENERATOR")
def _return_generator(frame, inst):
    if frame.suspended is None:
        raise GraphBreak("generator")
    frame.push(None)  # what the POP_TOP after it discards when the generator starts


@op("YIELD_VALUE")
def _yield_value(frame, inst):
    """A generator's frame suspends (its ip and stack stay in the Frame) and ``run_frame``
    returns the item. 3.11 and 3.12 both
    follow it with RESUME, POP_TOP (which drops the sent value, None for next())."""
    if frame.suspended is False:
        frame.return_value = frame.pop()
        frame.returned = frame.suspended = True
    else:
        raise GraphBreak("generator")
    frame.push(None)  # the value sent back in


@op("GET_YIELD_FROM_ITER")
def _get_yield_from_iter(frame, inst):
    _get_iter(frame, inst)


@op("SEND")
def _send(frame, inst):
    """``yield from``: the next item of the sub-iterator (stack: receiver, sent value) replaces
    the sent value; once it is exhausted, its return value does and the loop is left. 3.11 also
    drops the receiver there; 3.12 leaves it to END_SEND (untested on 3.12)."""
    receiver, sent = frame.stack[-2], frame.stack[-1]
    if not isinstance(receiver, SymIter) or sent is not None:
        raise GraphBreak("yield from over a non-iterator, or send() of a value")
    value = receiver.next()
    if value is not NULL:
        frame.stack[-1] = value
        return
    frame.stack[-1] = receiver.result if isinstance(receiver, LazyIter) else None
    if PY311:
        del frame.stack[-2]
    frame.jump(inst.argval)


HANDLERS["END_SEND"] = lambda frame, inst: frame.stack.__delitem__(-2)


BROKEN_GENERATORS: weakref.WeakSet = weakref.WeakSet()   # generator code that broke when inlined


def generator(frame: Frame, cleanup: bool) -> LazyIter:
    """A called generator function: nothing runs until the first ``next``. With ``cleanup``
    (try/with blocks in its body) it may only run under a contextmanager, which always runs it
    to the end: a generator left suspended would run its ``finally`` when closed."""
    frame.suspended = False
    gen = None

    def produce():
        if cleanup and not gen.managed:
            raise GraphBreak("a generator with try/with blocks (its cleanup at close is not modeled)")
        frame.returned = False
        try:
            value = run_frame(frame)
        except GraphBreak as e:   # its frame cannot go on in Python: from now on the call
            BROKEN_GENERATORS.add(frame.code)   # itself breaks (the generator runs natively)
            e.retrace = True
            raise
        if frame.suspended:
            frame.suspended = False
            return value
        gen.result = value   # StopIteration.value, what `yield from` evaluates to
        return NULL

    gen = LazyIter(produce)
    gen.code = frame.code
    return gen


@op("IMPORT_NAME")
def _import_name(frame, inst):
    fromlist = frame.pop()
    level = frame.pop()
    frame.push(__import__(inst.argval, frame.globals, None, fromlist, level))


@op("IMPORT_FROM")
def _import_from(frame, inst):
    frame.push(getattr(frame.stack[-1], inst.argval))
