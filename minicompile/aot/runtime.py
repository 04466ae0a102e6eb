"""The training runtime: a ``torch.autograd.Function`` over a compiled forward and backward.

    graph = TrainingGraph(partition, joint, compile_fn, example_inputs)
    outputs = graph(*inputs)          # compiled forward; autograd records one node
    loss.backward()                   # that node runs the compiled backward

``compile_fn(gm, example_inputs)`` is the pipeline's compiler for ATen graphs
(``pipeline.compile_aten``; the caller passes it, so aot/ never imports the pipeline). The forward is compiled at once; the backward on the first
backward call, with the saved tensors the forward really produced (their strides included);
if that compile fails, it is compiled for the layouts it was traced with, and if that fails too
its ATen graph runs eagerly (config.fallback_on_error), on inputs copied into those layouts.
Gradient outputs that are None reach backward as zeros (autograd materializes them); tangents
are made contiguous, as the backward graph was traced with. A backward that must itself be
differentiated (``create_graph=True``) raises: the saved values carry no autograd history, so
the gradient's own gradient would be silently wrong.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

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
        self.compile_fn = compile_fn
        self.forward = compile_fn(part.forward, list(example_inputs))
        self.backward = None
        self.forward_calls = 0
        self.backward_calls = 0

    @property
    def report(self):
        return self.partition.report

    def __call__(self, *args):
        return TrainingFunction.apply(self, *args)

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
        if self.backward is None:
            self.backward = self._compile_backward(inputs)
        return tuple(self.backward(*inputs))

    def _compile_backward(self, inputs: list):
        """Compiled for the saved values as the forward really produced them; if that fails and
        their layouts differ from the traced ones, compiled for the traced layouts (the compiled
        forward may hand backward a view of a buffer it laid out, which the graph's own views,
        ``view`` after a ``permute``, do not allow). The forward has run, so a failed compile
        cannot fall back to the eager graph: the ATen backward graph itself runs eagerly instead
        (it computes the same gradients, op by op), on its inputs in the traced layouts."""
        backward = self.partition.backward
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
        ctx.save_for_backward(*(args[i] for i in graph.partition.saved_primals), *saved)
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
        grads = graph.run_backward(ctx.saved_tensors, tangents)
        result = [None] * graph.joint.num_primals
        for position, slot in zip(graph.joint.grad_inputs, graph.partition.grad_slots):
            if slot is not None:
                result[position] = grads[slot]
        return (None, *result)


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
