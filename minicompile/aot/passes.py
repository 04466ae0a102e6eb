"""The ATen-graph passes, in order.

    aten_gm = trace_inference(gm, example_inputs)                  ATEN_PASSES
    aten_gm = trace_inference(gm, example_inputs, COMPILE_PASSES)  + lift, split_prepared (the pipeline's list)
    aten_gm = prepare_aten(aten_gm, example_inputs)                AFTER_TRACE_PASSES, for a graph that is
                                                                   ATen already (a half of the joint graph)

Each pass is ``(gm, ctx) -> gm`` (aot/trace.py), run by the one runner (aot/runner.py), which
stamps the result with the passes that constructed it and their times (printed as a header on
the ATen graph). ``gm.meta["lifted"]`` holds the tensor attributes ``lift`` made inputs,
``gm.meta["prepared"]`` (after ``split_prepared``) the cached preparation of its trailing inputs
(aot/prepare.py).
"""
from __future__ import annotations

import torch
from torch._guards import detect_fake_mode

from minicompile.aot import trace
from minicompile.aot.fake import refake_from, to_fake
from minicompile.aot.runner import AtenPass, constructed_by, run_passes  # noqa: F401 (constructed_by: re-exported)
from minicompile.aot.conv_layout import functionalize_channels_last, pointwise_convs_as_linear
from minicompile.aot.cpu_policy import fold_gelu_into_onednn_linear, use_onednn_linear
from minicompile.aot.prepare import fold_conv_bn, split_prepared, static_inputs


def _fold_gelu(gm, ctx):
    """CPU policy (aot/cpu_policy.py): GELU after a oneDNN linear becomes its post-op."""
    fold_gelu_into_onednn_linear(gm)
    return gm


def _pointwise_convs(gm, ctx):
    """CPU policy (aot/conv_layout.py): a 1x1 convolution of NHWC pixels runs as a matrix product
    (oneDNN's linear or mm, by the GEMM choice)."""
    pointwise_convs_as_linear(gm, ctx.fake_mode, use_onednn_linear)
    return gm


def _functionalize(gm, ctx):
    """trace.functionalize, with CPU convolutions fed channels-last (aot/conv_layout.py)."""
    return functionalize_channels_last(trace.functionalize, gm, ctx)


ATEN_PASSES = (
    AtenPass("static_inputs", static_inputs),              # which inputs are parameters/buffers (aot/prepare.py)
    AtenPass("custom_ops", trace.custom_ops),              # mutating custom ops -> functional twins
    AtenPass("functionalize", _functionalize),             # make_fx + functionalize + our decompositions
    AtenPass("leftover_inplace", trace.leftover_inplace),  # in-place ops composite kernels left behind
    AtenPass("dce", trace.dce),
    AtenPass("fold_conv_bn", fold_conv_bn),                # conv * s + t, s and t from parameters: one conv
    AtenPass("pointwise_convs", _pointwise_convs),         # CPU: 1x1 conv of NHWC -> oneDNN linear
    AtenPass("fold_gelu", _fold_gelu),                     # CPU: GELU into oneDNN's linear
    AtenPass("input_meta", trace.input_meta),              # meta['val'] on int inputs and constants
    AtenPass("check_meta", trace.check_meta),              # every node carries meta['val']
    AtenPass("restride", trace.restride),                  # eager's strides on elementwise results
    AtenPass("alias_outputs", trace.alias_outputs),        # a mutated input returned is that input
)

# The pipeline also lifts tensor attributes to inputs, so tracing never holds a real tensor, and
# moves values computed from parameters alone into a cached preparation (more inputs: the
# pipeline's wrapper supplies them, so other callers of trace_inference never see it).
COMPILE_PASSES = (AtenPass("lift", trace.lift), *ATEN_PASSES,
                  AtenPass("split_prepared", split_prepared))  # parameter-only values: computed once


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list, passes=ATEN_PASSES) -> torch.fx.GraphModule:
    """Trace ``gm`` (called with ``example_inputs``) to a functional, decomposed ATen graph.

    Runs without autograd: only call it when no gradients are needed.
    """
    ctx = trace.PassContext(list(example_inputs))
    gm = run_passes(gm, ctx, passes, "trace_inference")
    gm.meta["lifted"] = ctx.lifted
    return gm


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


# The passes after tracing (everything after dce in ATEN_PASSES), for graphs that are functional
# ATen already: what the inference trace would have added to them, without tracing again.
_TRACED = [p.name for p in ATEN_PASSES].index("dce") + 1
AFTER_TRACE_PASSES = (AtenPass("lift", trace.lift),
                      AtenPass("aten_inputs", aten_inputs),            # fake inputs: the graph's own
                      AtenPass("static_inputs", static_inputs),
                      *ATEN_PASSES[_TRACED:],
                      AtenPass("split_prepared", split_prepared))


def prepare_aten(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
    """A functional ATen graph (a half of the joint graph) -> the pipeline's ATen graph: the passes
    tracing would have run after make_fx. ``gm`` is not changed (the passes work on a copy)."""
    copy = torch.fx.GraphModule(gm, _copy_graph(gm.graph))
    copy.meta.update(gm.meta)
    ctx = trace.PassContext(list(example_inputs))
    copy = run_passes(copy, ctx, AFTER_TRACE_PASSES, "compile_aten")
    copy.meta["lifted"] = ctx.lifted
    return copy


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """The nodes copied, each with its own (shallow) copy of its meta."""
    new = torch.fx.Graph()
    env: dict = {}
    for node in graph.nodes:
        env[node] = new.node_copy(node, lambda a: env[a])
    return new
