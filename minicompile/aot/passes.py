"""The ATen-graph passes, in order, and the runner that times each and stamps the result.

    aten_gm = trace_inference(gm, example_inputs)                        aten_passes(): device-neutral
    aten_gm = trace_inference(gm, example_inputs, compile_passes(CPU), CPU)   the pipeline's list

Each pass is ``(gm, ctx) -> gm`` (aot/trace.py); a backend's policy (aot/policy.py, the CPU's in
cpu/) adds its claims and passes at fixed places. The result carries, as thunder's traces do,
which passes constructed it and how long each took: ``gm.meta["constructed_by"]`` is a list
of (pass name, seconds), printed as a header on the ATen graph (``constructed_by``) with the
choices the policy measured (``gm.meta["choices"]``, one line each), and
``gm.meta["lifted"]`` holds the tensor attributes ``lift`` made inputs, ``gm.meta["prepared"]``
(after the CPU's ``split_prepared``) the cached preparation of its trailing inputs (cpu/prepare.py).
"""
from __future__ import annotations

import time

import torch

from minicompile.aot import trace
from minicompile.aot.policy import NEUTRAL, AtenPass, DevicePolicy


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


ATEN_PASSES = aten_passes()
COMPILE_PASSES = compile_passes()


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list, passes=None,
                    policy: DevicePolicy = NEUTRAL) -> torch.fx.GraphModule:
    """Trace ``gm`` (called with ``example_inputs``) to a functional, decomposed ATen graph.

    ``passes`` defaults to ``aten_passes(policy)``; ``policy`` is the backend's (aot/policy.py:
    the pipeline hands ``minicompile.cpu.CPU``), device-neutral when left out.
    Runs without autograd: only call it when no gradients are needed.
    """
    ctx = trace.PassContext(list(example_inputs), policy=policy)
    stamps = []
    for p in aten_passes(policy) if passes is None else passes:
        t0 = time.perf_counter()
        gm = p.run(gm, ctx)
        stamps.append((p.name, time.perf_counter() - t0))
    gm.meta["constructed_by"] = stamps
    gm.meta["lifted"] = ctx.lifted
    gm.meta["choices"] = ctx.choices
    return gm


def constructed_by(gm: torch.fx.GraphModule) -> str:
    """``# Constructed by trace_inference: lift 0.1 ms, functionalize 80.2 ms, ... (88 ms)``, then one
    line per measured choice (``# cpu: mm 8x16x32 -> onednn 0.012 ms, mkl 0.015 ms``)."""
    stamps = gm.meta.get("constructed_by")
    if not stamps:
        return ""
    total = sum(s for _, s in stamps) * 1000
    passes = ", ".join(f"{name} {s * 1000:.1f} ms" for name, s in stamps)
    choices = "".join(f"# {line}\n" for line in gm.meta.get("choices", ()))
    return f"# Constructed by trace_inference: {passes} ({total:.0f} ms)\n{choices}"
