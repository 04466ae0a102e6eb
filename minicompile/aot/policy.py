"""What a device backend adds to the device-neutral ATen trace, handed in as one value.

aot/ traces a captured graph to functional ATen with the decomposition table (decomp/), the same
on every device. A backend's performance policy (which ops stay whole as vendor-library calls,
which layout convolutions run in, what is prepared from parameters once) is a ``DevicePolicy``
that the pipeline passes to ``trace_inference`` and ``trace_joint``; aot/ never imports one.
The CPU's is ``minicompile.cpu.CPU``; ``NEUTRAL`` adds nothing.

    claims          op -> claim(*args, **kwargs), layered over the decomposition table inside
                    make_fx: the claimed result, None (defer to the decomposition) or
                    NotImplemented (keep the op whole); thunder's executors claim ops the same way
    before_trace    AtenPasses run before the trace (which inputs are parameters, ...)
    around_trace    (functionalize, gm, ctx) -> gm: runs the trace itself (e.g. twice, in two layouts)
    after_trace     AtenPasses on the traced graph, before its meta is completed (folds, rewrites,
                    and the stamps lowering reads: ``node.meta["extern_reason"]``)
    prepare         AtenPasses the pipeline runs last (values computed from parameters, split off)
    relayout_active () -> bool: inside the trace, layouts may differ from eager's (checked by
                    aot/layout_readers.py)
    train_channels_last  (gm, choices) -> bool: whether a training graph's convolutions run
                    channels-last (aot/conv_layout_train.py), decided before the joint trace

A pass records each choice it measured as a line in ``ctx.choices``; the ATen graph prints them
in its header (aot/runner.py ``constructed_by``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from minicompile.aot.runner import AtenPass  # noqa: F401 (a policy's passes; re-exported for cpu/)


@dataclass(frozen=True)
class DevicePolicy:
    name: str
    claims: Mapping = field(default_factory=dict)
    before_trace: tuple = ()
    around_trace: Callable | None = None
    after_trace: tuple = ()
    prepare: tuple = ()
    relayout_active: Callable[[], bool] = lambda: False
    train_channels_last: Callable[[object, list], bool] = lambda gm, choices: True


NEUTRAL = DevicePolicy("neutral")
