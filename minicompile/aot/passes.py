"""The ATen-graph passes, in order.

    aten = trace_inference(gm, example_inputs)                           aten_passes(): device-neutral
    aten = trace_inference(gm, example_inputs, compile_passes(CPU), CPU) the pipeline's list
    aten = prepare_aten(half_gm, example_inputs, CPU)                    after_trace_passes(CPU), for a
                                                                         graph that is ATen already
                                                                         (a half of the joint graph)

Each pass is ``(gm, ctx) -> gm`` (aot/trace.py), run by the one runner (aot/runner.py), which
stamps the result with the passes that constructed it and their times; a backend's policy
(aot/policy.py, the CPU's in cpu/) adds its claims and passes at fixed places and records the
choices it measured. Both print as the ATen graph's header. The result is an ``AtenProgram``
(aot/runner.py): the graph, the tensor attributes ``lift`` made inputs, the cached preparation
of its trailing inputs (the CPU's ``split_prepared``, cpu/prepare.py), the stamps and choices.
"""
from __future__ import annotations

import torch
from torch._guards import detect_fake_mode

from minicompile.aot import trace
from minicompile.aot.fake import refake_from, to_fake
from minicompile.aot.policy import NEUTRAL, DevicePolicy
from minicompile.aot.runner import AtenPass, AtenProgram, constructed_by, run_passes  # noqa: F401 (constructed_by: re-exported)


def _functionalize(gm, ctx):
    """trace.functionalize, run by the policy where it traces in its own way (``around_trace``:
    the CPU's traces CPU convolutions channels-last, cpu/conv_layout.py)."""
    around = ctx.policy.around_trace
    return trace.functionalize(gm, ctx) if around is None else around(trace.functionalize, gm, ctx)


def aten_passes(policy: DevicePolicy = NEUTRAL) -> tuple:
    """The ATen passes, in order, with ``policy``'s own at their places (aot/policy.py)."""
    return (
        *policy.before_trace,                                  # CPU: which inputs are parameters/buffers
        AtenPass("custom_ops", trace.custom_ops),              # mutating custom ops -> functional twins
        AtenPass("functionalize", _functionalize),             # make_fx + functionalize + our decompositions
        AtenPass("leftover_inplace", trace.leftover_inplace),  # in-place ops composite kernels left behind
        AtenPass("dce", trace.dce),
        *policy.after_trace,                                   # CPU: conv+BN, 1x1 conv, GELU folds; stamps
        AtenPass("input_meta", trace.input_meta),              # meta['val'] on int inputs and constants
        AtenPass("check_meta", trace.check_meta),              # every node carries meta['val']
        AtenPass("restride", trace.restride),                  # eager's strides on elementwise results
        AtenPass("alias_outputs", trace.alias_outputs),        # a mutated input returned is that input
    )


def compile_passes(policy: DevicePolicy = NEUTRAL) -> tuple:
    """The pipeline's list: it also lifts tensor attributes to inputs, so tracing never holds a real
    tensor, and runs the policy's ``prepare`` passes last (the CPU's moves values computed from
    parameters alone into a cached preparation: more inputs, which the pipeline's wrapper supplies,
    so other callers of trace_inference never see them)."""
    return (AtenPass("lift", trace.lift), *aten_passes(policy), *policy.prepare)


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list, passes=None,
                    policy: DevicePolicy = NEUTRAL) -> AtenProgram:
    """Trace ``gm`` (called with ``example_inputs``) to a functional, decomposed ATen graph.

    ``passes`` defaults to ``aten_passes(policy)``; ``policy`` is the backend's (aot/policy.py:
    the pipeline hands ``minicompile.cpu.CPU``), device-neutral when left out.
    Runs without autograd: only call it when no gradients are needed.
    """
    ctx = trace.PassContext(list(example_inputs), policy=policy)
    return ctx.program(run_passes(gm, ctx, aten_passes(policy) if passes is None else passes, "trace_inference"))


# -- graphs that are functional ATen already ------------------------------------------------------

def aten_inputs(gm, ctx):
    """The fake inputs of a graph that is ATen already: its placeholders' ``meta["val"]``, the
    fake tensors it was traced with. An input laid out differently only in dimensions of size 1
    (their strides mean nothing) gets its own layout, and the fake values downstream follow
    (``prepare_aten`` is called only for inputs laid out as traced, up to that)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ctx.fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders]) or detect_fake_mode(ctx.inputs)
    changed = set()
    for node, x in zip(placeholders, ctx.inputs):
        traced = node.meta.get("val")
        if traced is None or (isinstance(x, torch.Tensor) and x.stride() != traced.stride()):
            node.meta["val"] = to_fake(ctx.fake_mode, x)
            changed.add(node)
    if changed:
        refake_from(gm, ctx.fake_mode, changed)
    ctx.fake_inputs = [n.meta.get("val") for n in placeholders]
    return gm


def traced_as(gm: torch.fx.GraphModule, example_inputs: list) -> bool:
    """Each tensor input has the size, dtype and strides ``gm`` was traced with, strides compared
    only in dimensions larger than 1."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, x in zip(placeholders, example_inputs):
        t = node.meta.get("val")
        if isinstance(x, torch.Tensor) and not (
                isinstance(t, torch.Tensor) and x.shape == t.shape and x.dtype == t.dtype
                and all(a == b for a, b, n in zip(x.stride(), t.stride(), x.shape) if n > 1)):
            return False
    return True


def after_trace_passes(policy: DevicePolicy = NEUTRAL) -> tuple:
    """The passes after tracing (everything after dce in ``aten_passes(policy)``), for graphs that
    are functional ATen already: what the inference trace would have added, without tracing again."""
    passes = aten_passes(policy)
    traced = [p.name for p in passes].index("dce") + 1
    return (AtenPass("lift", trace.lift),
            AtenPass("aten_inputs", aten_inputs),            # fake inputs: the graph's own
            *policy.before_trace, *passes[traced:], *policy.prepare)


def prepare_aten(gm: torch.fx.GraphModule, example_inputs: list, policy: DevicePolicy = NEUTRAL,
                 constructed_by: tuple = ()) -> AtenProgram:
    """A functional ATen graph (a half of the joint graph) -> the pipeline's ATen program: the
    passes tracing would have run after make_fx, stamped after the runners in ``constructed_by``
    (a half's: Partition.about). ``gm`` is not changed (the passes work on a copy)."""
    copy = torch.fx.GraphModule(gm, _copy_graph(gm.graph))
    ctx = trace.PassContext(list(example_inputs), policy=policy, constructed_by=constructed_by)
    return ctx.program(run_passes(copy, ctx, after_trace_passes(policy), "compile_aten"))


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """The nodes copied, each with its own (shallow) copy of its meta."""
    new = torch.fx.Graph()
    env: dict = {}
    for node in graph.nodes:
        env[node] = new.node_copy(node, lambda a: env[a])
    return new
