"""The training runtime: a ``torch.autograd.Function`` over a compiled forward and backward.

    graph = TrainingGraph(partition, joint, compile_fn, example_inputs)
    outputs = graph(*inputs)          # compiled forward; autograd records one node
    loss.backward()                   # that node runs the compiled backward

``compile_fn(gm, example_inputs, **part.about(half))`` is the pipeline's compiler for ATen graphs
(``pipeline.compile_aten``; the caller passes it, so aot/ never imports the pipeline). The
forward is compiled at once, and the backward beside it while the forward's kernels build, for
the saved values' layouts the compiled forward returns; the first backward uses it if its inputs
have those layouts, else compiles for them; if that compile fails, it is compiled for the
layouts it was traced with, and if that fails too its ATen graph runs eagerly
(config.fallback_on_error), on inputs copied into those layouts.
With symbolic sizes (Dynamo's ``s33``) both halves are compiled at once, each for every size, and
the backward's inputs are copied into the traced strides at each call's sizes where they differ
(``SymbolicLayouts``); saved sizes (SymInts, ints at run time) are kept beside the saved tensors.
Gradient outputs that are None reach backward as zeros (autograd materializes them); tangents
are made contiguous, as the backward graph was traced with. A backward that must itself be
differentiated (``create_graph=True``) raises: the saved values carry no autograd history, so
the gradient's own gradient would be silently wrong.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from minicompile.aot.fake import is_symbolic
from minicompile.aot.joint import JointGraph
from minicompile.aot.partition import Partition
from minicompile.config import config

log = logging.getLogger("minicompile")

DOUBLE_BACKWARD = (
    "minicompile: backward with create_graph=True (a gradient that is itself differentiated) is not "
    "supported by compiled training graphs; run this model eagerly or without minicompile for it")


class TrainingGraph:
    """Call it like the captured graph; outputs carry a grad_fn that runs the compiled backward."""

    def __init__(self, part: Partition, joint: JointGraph, compile_fn: Callable, example_inputs: list):
        self.partition = part
        self.joint = joint
        self.compile_fn = lambda gm, inputs, **kw: compile_fn(gm, inputs, **part.about("backward"), **kw)  # the backward's
        self.forward = compile_fn(part.forward, list(example_inputs), **part.about("forward"), wait=False)
        self.backward = self.ahead = None
        if any(is_symbolic(x) for x in example_inputs):
            self.backward = self._compile_symbolic_backward()
        elif (building := getattr(self.forward, "building", None)) is not None and not building.done():
            self.ahead = self._backward_ahead(example_inputs)   # while g++ runs: the backward's compile costs no time
        if hasattr(self.forward, "ready"):
            self.forward.ready()    # the forward's build errors are the compile's (the caller may fall back)
        self.forward_calls = 0
        self.backward_calls = 0

    def _compile_symbolic_backward(self):
        """With symbolic sizes (Dynamo's ``s33``) both halves serve every size, so the backward is
        compiled now, for the fake inputs it was traced with, not for a first call's tensors: inside
        Dynamo's compile, so a guard its compile adds to the ShapeEnv is one of Dynamo's guards (a
        later compile would specialise a graph Dynamo reuses for every size). Its errors are the
        caller's, as the forward's are (backend.compile_training falls back to eager for both)."""
        backward = self.partition.backward
        return SymbolicLayouts(backward, self.compile_fn(backward, traced_inputs(backward)))

    def _backward_ahead(self, example_inputs: list):
        """(its inputs' layouts, the backward compiled for them) while the forward's g++ runs (a
        forward from the cache leaves it to the first backward: a forward-only caller needs none):
        for the saved values as the compiled forward returns them and contiguous tangents."""
        layouts = getattr(self.forward, "output_layouts", lambda: None)()
        if layouts is None:
            return None
        n, part = self.joint.num_outputs, self.partition
        expected = [_layout(example_inputs[i]) for i in part.saved_primals] + layouts[n:]
        expected += [(lay[0], _contiguous(lay[0]), lay[2], lay[3]) for lay in (layouts[i] for i in self.joint.diff_outputs)]
        inputs = [torch.empty_strided(*e[:2], dtype=e[2], device=e[3]) if isinstance(e, tuple) else e for e in expected]
        try:
            compiled = self.compile_fn(part.backward, inputs, wait=False)
        except Exception as e:   # noqa: BLE001 - the first backward's, if its inputs are laid out so
            compiled = e
        return [_layout(x) for x in inputs], compiled

    @property
    def report(self):
        return self.partition.report

    def __call__(self, *args):
        outputs = list(TrainingFunction.apply(self, *args))
        for position, base, size, stride, offset, base_stride in self.joint.views:   # aliases as eager's (aot/joint._views)
            b = args[base] if base < 0 else outputs[base]   # a negative base: an input, counted from the end
            if base >= 0 and b.stride() != base_stride:   # its geometry holds for eager's layout only
                raise RuntimeError(f"minicompile: output {base}'s strides {b.stride()} are not eager's {base_stride}")
            outputs[position] = b if base < 0 else b.as_strided(size, stride, b.storage_offset() + offset)
        return tuple(outputs)

    def run_forward(self, args):
        self.forward_calls += 1
        flat = self.forward(*args)
        n = self.joint.num_outputs
        return tuple(flat[:n]), tuple(flat[n:])

    # loss.backward() may run inside a frame Dynamo is evaluating (a compiled train step): without
    # this, Dynamo would trace the compiler itself when the backward compiles.
    @torch.compiler.disable
    def run_backward(self, saved: list, tangents: list) -> tuple:
        self.backward_calls += 1
        inputs = list(saved) + list(tangents)
        if self.backward is None and self.ahead is not None:
            self.backward = self._take_ahead(inputs)
        if self.backward is None:
            self.backward = self._compile_backward(inputs)
        return tuple(self.backward(*inputs))

    def _take_ahead(self, inputs: list):
        """The backward compiled ahead if ``inputs`` have the layouts it was compiled for (its
        failure goes to ``_compile_backward``'s fallbacks, not compiled a second time); else None."""
        (expected, compiled), self.ahead = self.ahead, None
        if [_layout(x) for x in inputs] != expected:
            return None
        try:
            if isinstance(compiled, Exception):
                raise compiled
            return compiled.ready() and compiled
        except Exception as e:   # noqa: BLE001 - the fallbacks decide
            return self._compile_backward(inputs, e)

    def _compile_backward(self, inputs: list, error: Exception | None = None):
        """Compiled for the saved values as the forward really produced them; if that fails and
        their layouts differ from the traced ones, compiled for the traced layouts (the compiled
        forward may hand backward a view of a buffer it laid out, which the graph's own views,
        ``view`` after a ``permute``, do not allow). The forward has run, so a failed compile
        cannot fall back to the eager graph: the ATen backward graph itself runs eagerly instead
        (it computes the same gradients, op by op), on its inputs in the traced layouts. ``error``:
        the compile for these inputs failed already (ahead of the first backward)."""
        backward = self.partition.backward
        if error is None:
            try:
                return self.compile_fn(backward, inputs)
            except Exception as e:
                error = e
        if any(_restrided(x, t) is not x for x, t in zip(inputs, traced_inputs(backward))):
            # not a fallback: the same compiled backward, fed copies in the layouts it was traced in
            log.info("minicompile: compiling the backward for the forward's layouts failed (%s: %s); "
                     "compiling it for the traced layouts", type(error).__name__, error)
            try:
                return InTracedLayouts(backward, self.compile_fn(backward, in_layouts(inputs, traced_inputs(backward))))
            except Exception as e:
                error = e
        if not config.fallback_on_error:
            raise error
        log.warning("minicompile: compiling a backward graph failed (%s: %s); running it eagerly. "
                    "Set MINICOMPILE_FALLBACK=0 to raise instead.", type(error).__name__, error)
        return InTracedLayouts(backward, backward)


class TrainingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: TrainingGraph, *args):
        outputs, saved = graph.run_forward(args)
        ctx.graph = graph
        values = [*(args[i] for i in graph.partition.saved_primals), *saved]
        # sizes (python ints, a symbolic graph's saved SymInts) are kept on ctx; tensors saved
        ctx.numbers = {k: v for k, v in enumerate(values) if not isinstance(v, torch.Tensor)}
        ctx.save_for_backward(*(v for v in values if isinstance(v, torch.Tensor)))
        diff = set(graph.joint.diff_outputs)
        ctx.mark_non_differentiable(*(o for i, o in enumerate(outputs)
                                      if isinstance(o, torch.Tensor) and i not in diff))
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():  # autograd turns grad mode on in backward only for create_graph=True
            raise RuntimeError(DOUBLE_BACKWARD)
        graph: TrainingGraph = ctx.graph
        tangents = [grad_outputs[i].contiguous() for i in graph.joint.diff_outputs]
        grads = graph.run_backward(_saved(ctx), tangents)
        result = [None] * graph.joint.num_primals
        for position, slot in zip(graph.joint.grad_inputs, graph.partition.grad_slots):
            if slot is not None:
                result[position] = grads[slot]
        return (None, *result)


def _layout(x):
    """A tensor's (size, stride, dtype, device), a dimension of size 1 with a contiguous stride
    (nothing reads it); anything else as itself."""
    if not isinstance(x, torch.Tensor):
        return x
    dense = _contiguous(x.shape)
    return tuple(x.shape), tuple(s if n > 1 else d for s, d, n in zip(x.stride(), dense, x.shape)), x.dtype, x.device


def _contiguous(size) -> tuple:
    return torch.empty(size, device="meta").stride()


def _saved(ctx) -> list:
    """The saved values in order: the tensors autograd kept, the numbers in their places."""
    tensors = iter(ctx.saved_tensors)
    total = len(ctx.saved_tensors) + len(ctx.numbers)
    return [ctx.numbers[k] if k in ctx.numbers else next(tensors) for k in range(total)]


class InTracedLayouts:
    """``run`` (``gm`` or its compiled form) on copies of its tensor inputs in the strides ``gm``
    was traced with (its placeholders' ``meta["val"]``), where they differ."""

    def __init__(self, gm: torch.fx.GraphModule, run: Callable):
        self.run = run
        self.traced = traced_inputs(gm)

    def __call__(self, *args):
        return self.run(*in_layouts(args, self.traced))

    def __getattr__(self, name):     # a compiled graph's report, sources, ...
        return getattr(self.__dict__["run"], name)


def traced_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def in_layouts(args, traced: list) -> list:
    return [_restrided(a, t) for a, t in zip(args, traced)]


def _restrided(x, traced):
    if not (isinstance(x, torch.Tensor) and isinstance(traced, torch.Tensor)) or x.stride() == traced.stride():
        return x
    if not all(isinstance(s, int) for s in (*traced.shape, *traced.stride())) or tuple(x.shape) != tuple(traced.shape):
        return x
    return torch.empty_strided(x.shape, traced.stride(), dtype=x.dtype, device=x.device).copy_(x)


class SymbolicLayouts:
    """InTracedLayouts for a graph traced with symbolic sizes: each call binds the symbols from
    its inputs (a size ``s33`` of a traced input, a saved SymInt passed as an int), evaluates the
    traced strides at them, and copies an input laid out otherwise (in a dimension larger than 1)
    into those strides. The compiled graph indexes its inputs with the traced strides, so a saved
    value the compiled forward laid out its own way must not reach it as it is."""

    def __init__(self, gm: torch.fx.GraphModule, run: Callable):
        self.run = run
        self.traced = traced_inputs(gm)
        self._strides: dict = {}      # the bound sizes -> each input's strides (None: not a tensor)

    def __call__(self, *args):
        bound = _bindings(args, self.traced)
        key = tuple(sorted(bound.items(), key=str))
        strides = self._strides.get(key)
        if strides is None:
            strides = self._strides[key] = [_evaluated(t.stride(), bound) if isinstance(t, torch.Tensor) else None
                                            for t in self.traced]
        return self.run(*(_in_strides(a, want) for a, want in zip(args, strides)))

    def __getattr__(self, name):     # a compiled graph's report, sources, ...
        return getattr(self.__dict__["run"], name)


def _bindings(args, traced: list) -> dict:
    """Symbol -> this call's value, for every traced size that is a symbol alone."""
    bound = {}
    for a, t in zip(args, traced):
        if isinstance(t, torch.SymInt) and isinstance(a, int):
            pairs = [(t, a)]
        elif isinstance(t, torch.Tensor) and isinstance(a, torch.Tensor):
            pairs = zip(t.shape, a.shape)
        else:
            continue
        for size, value in pairs:
            if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                bound[size.node.expr] = value
    return bound


def _evaluated(sizes, bound: dict):
    """The sizes as ints at ``bound``; None where one names a symbol no input binds."""
    out = []
    for s in sizes:
        if isinstance(s, torch.SymInt):
            s = s.node.expr
            s = s.xreplace(bound) if hasattr(s, "xreplace") else s
            if not (isinstance(s, int) or s.is_Integer):
                return None
        out.append(int(s))
    return tuple(out)


def _in_strides(x, strides):
    if strides is None or not isinstance(x, torch.Tensor) or all(
            a == b or n <= 1 for a, b, n in zip(x.stride(), strides, x.shape)):
        return x
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)
