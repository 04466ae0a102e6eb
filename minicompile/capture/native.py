"""Run part of a frame in real Python when tracing cannot resume there.

After a graph break the frame is halfway through its call: the instructions before the
break have run (with their side effects), so neither fx nor eager can redo the call. When
the segment at a resume offset cannot be traced (a live value the tracer cannot wrap, a
construct with no split point), a ``NativeEntry`` runs the frame's instructions one at a
time in real Python -- the graph-break steps of ``resume.py`` plus the variable, stack and
container opcodes here -- and tries tracing again at each instruction it reaches for the
first time. Offsets known to be untraceable are stepped through in a loop, not recursively.
"""
from __future__ import annotations

import types

from minicompile.capture.frame import code_info
from minicompile.capture.registry import registrar
from minicompile.capture.resume import NATIVE_STEPS, BreakAction
from minicompile.capture.variables import NULL

# step(locals_, cells, stack, inst, cache) for opcodes that touch more than the stack;
# returns None to go on with the next instruction.
FRAME_STEPS: dict = {}
frame_step = registrar(FRAME_STEPS)


class _Return(Exception):
    def __init__(self, value):
        super().__init__()
        self.value = value


class NativeEntry:
    """The cache entry at an offset the tracer cannot resume from: always applies."""

    graph = None
    guards = None

    def __init__(self, cache, offset: int, reason: str, where: str | None):
        self.cache = cache
        self.offset = offset
        self.reason = reason
        self.where = where
        self.info = code_info(cache.code)
        self.nlocals = len(cache.code.co_varnames)
        self.ncells = len(cache.code.co_cellvars) + len(cache.code.co_freevars)
        self._actions: dict[int, BreakAction] = {}

    def fast(self, L: tuple):
        return self.run(L)

    def run(self, L: tuple):
        cache = self.cache
        first = self.nlocals + self.ncells
        locals_, cells, stack = list(L[:self.nlocals]), list(L[self.nlocals:first]), list(L[first:])
        offset, kw_names = self.offset, ()
        try:
            while True:
                offset, kw_names = self._step(offset, kw_names, locals_, cells, stack)
                if kw_names:
                    continue          # KW_NAMES .. CALL runs as one unit: the names live in no local
                state = (*locals_, *cells, *stack)
                entries = cache.entries.setdefault(offset, [])
                if not entries:
                    entry = cache.new_resume_entry(offset, state, record=False)
                    if isinstance(entry, NativeEntry):
                        continue
                    return entry.run(state)
                if len(entries) == 1 and isinstance(entries[0], NativeEntry):
                    continue
                return cache.resume(offset, state)
        except _Return as r:
            return r.value

    def _inst(self, offset: int):
        return self.info.insts[self.info.index_of[offset]]

    def _step(self, offset: int, kw_names: tuple, locals_, cells, stack) -> tuple:
        """Execute the instruction at ``offset``; (next offset, pending keyword names)."""
        inst = self._inst(offset)
        nxt = self.info.insts[self.info.index_of[offset] + 1].offset if inst.opname not in (
            "RETURN_VALUE", "RETURN_CONST") else None
        if inst.opname == "KW_NAMES":
            return nxt, self.cache.code.co_consts[inst.arg]
        step = FRAME_STEPS.get(inst.opname)
        if step is not None:
            step(locals_, cells, stack, inst, self.cache)
            return nxt, kw_names
        if inst.opname not in NATIVE_STEPS:
            raise RuntimeError(
                f"minicompile capture: cannot resume {self.cache.code.co_name}() after a graph break "
                f"({self.reason} at {self.where}), and {inst.opname} has no Python step. Run this "
                f"function without minicompile.compile, or move the construct into a helper function.")
        action = self._actions.get(offset)
        if action is None:
            action = self._actions[offset] = BreakAction(self.cache, inst, kw_names, self.reason, self.where)
        return action.step(action, stack), (() if inst.opname == "CALL" else kw_names)


# ---------------------------------------------------------------------- frame steps
@frame_step("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "END_FOR_NOP")
def _nop(locals_, cells, stack, inst, cache):
    pass


@frame_step("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(locals_, cells, stack, inst, cache):
    value = locals_[inst.arg]
    if value is NULL:
        raise UnboundLocalError(f"cannot access local variable {inst.argval!r} where it is not "
                                f"associated with a value")
    stack.append(value)


@frame_step("LOAD_FAST_AND_CLEAR")
def _load_fast_and_clear(locals_, cells, stack, inst, cache):
    stack.append(locals_[inst.arg])
    locals_[inst.arg] = NULL


@frame_step("STORE_FAST")
def _store_fast(locals_, cells, stack, inst, cache):
    locals_[inst.arg] = stack.pop()


@frame_step("DELETE_FAST")
def _delete_fast(locals_, cells, stack, inst, cache):
    locals_[inst.arg] = NULL


def _cell(cells, inst, cache) -> types.CellType:
    names = cache.code.co_cellvars + cache.code.co_freevars
    return cells[names.index(inst.argval)]


@frame_step("LOAD_DEREF", "LOAD_CLOSURE")
def _load_deref(locals_, cells, stack, inst, cache):
    cell = _cell(cells, inst, cache)
    stack.append(cell if inst.opname == "LOAD_CLOSURE" else cell.cell_contents)


@frame_step("STORE_DEREF")
def _store_deref(locals_, cells, stack, inst, cache):
    _cell(cells, inst, cache).cell_contents = stack.pop()


@frame_step("LOAD_CONST")
def _load_const(locals_, cells, stack, inst, cache):
    stack.append(inst.argval)


@frame_step("RETURN_VALUE")
def _return_value(locals_, cells, stack, inst, cache):
    raise _Return(stack.pop())


@frame_step("RETURN_CONST")
def _return_const(locals_, cells, stack, inst, cache):
    raise _Return(inst.argval)


@frame_step("POP_TOP")
def _pop_top(locals_, cells, stack, inst, cache):
    stack.pop()


@frame_step("END_FOR")
def _end_for(locals_, cells, stack, inst, cache):
    del stack[-2:]


@frame_step("PUSH_NULL")
def _push_null(locals_, cells, stack, inst, cache):
    stack.append(NULL)


@frame_step("COPY")
def _copy(locals_, cells, stack, inst, cache):
    stack.append(stack[-inst.arg])


@frame_step("SWAP")
def _swap(locals_, cells, stack, inst, cache):
    stack[-1], stack[-inst.arg] = stack[-inst.arg], stack[-1]


def _popn(stack: list, n: int) -> list:
    items = stack[len(stack) - n:] if n else []
    del stack[len(stack) - n:]
    return items


@frame_step("BUILD_TUPLE", "BUILD_LIST", "BUILD_STRING")
def _build_seq(locals_, cells, stack, inst, cache):
    items = _popn(stack, inst.arg)
    stack.append({"BUILD_TUPLE": tuple, "BUILD_LIST": list, "BUILD_STRING": "".join}[inst.opname](items))


@frame_step("BUILD_MAP")
def _build_map(locals_, cells, stack, inst, cache):
    items = _popn(stack, 2 * inst.arg)
    stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


@frame_step("BUILD_CONST_KEY_MAP")
def _build_const_key_map(locals_, cells, stack, inst, cache):
    keys = stack.pop()
    stack.append(dict(zip(keys, _popn(stack, inst.arg))))


@frame_step("BUILD_SLICE")
def _build_slice(locals_, cells, stack, inst, cache):
    stack.append(slice(*_popn(stack, inst.arg)))


@frame_step("LIST_APPEND")
def _list_append(locals_, cells, stack, inst, cache):
    v = stack.pop()
    stack[-inst.arg].append(v)


@frame_step("MAP_ADD")
def _map_add(locals_, cells, stack, inst, cache):
    v = stack.pop()
    k = stack.pop()
    stack[-inst.arg][k] = v


@frame_step("LIST_TO_TUPLE")
def _list_to_tuple(locals_, cells, stack, inst, cache):
    stack[-1] = tuple(stack[-1])


@frame_step("IS_OP")
def _is_op(locals_, cells, stack, inst, cache):
    b = stack.pop()
    a = stack.pop()
    stack.append((a is b) != bool(inst.arg))


@frame_step("LOAD_ASSERTION_ERROR")
def _load_assertion_error(locals_, cells, stack, inst, cache):
    stack.append(AssertionError)


@frame_step("MAKE_FUNCTION")
def _make_function(locals_, cells, stack, inst, cache):
    fn_code = stack.pop()
    flags = inst.arg
    closure = stack.pop() if flags & 0x08 else None
    annotations = stack.pop() if flags & 0x04 else None
    kwdefaults = stack.pop() if flags & 0x02 else None
    defaults = stack.pop() if flags & 0x01 else None
    fn = types.FunctionType(fn_code, cache.globals, fn_code.co_name, defaults, closure)
    fn.__qualname__ = fn_code.co_qualname
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) if isinstance(
            annotations, tuple) else annotations
    stack.append(fn)


__all__ = ["NativeEntry", "FRAME_STEPS"]
