"""Run part of a frame in real Python when tracing cannot resume there.

After a graph break the frame is halfway through its call: what ran before the break (and
its side effects) cannot be redone by an fx or eager fallback. When the segment at a resume
offset cannot be traced (a live value the tracer cannot wrap, a construct with no split
point), a ``NativeEntry`` runs the frame's instructions in real Python, one at a time --
the interpreter's handlers for opcodes that only move values, ``resume.py``'s native steps
for the rest -- and tries tracing again at each offset it reaches for the first time.
Offsets known to be untraceable are stepped through in a loop, not recursively.
"""
from __future__ import annotations

import types

from minicompile.capture.entries.resume import NATIVE_STEPS, BreakAction
from minicompile.capture.interp.frame import PY313, code_info, handler_for
from minicompile.capture.interp.registry import HANDLERS   # filled by interpreter.py and ops_data.py
from minicompile.capture.interp.variables import NULL, GraphBreak

# Interpreter handlers that only move values between locals, constants and the stack: they
# run unchanged on real values.
_VALUE_MOVES = {"NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "LOAD_FAST", "LOAD_FAST_CHECK",
                "LOAD_FAST_AND_CLEAR", "STORE_FAST", "DELETE_FAST", "LOAD_CONST", "LOAD_CLOSURE", "POP_TOP",
                "PUSH_NULL", "COPY", "SWAP", "END_FOR", "RETURN_VALUE", "RETURN_CONST", "JUMP_FORWARD",
                "JUMP", "JUMP_NO_INTERRUPT", "BUILD_TUPLE", "BUILD_LIST", "BUILD_MAP", "BUILD_CONST_KEY_MAP",
                "BUILD_STRING", "BUILD_SLICE", "LIST_APPEND", "MAP_ADD", "LIST_TO_TUPLE", "IS_OP",
                "KW_NAMES", "LOAD_ASSERTION_ERROR", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
                "STORE_FAST_STORE_FAST"}


def _make_function(s, inst):
    code, flags = s.pop(), inst.arg or 0
    if PY313:   # the SET_FUNCTION_ATTRIBUTEs that follow name the parts: one step with them
        info = code_info(s.code)
        i = info.index_of[inst.offset] + 1
        while info.insts[i].opname == "SET_FUNCTION_ATTRIBUTE":
            flags, i = flags | info.insts[i].arg, i + 1
        s.target = info.insts[i].offset
    closure = s.pop() if flags & 0x08 else None
    annotations = s.pop() if flags & 0x04 else None
    kwdefaults = s.pop() if flags & 0x02 else None
    fn = types.FunctionType(code, s.globals, code.co_name, s.pop() if flags & 0x01 else None, closure)
    fn.__qualname__, fn.__kwdefaults__ = code.co_qualname, kwdefaults
    if annotations:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2]))
    s.push(fn)


def _push_exc_info(s, inst):
    exc = s.pop()
    s.push(s.exc_info)     # restored by POP_EXCEPT when the handler is left
    s.exc_info = exc
    s.push(exc)


def _pop_except(s, inst):
    s.exc_info = s.pop()


def _reraise(s, inst):
    raise s.pop()


def _raise(s, inst):
    if inst.arg == 0:      # a bare ``raise`` in a handler: the exception being handled
        if s.exc_info is None:
            raise RuntimeError("No active exception to reraise")
        raise s.exc_info
    NATIVE_STEPS["RAISE_VARARGS"](types.SimpleNamespace(inst=inst), s.stack)


# Opcodes whose interpreter handler records into the trace, or that read the exception being
# handled (which only this frame's state holds): their real-Python meaning.
_REAL = {"LOAD_DEREF": lambda s, inst: s.push(s.cells[inst.argval].cell_contents),
         "STORE_DEREF": lambda s, inst: setattr(s.cells[inst.argval], "cell_contents", s.pop()),
         "STORE_GLOBAL": lambda s, inst: s.globals.__setitem__(inst.argval, s.pop()),
         "MAKE_FUNCTION": _make_function, "PUSH_EXC_INFO": _push_exc_info, "POP_EXCEPT": _pop_except,
         "RERAISE": _reraise, "RAISE_VARARGS": _raise}


class _State:
    """The frame as the interpreter's handlers see it, holding real values (and no tracer)."""

    tracer = None

    def __init__(self, cache, locals_: dict, cells: dict, stack: list):
        self.code, self.globals = cache.code, cache.globals
        self.locals, self.cells, self.stack = locals_, cells, stack
        self.kw_names, self.returned, self.return_value, self.target = (), False, None, None
        self.exc_info = None   # the exception a handler running here is handling

    @classmethod
    def of(cls, cache, values: tuple) -> "_State":
        """The state from a frame's values: its locals, cells, closure cells, then its stack."""
        names, cell_names = cache.code.co_varnames, cache.code.co_cellvars + cache.code.co_freevars
        first = len(names) + len(cell_names)
        return cls(cache, {n: v for n, v in zip(names, values) if v is not NULL},
                   dict(zip(cell_names, values[len(names):first])), list(values[first:]))

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n: int) -> list:
        items = self.stack[len(self.stack) - n:] if n else []
        del self.stack[len(self.stack) - n:]
        return items

    def jump(self, offset: int) -> None:
        self.target = offset


class NativeEntry:
    """The cache entry at an offset the tracer cannot resume from: always applies."""

    graph = guards = None

    def __init__(self, cache, offset: int, reason: str, where: str | None, trace: bool = True):
        self.cache, self.offset, self.reason, self.where = cache, offset, reason, where
        self.trace = trace            # False: run to the return in Python, compiling nothing more
        self._actions: dict[int, BreakAction] = {}
        self.fast = self.run

    def run(self, L: tuple):
        code, cache = self.cache.code, self.cache
        names, cell_names = code.co_varnames, code.co_cellvars + code.co_freevars
        s = _State.of(cache, L)
        offset = self.offset
        while True:
            try:
                next_offset = _step(cache, self._actions, s, offset, self.reason, self.where)
            except BaseException as e:   # noqa: B036 -- the frame's handlers decide
                error = e
                break
            offset = next_offset
            if s.returned:
                return s.return_value
            if s.kw_names or not self.trace:
                continue          # KW_NAMES .. CALL runs as one unit: the names live in no local
            state = (*(s.locals.get(n, NULL) for n in names), *(s.cells[n] for n in cell_names), *s.stack)
            entries = cache.entries.setdefault(offset, [])
            if not entries:
                entry = cache.new_resume_entry(offset, state, record=False)
                if isinstance(entry, NativeEntry):
                    continue
                return entry.run(state)
            if not (len(entries) == 1 and isinstance(entries[0], NativeEntry)):
                return cache.resume(offset, state)
        return _run_handlers(cache, s, offset, error, self._actions)


def unwind(cache, offset: int, error: BaseException, locals_: list, cells: list, stack: list):
    """``error`` was raised by the instruction at ``offset`` of a frame running after a graph
    break. Where the frame's exception table covers it (try/except/finally, a with-block's
    ``__exit__``), the handler runs in Python, and so does the rest of the frame (exception
    paths are not traced); otherwise it leaves the frame."""
    return _run_handlers(cache, _State.of(cache, (*locals_, *cells, *stack)), offset, error, {})


def _run_handlers(cache, s: _State, offset: int, error: BaseException, actions: dict):
    while True:
        if error is not None:
            handler = handler_for(cache.code, offset)
            if handler is None:
                raise error
            _, _, target, depth, lasti = handler
            del s.stack[depth:]
            if lasti:
                s.push(offset)
            s.push(error)
            offset, error = target, None
        try:
            next_offset = _step(cache, actions, s, offset, "an exception handler", None)
        except BaseException as e:   # noqa: B036 -- unwound at the top of the loop
            error = e
            continue
        offset = next_offset
        if s.returned:
            return s.return_value


def _step(cache, actions: dict, s: _State, offset: int, reason: str, where: str | None) -> int:
    """Execute the instruction at ``offset`` on ``s``; the offset of the next one."""
    info = code_info(cache.code)
    index = info.index_of[offset]
    inst = info.insts[index]
    handler = HANDLERS[inst.opname] if inst.opname in _VALUE_MOVES else _REAL.get(inst.opname)
    if handler is not None:
        s.target = None
        try:
            handler(s, inst)
        except GraphBreak:   # the tracer's break for an unbound local: running in Python, Python's error
            if not inst.opname.startswith("LOAD_FAST"):
                raise
            raise UnboundLocalError(f"cannot access local variable '{inst.argval}' where it is not associated "
                                    "with a value") from None
        if s.target is not None or s.returned:
            return s.target
        return info.insts[index + 1].offset
    if inst.opname not in NATIVE_STEPS:
        raise RuntimeError(f"minicompile capture: cannot resume {cache.code.co_name}() after a graph "
                           f"break ({reason} at {where}): {inst.opname} has no Python step. "
                           f"Run it without minicompile.compile, or move the construct into a helper.")
    action = actions.get(offset)
    if action is None:
        action = actions[offset] = BreakAction(cache, inst, s.kw_names, reason, where)
    s.kw_names = ()
    return action.step(action, s.stack)


def runs_natively(code: types.CodeType) -> bool:
    """Every instruction of ``code`` has a Python step and none is inside a try or with block
    (stepping does not unwind to handlers): a NativeEntry can run it to its return."""
    info = code_info(code)
    return not code.co_exceptiontable and all(
        i.opname in _VALUE_MOVES or i.opname in _REAL or i.opname in NATIVE_STEPS for i in info.insts)


__all__ = ["NativeEntry", "runs_natively", "unwind"]
