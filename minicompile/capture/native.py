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

from minicompile.capture.frame import PY313, code_info
from minicompile.capture.registry import HANDLERS   # filled by interpreter.py and ops_data.py
from minicompile.capture.resume import NATIVE_STEPS, BreakAction
from minicompile.capture.variables import NULL

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


# Opcodes whose interpreter handler records into the trace: their real-Python meaning.
_REAL = {"LOAD_DEREF": lambda s, inst: s.push(s.cells[inst.argval].cell_contents),
         "STORE_DEREF": lambda s, inst: setattr(s.cells[inst.argval], "cell_contents", s.pop()),
         "MAKE_FUNCTION": _make_function}


class _State:
    """The frame as the interpreter's handlers see it, holding real values (and no tracer)."""

    tracer = None

    def __init__(self, cache, locals_: dict, cells: dict, stack: list):
        self.code, self.globals = cache.code, cache.globals
        self.locals, self.cells, self.stack = locals_, cells, stack
        self.kw_names, self.returned, self.return_value, self.yields, self.target = (), False, None, None, None

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

    def __init__(self, cache, offset: int, reason: str, where: str | None):
        self.cache, self.offset, self.reason, self.where = cache, offset, reason, where
        self.info = code_info(cache.code)
        self._actions: dict[int, BreakAction] = {}
        self.fast = self.run

    def run(self, L: tuple):
        code, cache = self.cache.code, self.cache
        names, cell_names = code.co_varnames, code.co_cellvars + code.co_freevars
        first = len(names) + len(cell_names)
        s = _State(cache, {n: v for n, v in zip(names, L) if v is not NULL},
                   dict(zip(cell_names, L[len(names):first])), list(L[first:]))
        offset = self.offset
        while True:
            offset = self._step(s, offset)
            if s.returned:
                return s.return_value
            if s.kw_names:
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

    def _step(self, s: _State, offset: int) -> int:
        """Execute the instruction at ``offset`` on ``s``; the offset of the next one."""
        index = self.info.index_of[offset]
        inst = self.info.insts[index]
        handler = HANDLERS[inst.opname] if inst.opname in _VALUE_MOVES else _REAL.get(inst.opname)
        if handler is not None:
            s.target = None
            handler(s, inst)
            if s.target is not None or s.returned:
                return s.target
            return self.info.insts[index + 1].offset
        if inst.opname not in NATIVE_STEPS:
            raise RuntimeError(f"minicompile capture: cannot resume {self.cache.code.co_name}() after a graph "
                               f"break ({self.reason} at {self.where}): {inst.opname} has no Python step. "
                               f"Run it without minicompile.compile, or move the construct into a helper.")
        action = self._actions.get(offset)
        if action is None:
            action = self._actions[offset] = BreakAction(self.cache, inst, s.kw_names, self.reason, self.where)
        s.kw_names = ()
        return action.step(action, s.stack)


__all__ = ["NativeEntry"]
