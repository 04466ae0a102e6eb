"""Trace one segment of a frame (from an offset to a return or a graph break) into an Entry.

A segment is traced, and if the tracer refuses an instruction of the top frame it is
traced again from scratch with that instruction marked as a break, so the graph never
holds half of a refused construct (a refusal deep inside an inlined call marks the
top-level call instruction that led there).
"""
from __future__ import annotations

import collections
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from minicompile.capture import dynamic
from minicompile.capture.entries.codegen import Reifier, compile_function, side_effect_lines
from minicompile.capture.entries.guards import Guards, check_source
from minicompile.capture.entries.resume import NATIVE_STEPS, BreakAction
from minicompile.capture.explain import GraphBreakError
from minicompile.capture.interp.frame import Frame, arg_names
from minicompile.capture.interp.interpreter import StopAtBreak, run_frame
from minicompile.capture.interp.tracer import Tracer
from minicompile.capture.interp.variables import (NULL, GenContext, GenContextExit, GradModeFunction, GraphBreak, OpenGenContext,
                                                  SpecialiseScalar, SymBoundMethod, SymCell, SymFunction, SymIter, TensorMethod,
                                                  TensorVar, unfinished)
from minicompile.capture.python import objects
from minicompile.capture.python.calls import call

MAX_RESTARTS = 64


class MISS_TYPE:
    def __repr__(self):
        return "MISS"


MISS = MISS_TYPE()


class CannotCapture(Exception):
    """Tracing this segment is impossible (no instruction to break at): fall back."""

    def __init__(self, reason: str, where: str | None):
        super().__init__(reason)
        self.reason = reason
        self.where = where


@dataclass
class Entry:
    """One compiled (guards, code) pair of a code object at one offset."""
    offset: int
    guards: Guards
    check: object            # check(L) -> bool, the guards as one compiled expression
    run: object              # run(L): graph + side effects + outputs (or the break)
    fast: object             # fast(L): check and run in one function; MISS when guards fail
    source: str              # generated source of ``fast``
    graph: torch.fx.GraphModule | None
    ops: int
    break_action: BreakAction | None = None
    extra: dict = field(default_factory=dict)


def trace_segment(cache, offset: int, L: tuple) -> Entry:
    """An entry for the frame at ``offset``: with symbolic sizes where the frame's sizes changed
    before (capture.dynamic), else, or where that fails, static."""
    sizes = cache.frame_sizes(offset)
    if sizes.wants_symbolic(L):
        try:
            return _trace(cache, offset, L, sizes)
        except Exception as e:  # any gap of the symbolic trace: the static trace is always right
            why = e.reason if isinstance(e, (CannotCapture, GraphBreak, GraphBreakError)) else f"{type(e).__name__}: {e}"
            sizes.give_up(why)
    return _trace(cache, offset, L, sizes)


def _trace(cache, offset: int, L: tuple, sizes) -> Entry:
    forced: dict = {}
    for _ in range(MAX_RESTARTS):
        tracer = Tracer(forced, call=call, sizes=sizes, symbolic=sizes.wants_symbolic(L))
        tracer.scalar_inputs = offset != 0
        tracer.specialised = specialised = cache.specialised_floats.setdefault(offset, set())
        frame = None
        try:
            frame = _make_frame(cache, tracer, offset, L)
            ret = run_frame(frame)
            return _build_entry(cache, tracer, offset, L, frame, ret=ret)
        except StopAtBreak as stop:
            try:
                return _build_entry(cache, tracer, offset, L, frame, break_offset=stop.offset,
                                    reason=forced[stop.offset])
            except OpenGenContext as e:   # Python enters that with-block instead
                if e.enter_offset in forced:
                    raise CannotCapture(e.reason, forced[stop.offset][1]) from None
                forced[e.enter_offset] = forced[stop.offset]
                continue
            except GraphBreak as e:
                if e.retrace:
                    continue
                raise CannotCapture(f"graph break at {forced[stop.offset][1]} "
                                    f"({forced[stop.offset][0]}) cannot be split: {e.reason}",
                                    e.where or forced[stop.offset][1]) from None
        except SpecialiseScalar as e:
            if e.source in specialised:
                raise CannotCapture(f"{e.reason} (already specialised)", e.where) from None
            specialised.add(e.source)   # trace again with that float a guarded constant
            continue
        except GraphBreak as e:
            if e.retrace:
                continue
            top = tracer.top_offset
            if frame is not None and top is not None and top not in forced:
                inst = frame.insts[frame.info.index_of[top]]
                if inst.opname in NATIVE_STEPS:
                    if cache.ctx.fullgraph:   # before the graph so far is compiled
                        raise GraphBreakError(cache.code.co_name, e.reason, e.where or frame.where())
                    forced[top] = (e.reason, e.where or frame.where())
                    continue
            raise CannotCapture(e.reason, e.where) from None
    raise CannotCapture(f"more than {MAX_RESTARTS} graph breaks in one segment", None)


def _make_frame(cache, tracer: Tracer, offset: int, L: tuple) -> Frame:
    """The top frame at ``offset``. ``L`` is the arguments then the closure cells (offset 0),
    or locals, cell variables, closure cells and the stack (after a graph break)."""
    code = cache.code
    if offset == 0:
        names = arg_names(code)
        tracer.source_names.update({f"L[{i}]": n for i, n in enumerate(names)})
        local_values = {name: tracer.wrap(L[i], f"L[{i}]") for i, name in enumerate(names)}
        cells = {name: tracer.wrap(L[len(names) + j], f"L[{len(names) + j}]")
                 for j, name in enumerate(code.co_freevars)}
        return Frame(tracer, code, cache.globals, local_values, cells, 0, 0)
    nlocals = len(code.co_varnames)
    cell_names = code.co_cellvars + code.co_freevars
    local_values = {}
    tracer.source_names.update({f"L[{i}]": n for i, n in enumerate(code.co_varnames)})
    for i, name in enumerate(code.co_varnames):
        v = tracer.wrap(L[i], f"L[{i}]")
        if v is not NULL:
            local_values[name] = v
    cells = {name: tracer.wrap(L[nlocals + j], f"L[{nlocals + j}]") for j, name in enumerate(cell_names)}
    first = nlocals + len(cell_names)
    stack = [tracer.wrap(L[k], f"L[{k}]") for k in range(first, len(L))]
    return Frame(tracer, code, cache.globals, local_values, cells, 0, offset, stack)


def _collect_tensors(values, out: dict, seen: set, new_objects: dict, sym_nodes) -> None:
    """Every TensorVar reachable from ``values`` (in a stable order), for graph outputs; a
    symbolic value among them that generated code cannot compute from ``L`` is a
    SymbolicUnsupported."""
    todo = list(values)
    while todo:
        v = todo.pop(0)
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, TensorVar):
            out.setdefault(id(v), v)
        elif isinstance(v, dynamic.SYM_TYPES) and sym_nodes.text(v) is None:
            raise dynamic.SymbolicUnsupported(f"a symbolic size ({v}) reaches Python code after the graph")
        elif id(v) in new_objects:
            todo.extend(objects.children(v))
        elif isinstance(v, (tuple, list, collections.deque)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, slice):
            todo.extend((v.start, v.stop, v.step))
        elif unfinished(v):
            e = GraphBreak("a generator that is not finished outlives the graph (it exists only in the tracer)")
            e.generator = v if v.code is not None and not v.managed else None
            raise e
        elif isinstance(v, SymIter):
            todo.extend(v.remaining())
        elif isinstance(v, SymCell):
            todo.append(v.value)
        elif isinstance(v, SymFunction):
            todo.extend((v.defaults, v.kwdefaults, v.closure))
        elif isinstance(v, SymBoundMethod):
            todo.extend((v.func, v.self_value))
        elif isinstance(v, TensorMethod):
            todo.append(v.tensor)
        elif isinstance(v, GradModeFunction):
            todo.append(v.func)
        elif isinstance(v, GenContext):
            todo.extend((v.args, v.kwargs))
        elif isinstance(v, GenContextExit) and v.enter_offset is not None:
            raise OpenGenContext(v.enter_offset)   # before the graph so far is compiled


_INPLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul,
                      operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow,
                      operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul}


def _mutates_inputs(graph: torch.fx.Graph) -> bool:
    for n in graph.nodes:
        if n.op == "call_method" and n.target.endswith("_") and not n.target.endswith("__"):
            return True
        if n.op == "call_function" and (n.target in _INPLACE_FUNCTIONS
                                        or getattr(n.target, "__name__", "").endswith("_")):
            return True
        if "out" in n.kwargs:
            return True
    return False


def _build_entry(cache, tracer: Tracer, offset: int, L: tuple, frame: Frame, ret=NULL,
                 break_offset: int | None = None, reason=None) -> Entry:
    code = cache.code
    if break_offset is None:
        live = [ret]
    else:
        locals_ = [frame.locals.get(n, NULL) for n in code.co_varnames]
        cells = [frame.cells[n] for n in code.co_cellvars + code.co_freevars]
        live = [locals_, cells, list(frame.stack)]
    live += [se.value for se in tracer.side_effects] + [t.copy for t in tracer.tracked]
    found: dict = {}
    try:
        _collect_tensors(live, found, set(), tracer.new_objects, tracer.sym_nodes)
    except GraphBreak as e:   # a traced generator outlives the graph: trace again with it called natively
        if e.generator is not None and e.generator.code not in tracer.forced_breaks:
            why = f"a generator from {e.generator.code.co_name}() outlives the graph unfinished (it runs in Python)"
            tracer.forced_breaks[e.generator.code], e.retrace = why, True
        raise
    outputs = [v for v in found.values() if v.source is None]
    graph = tracer.graph
    ops = sum(1 for n in graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    ns = tracer.ns
    if _mutates_inputs(graph):
        # In-place ops make aliasing visible: this graph holds only for inputs that share no
        # memory, except those that shared a storage in the trace.
        tensors = [i for i in tracer.inputs if isinstance(i.real, torch.Tensor) and not i.source.startswith("_f64(")]
        storage = {}
        groups = tuple(storage.setdefault(i.real.untyped_storage().data_ptr() or id(i), len(storage)) for i in tensors)
        tracer.guards.distinct_storages([i.source for i in tensors], groups)
    lines = []
    gm = None
    if ops:
        graph.output(tuple(v.node for v in outputs))
        gm = torch.fx.GraphModule(torch.nn.Module(), graph, class_name=f"Graph_{code.co_name}")
        example = [inp.real for inp in tracer.inputs]
        compiled = cache.ctx.backend(gm, example)
        name = ns.const(compiled, "graph")
        lines.append(f"o = {name}({', '.join(inp.source for inp in tracer.inputs)})")
    if tracer.symbolic_inputs or tracer.symbolic_ints:
        _shape_guards(tracer, cache.frame_sizes(offset))
    if tracer.grad_changed:  # leave grad mode as the traced code did, whatever the backend did
        ns.values["_set_grad"] = torch._C._set_grad_enabled
        lines.append(f"_set_grad({tracer.grad_enabled})")
    r = Reifier(tracer, ns, {id(v): i for i, v in enumerate(outputs)})
    effects = side_effect_lines(tracer, r)
    action = None
    if break_offset is None:
        final = f"return {r.expr(ret)}"
    else:
        inst = frame.insts[frame.info.index_of[break_offset]]
        action = BreakAction(cache, inst, frame.kw_names, reason[0], reason[1])
        lists = [f"[{', '.join(r.expr(v) for v in group)}]" for group in live[:3]]
        final = f"return {ns.const(action, 'brk')}({', '.join(lists)})"
    body = lines + r.lines + r.late + effects + [final]
    run_src = "def run(L):\n" + "".join(f"    {b}\n" for b in body)
    guard_expr = " and ".join(f"({e})" for e in tracer.guards.exprs) or "True"
    fast_src = (f"def fast(L):\n    try:\n        ok = {guard_expr}\n    except Exception:\n"
                f"        ok = False\n    if not ok:\n        return _MISS\n"
                + "".join(f"    {b}\n" for b in body))
    ns.values["_MISS"] = MISS
    where = f"<minicompile {code.co_name}@{offset}>"
    run = compile_function(run_src, ns, "run", where)
    fast = compile_function(fast_src, ns, "fast", where)
    check, _ = tracer.guards.compile("check")
    entry = Entry(offset, tracer.guards, check, run, fast, fast_src, gm, ops, action)
    cache.ctx.report.record_entry(cache, entry, check_source(tracer.guards.exprs, "check"))
    return entry


def _shape_guards(tracer: Tracer, sizes) -> None:
    """Guard a symbolic trace with its ShapeEnv's guards (taken after the backend compiled, so
    they hold what the pipeline relied on too); a size the trace pinned to one value stays
    static in later traces."""
    values = [(i.source, i.var.fake) for i in tracer.symbolic_inputs] + tracer.symbolic_ints
    exprs = dynamic.produce_guards([v for _, v in values], [s for s, _ in values])
    if exprs:
        tracer.guards.add(*exprs, kind="SHAPE_ENV", what="sizes", check=" and ".join(exprs))
    for source, value in values:
        for d, n in dynamic.specialised(value):
            sizes.pin(source, d, f"the trace needed its value ({n})")


__all__ = ["trace_segment", "Entry", "CannotCapture", "MISS"]
