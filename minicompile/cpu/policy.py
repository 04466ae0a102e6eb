"""The CPU's performance policy as one value, ``CPU``, which the pipeline hands to the trace.

    claims          CPU_CLAIMS (cpu/claims.py): products as oneDNN's linear or MKL's mm, attention
                    as eager's flash kernel or our math form, convolutions fed channels-last
    before_trace    static_inputs: which inputs are parameters or buffers (cpu/prepare.py)
    around_trace    channels-last where it measured faster (cpu/conv_layout.py); measured_first
    after_trace     fold_conv_bn, pointwise_convs, epilogues (cpu/epilogues.py), packed_products
                    (cpu/gemm_template.py), extern_reasons
    prepare         split_prepared: values from parameters alone, computed once (cpu/prepare.py)
    train_channels_last  a training graph's layout, measured forward and backward (cpu/train_layout.py)

Each measured choice is printed in the ATen graph's header (``# cpu: mm 8x16x32 (row @ column) ->
onednn (onednn 0.012 ms, mkl 0.015 ms; ...)``); the knobs that pin them are MINICOMPILE_CPU_GEMM,
MINICOMPILE_CPU_ATTENTION, MINICOMPILE_CPU_EPILOGUE, MINICOMPILE_CONV_LAYOUT and MINICOMPILE_CPU_LIBRARIES (config.py).
"""
from __future__ import annotations

from minicompile.aot.policy import AtenPass, DevicePolicy
from minicompile.cpu.claims import CPU_CLAIMS, pinned_mode, stamp_extern_reasons, use_onednn_linear
from minicompile.cpu.conv_layout import (functionalize_channels_last, pointwise_convs_as_linear, pointwise_stays_convolution,
                                         relayout_active)
from minicompile.cpu.epilogues import fuse_epilogues
from minicompile.cpu.gemm_template import packed_products
from minicompile.cpu.prepare import fold_conv_bn, split_prepared, static_inputs
from minicompile.cpu.timing import measured_first, recording
from minicompile.cpu.train_layout import channels_last_pays_in_training


def _around_trace(functionalize, gm, ctx):
    """trace.functionalize with CPU convolutions fed channels-last, its library choices measured
    before the trace that is kept, never inside make_fx (cpu/timing.measured_first)."""
    def keep(traced, fix):   # the provisional trace chose as measured: its header lines say so
        ctx.choices[:] = map(fix, ctx.choices)
        return traced
    return measured_first(lambda: _channels_last_trace(functionalize, gm, ctx), keep)


def _channels_last_trace(functionalize, gm, ctx):
    """``ctx.choices`` gets what the kept trace chose (a trace retried in NCHW chose its own products)."""
    attempts = []

    def recorded(gm, ctx):
        lines = []
        with recording(lines):
            traced = functionalize(gm, ctx)
        attempts.append((traced, lines))
        return traced

    layout = []
    with recording(layout):
        traced = functionalize_channels_last(recorded, gm, ctx)
    kept = next((lines for t, lines in attempts if t is traced), [])
    ctx.choices[:] = [*dict.fromkeys([*layout, *kept])]
    return traced


def _train_channels_last(gm, choices: list) -> bool:
    """Training: channels-last convolutions where, forward and backward with the weights' conversions,
    they measured faster (cpu/train_layout.py); the choice goes to the joint graph's header."""
    with recording(choices):
        return channels_last_pays_in_training(gm)


def _pointwise_convs(gm, ctx):
    """1x1 convolutions of NHWC pixels as matrix products (oneDNN's linear or mm; cpu/conv_layout.py)."""
    pinned = pinned_mode("cpu_gemm", "MINICOMPILE_CPU_GEMM", eager="mkl")[1]
    with recording(ctx.choices):
        pointwise_convs_as_linear(gm, ctx.fake_mode, use_onednn_linear, (lambda c: False) if pinned else pointwise_stays_convolution)
    return gm


def _epilogues(gm, ctx):
    """Activations and residual adds after a float32 product or convolution become oneDNN's
    post-ops where that measured faster (cpu/epilogues.py)."""
    with recording(ctx.choices):
        fuse_epilogues(gm, ctx)
    return gm


def _packed_products(gm, ctx):
    """Products of a prepared weight as our packed-weight template where it measured faster
    (cpu/gemm_template.py)."""
    with recording(ctx.choices):
        packed_products(gm, ctx)
    return gm


def _extern_reasons(gm, ctx):
    """``node.meta["extern_reason"]`` on oneDNN's linear and eager's flash attention (cpu/claims.py)."""
    stamp_extern_reasons(gm)
    return gm


CPU = DevicePolicy(
    "cpu",
    claims=CPU_CLAIMS,
    before_trace=(AtenPass("static_inputs", static_inputs),),        # which inputs are parameters/buffers
    around_trace=_around_trace,                                     # channels-last where it measured faster
    after_trace=(AtenPass("fold_conv_bn", fold_conv_bn),            # conv * s + t, s and t from parameters
                 AtenPass("pointwise_convs", _pointwise_convs),     # 1x1 conv of NHWC -> oneDNN linear or mm
                 AtenPass("epilogues", _epilogues),                 # activation, residual: oneDNN post-ops
                 AtenPass("packed_products", _packed_products),     # weight packed once, our AVX2 tiles
                 AtenPass("extern_reasons", _extern_reasons)),      # why each vendor call stays whole
    prepare=(AtenPass("split_prepared", split_prepared),),          # parameter-only values: computed once
    relayout_active=relayout_active,
    train_channels_last=_train_channels_last,                       # training: channels-last where it measured faster
)
