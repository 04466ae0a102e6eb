"""The tracer against CPython, opcode by opcode, on whichever Python runs the tests.

``CASES`` is a list of small functions that, between them, make the running interpreter emit
every opcode the tracer has a handler for (3.11's PRECALL and LOAD_METHOD, 3.12's inlined
comprehensions and LOAD_SUPER_ATTR, 3.13's superinstructions, CALL_KW, TO_BOOL, ...);
``test_cases_cover_the_opcode_table`` checks that with ``dis``. Each case runs captured and
eagerly on the same inputs, then again on new ones, and must agree: results, side effects and
the exception raised. Run under 3.11, 3.12 and 3.13 (docs/capture.md says which were run).
"""
import dis
import types

import pytest
import torch

from minicompile.capture import compile as capture_compile
from minicompile.capture import explain as capture_explain
from minicompile.capture.entries.native import _REAL, _State
from minicompile.capture.interp.registry import HANDLERS
from tests.capture import opcode_cases as cases
from tests.capture.opcode_cases import BREAK_CASES, CASES, HELPERS, NOT_EMITTED, asserts, globals_and_imports, raises
from tests.helpers import same


def _inputs(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, generator=g), n


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _outcome(fn, *args):
    """What ``fn(*args)`` does: ("ok", result) or ("raise", exception type, message)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # the case's own exception, compared with CPython's
        return ("raise", type(e), str(e))


def _agree(got, expected):
    assert got[0] == expected[0], f"{got} vs {expected}"
    if got[0] == "raise":
        assert got[1:] == expected[1:]
    else:
        assert same(got[1], expected[1]), f"{got[1]}\nvs CPython\n{expected[1]}"


def _check(fn, inputs):
    compiled = capture_compile(fn)
    for args in inputs:
        _agree(_outcome(compiled, *args), _outcome(fn, *args))
    return compiled.capture_report


def test_cases_cover_the_opcode_table():
    emitted = {inst.opname for fn in CASES + BREAK_CASES + HELPERS
               for code in _code_objects(fn.__code__) for inst in dis.get_instructions(code)}
    ours = {name for name in HANDLERS if dis.opmap.get(name, 256) < 256} - NOT_EMITTED
    assert ours - emitted == set(), f"handled opcodes no case emits on this Python: {sorted(ours - emitted)}"
    unhandled = {name for name in emitted if name not in HANDLERS}
    # what is left is exception-handling bytecode, which traced code never runs (frame.py)
    assert unhandled <= {"PUSH_EXC_INFO", "POP_EXCEPT", "RERAISE", "WITH_EXCEPT_START", "CHECK_EXC_MATCH",
                         "CLEANUP_THROW"}, sorted(unhandled)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_case_matches_cpython_in_one_graph(fn):
    report = capture_explain(fn)(*_inputs(0, 3))
    assert report.fallbacks == [] and report.break_count == 0, report
    _check(fn, [_inputs(0, 3), _inputs(1, 3), _inputs(3, 5), _inputs(4, 0)])
    if fn in (asserts, raises):
        _check(fn, [(torch.randn(2), 4)])   # the assert fails, the raise runs: as in CPython


def test_side_effects_match_cpython():
    cases.TOUCHED.clear()
    for fn in (globals_and_imports, capture_compile(globals_and_imports)):
        cases.COUNT = 0
        fn(*_inputs(0, 3))
        assert cases.COUNT == 6
    assert cases.TOUCHED == [3, 3]


@pytest.mark.parametrize("fn", BREAK_CASES, ids=lambda f: f.__name__)
def test_graph_break_resumes_like_cpython(fn):
    report = _check(fn, [_inputs(0, 3), _inputs(1, 3), _inputs(2, 2), _inputs(3, 1)])
    assert report.break_count >= 1, report
    assert report.fallbacks == [], report


def _outer(a):
    def inner(q=1, *, k=2) -> int:
        return q + a + k
    return inner


def test_native_make_function_builds_what_cpython_builds():
    """Where a frame runs in Python after a break (native.py), MAKE_FUNCTION (and on 3.13 the
    SET_FUNCTION_ATTRIBUTEs after it, as one step) builds the function CPython builds."""
    code = next(c for c in _outer.__code__.co_consts if isinstance(c, types.CodeType))
    cell = types.CellType(10)
    state = _State(types.SimpleNamespace(code=_outer.__code__, globals=globals()), {}, {"a": cell},
                   [(1,), {"k": 2}, ("return", int), (cell,), code])
    inst = next(i for i in dis.get_instructions(_outer) if i.opname == "MAKE_FUNCTION")
    _REAL["MAKE_FUNCTION"](state, inst)
    fn, expected = state.stack.pop(), _outer(10)
    assert state.stack == [] and (fn(), fn(5, k=1)) == (expected(), expected(5, k=1)) == (13, 16)
    assert fn.__annotations__ == expected.__annotations__
    after = state.target if state.target is not None else inst.offset + 2
    assert next(i for i in dis.get_instructions(_outer) if i.offset == after).opname == "STORE_FAST"
