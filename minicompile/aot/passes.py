"""The ATen-graph passes, in order, and the runner that times each and stamps the result.

    aten_gm = trace_inference(gm, example_inputs)                  ATEN_PASSES
    aten_gm = trace_inference(gm, example_inputs, COMPILE_PASSES)  + lift, split_prepared (the pipeline's list)

Each pass is ``(gm, ctx) -> gm`` (aot/trace.py). The result carries, as thunder's traces do,
which passes constructed it and how long each took: ``gm.meta["constructed_by"]`` is a list
of (pass name, seconds), printed as a header on the ATen graph (``constructed_by``), and
``gm.meta["lifted"]`` holds the tensor attributes ``lift`` made inputs, ``gm.meta["prepared"]``
(after ``split_prepared``) the cached preparation of its trailing inputs (cpu/prepare.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from minicompile.aot import trace
from minicompile.cpu.conv_layout import functionalize_channels_last, pointwise_convs_as_linear
from minicompile.cpu.claims import fold_gelu_into_onednn_linear, use_onednn_linear
from minicompile.cpu.prepare import fold_conv_bn, split_prepared, static_inputs


@dataclass(frozen=True)
class AtenPass:
    name: str
    run: Callable   # (gm, PassContext) -> gm


def _fold_gelu(gm, ctx):
    """CPU policy (cpu/claims.py): GELU after a oneDNN linear becomes its post-op."""
    fold_gelu_into_onednn_linear(gm)
    return gm


def _pointwise_convs(gm, ctx):
    """CPU policy (cpu/conv_layout.py): a 1x1 convolution of NHWC pixels runs as a matrix product
    (oneDNN's linear or mm, by the GEMM choice)."""
    pointwise_convs_as_linear(gm, ctx.fake_mode, use_onednn_linear)
    return gm


def _functionalize(gm, ctx):
    """trace.functionalize, with CPU convolutions fed channels-last (cpu/conv_layout.py)."""
    return functionalize_channels_last(trace.functionalize, gm, ctx)


ATEN_PASSES = (
    AtenPass("static_inputs", static_inputs),              # which inputs are parameters/buffers (cpu/prepare.py)
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
    stamps = []
    for p in passes:
        t0 = time.perf_counter()
        gm = p.run(gm, ctx)
        stamps.append((p.name, time.perf_counter() - t0))
    gm.meta["constructed_by"] = stamps
    gm.meta["lifted"] = ctx.lifted
    return gm


def constructed_by(gm: torch.fx.GraphModule) -> str:
    """``# Constructed by trace_inference: lift 0.1 ms, functionalize 80.2 ms, ... (88 ms)``."""
    stamps = gm.meta.get("constructed_by")
    if not stamps:
        return ""
    total = sum(s for _, s in stamps) * 1000
    passes = ", ".join(f"{name} {s * 1000:.1f} ms" for name, s in stamps)
    return f"# Constructed by trace_inference: {passes} ({total:.0f} ms)\n"
