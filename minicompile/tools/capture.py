"""Run a model under a capture front end and keep what it did, as capture's CaptureReport.

A front end is a function ``(model, example_inputs) -> CaptureReport`` registered in
FRONTENDS. Both compile every graph with ``minicompile_backend`` through a recording
wrapper, so each GraphRecord also holds what the backend compiled and the inputs it saw:

  "dynamo"       ``torch.compile``; breaks and guards come from ``torch._dynamo.explain``
  "minicompile"  minicompile's own bytecode capture (``minicompile.explain``)

``capture_dynamo(..., train=True)`` captures for training instead: floating-point inputs
require grad, grad mode is on, and one backward runs (``torch.autograd.grad`` of every
differentiable output with a gradient of ones), so each graph's record holds a TrainingGraph
whose forward and backward have both compiled; the report's outputs are the model's outputs
followed by the gradients of the inputs and parameters, compiled and eager.
"""
from __future__ import annotations

import inspect
import os
from typing import Callable

import torch

from minicompile.aot.runtime import TrainingGraph
from minicompile.backend import PerShapeGraph, minicompile_backend
from minicompile.capture.api import explain as capture_explain
from minicompile.capture.explain import BreakRecord, CaptureReport, EntryRecord, GraphRecord, GuardRecord
from minicompile.pipeline import CompiledGraph

FRONTENDS: dict[str, Callable] = {}


def register_frontend(name: str):
    def wrap(fn):
        FRONTENDS[name] = fn
        return fn
    return wrap


class RecordingBackend:
    """``minicompile_backend``, remembering for each graph its example inputs and result."""

    def __init__(self):
        self.seen: dict = {}      # GraphModule -> (example inputs, what the backend returned)
        self.order: list = []     # GraphModules in compile order

    def __call__(self, gm, example_inputs):
        compiled = minicompile_backend(gm, example_inputs)
        self.seen[gm] = (list(example_inputs), compiled)
        self.order.append(gm)
        return compiled

    def fill(self, rec: GraphRecord) -> None:
        """Attach the compiled graph (after the first call, so a per-shape graph has compiled)."""
        rec.example_inputs, compiled = self.seen.get(rec.graph, ([], None))
        if isinstance(compiled, PerShapeGraph):
            compiled = next(iter(compiled.compiled.values()), None)
        if isinstance(compiled, (CompiledGraph, TrainingGraph)):
            rec.compiled = compiled
        else:
            rec.note = "runs eagerly (a training graph the runtime cannot compile; the warning says why)"


@register_frontend("minicompile")
def capture_minicompile(model, example_inputs: tuple) -> CaptureReport:
    backend = RecordingBackend()
    with torch.no_grad():
        eager_output = model(*example_inputs)
        report = capture_explain(model, backend=backend)(*example_inputs)
    report.frontend, report.eager_output = "minicompile", eager_output
    # A function that fell back to torch.fx.symbolic_trace was still compiled: show that graph too.
    captured = {rec.graph for rec in report.graphs}
    fx_fallbacks = [f for f in report.fallbacks if f.kind == "fx"]
    for gm, fallback in zip([gm for gm in backend.order if gm not in captured], fx_fallbacks):
        report.graphs.append(GraphRecord(fallback.code_name, 0, gm, _ops(gm)))
    for rec in report.graphs:
        backend.fill(rec)
    return report


@register_frontend("dynamo")
def capture_dynamo(model, example_inputs: tuple, train: bool = False) -> CaptureReport:
    report = CaptureReport("dynamo")
    backend = RecordingBackend()
    names: dict = {}

    def recording_backend(gm, inputs):
        names[gm] = _graph_name(torch._guards.TracingContext.try_get(), model)
        return backend(gm, inputs)

    torch._dynamo.reset()
    run = _run_training if train else _run_inference
    with torch.enable_grad() if train else torch.no_grad():
        report.eager_output = run(model, example_inputs)
        report.output = run(torch.compile(model, backend=recording_backend, dynamic=False), example_inputs, model)
        # Graph breaks and guards come from Dynamo's own explain (a second, cheap trace).
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(*example_inputs)
    torch._dynamo.reset()
    for gm in backend.order:
        report.graphs.append(GraphRecord(names[gm], 0, gm, _ops(gm)))
        backend.fill(report.graphs[-1])
    report.breaks = [_break_record(b) for b in explained.break_reasons]
    frame_locals = _frame_locals(model, example_inputs)
    guards = [_guard_record(g, frame_locals) for g in explained.out_guards]
    report.entries = [EntryRecord(names[backend.order[0]] if backend.order else "", 0, guards, "")]
    return report


def _graph_name(context, model) -> str:
    """The user's function a graph came from: the first traced code outside torch (Dynamo's first
    is often its own wrapper, e.g. ``inner``), else the model's class or function name."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    for code in (context.traced_code if context else None) or ():
        if not code.co_filename.startswith(torch_dir):
            return code.co_name
    return type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "model")


def _run_inference(fn, example_inputs: tuple, model=None):
    return fn(*example_inputs)


def _run_training(fn, example_inputs: tuple, model=None):
    """``fn``'s outputs, then the gradients of its floating-point inputs and of ``model``'s
    parameters (those that get none left out), for a gradient of ones on every output."""
    model = fn if model is None else model
    inputs = [x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in example_inputs]
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    wrt += list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    out = fn(*inputs)
    diff = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = torch.autograd.grad(diff, wrt, [torch.ones_like(o) for o in diff], allow_unused=True)
    return out, [g for g in grads if g is not None]


def _ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def _first_lines(reason: str, n: int = 2) -> str:
    lines = [ln.strip() for ln in str(reason).strip().splitlines() if ln.strip()]
    return " ".join(lines[:n])


def _break_record(reason) -> BreakRecord:
    """Dynamo's break reason, placed at the innermost user frame of its stack."""
    if not reason.user_stack:
        return BreakRecord("", _first_lines(reason.reason), "")
    frame = reason.user_stack[-1]
    return BreakRecord(frame.name, _first_lines(reason.reason), f"{frame.filename}:{frame.lineno}")


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
