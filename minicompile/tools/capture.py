"""Run a model under a capture front end and keep what it did: graphs, breaks, guards.

A front end is a function ``(model, example_inputs) -> CaptureReport`` registered in
FRONTENDS. "dynamo" drives ``torch.compile`` with a recording backend that hands each
graph to ``minicompile_backend``; minicompile's own bytecode capture (capture/) registers
here when it lands, and the same printers show its graphs, breaks and guards.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from minicompile.backend import PerShapeGraph, minicompile_backend
from minicompile.pipeline import CompiledGraph


@dataclass
class GraphRecord:
    index: int
    fx_graph: torch.fx.GraphModule
    example_inputs: list
    compiled: CompiledGraph | None = None
    note: str = ""   # why there is no CompiledGraph (ran eagerly, ...)


@dataclass
class GraphBreak:
    reason: str
    where: str       # "file:line in function", or "" when unknown


@dataclass
class GuardRecord:
    kind: str        # TENSOR_MATCH, CONSTANT_MATCH, TYPE_MATCH, ...
    what: str        # the guarded value, e.g. L['x']
    check: str       # what is checked, readably

    def __str__(self):
        return f"{self.kind:<28} {self.what:<40} {self.check}".rstrip()


@dataclass
class CaptureReport:
    frontend: str
    graphs: list = field(default_factory=list)    # GraphRecord
    breaks: list = field(default_factory=list)    # GraphBreak
    guards: list = field(default_factory=list)    # GuardRecord
    outputs: Any = None                           # what the compiled model returned
    eager_outputs: Any = None                     # what the model returned eagerly


FRONTENDS: dict[str, Callable] = {}


def register_frontend(name: str):
    def wrap(fn):
        FRONTENDS[name] = fn
        return fn
    return wrap


@register_frontend("dynamo")
def capture_dynamo(model, example_inputs: tuple) -> CaptureReport:
    report = CaptureReport("dynamo")

    def recording_backend(gm, inputs):
        compiled = minicompile_backend(gm, inputs)
        rec = GraphRecord(len(report.graphs), gm, list(inputs))
        if isinstance(compiled, CompiledGraph):
            rec.compiled = compiled
        elif isinstance(compiled, PerShapeGraph):
            rec.compiled = compiled   # resolved to a CompiledGraph after the first call below
        else:
            rec.note = "runs eagerly (the graph needs gradients)"
        report.graphs.append(rec)
        return compiled

    torch._dynamo.reset()
    with torch.no_grad():
        report.eager_outputs = model(*example_inputs)
        report.outputs = torch.compile(model, backend=recording_backend, dynamic=False)(*example_inputs)
        for rec in report.graphs:
            if isinstance(rec.compiled, PerShapeGraph):
                per_shape = rec.compiled
                rec.compiled = next(iter(per_shape.compiled.values()), None)
        # Graph breaks and guards come from Dynamo's own explain (a second, cheap trace).
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(*example_inputs)
    torch._dynamo.reset()
    report.breaks = [GraphBreak(_first_lines(b.reason), _where(b.user_stack)) for b in explained.break_reasons]
    frame_locals = _frame_locals(model, example_inputs)
    report.guards = [_guard_record(g, frame_locals) for g in explained.out_guards]
    return report


def _first_lines(reason: str, n: int = 2) -> str:
    lines = [ln.strip() for ln in str(reason).strip().splitlines() if ln.strip()]
    return " ".join(lines[:n])


def _where(stack) -> str:
    if not stack:
        return ""
    frame = stack[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _frame_locals(model, example_inputs) -> dict:
    """The model's arguments by name, so guards on L['x'] can show x's dtype and shape."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        bound = inspect.signature(fn).bind(*example_inputs)
    except (TypeError, ValueError):
        return {}
    names = dict(bound.arguments)
    if isinstance(model, torch.nn.Module):
        names["self"] = model
    return names


def _guard_record(guard, frame_locals: dict) -> GuardRecord:
    kind = guard.create_fn_name()
    what = guard.name or guard.source.name.lower()
    check = "; ".join(guard.code_list or [])
    if kind == "TENSOR_MATCH":
        check = "dtype, device, shape, stride, requires_grad, dispatch keys"
        try:
            t = eval(what, {"L": frame_locals})  # noqa: S307 - a Dynamo source expression like L['x']
            check = f"{_tensor_desc(t)} (dtype, device, shape, stride, requires_grad)"
        except Exception:  # G[...] or a source we cannot rebuild: keep the generic text
            pass
    return GuardRecord(kind, what, check)


def _tensor_desc(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} stride {tuple(t.stride())} {t.device}"
