"""Mixed precision (``torch.autocast``): eager's casts become ordinary ops of the traced graph.

Autocast is a dispatcher layer above autograd, so the first ATen trace of a captured graph
(inference's ``functionalize``, the joint's ``fake_forward`` and ``trace``) records exactly
eager's casts as ``_to_copy`` nodes, whether the caller's ``with torch.autocast`` is on while the
backend traces or the graph enters it itself (Dynamo's ``_enter_autocast``/``_exit_autocast``).
Our decompositions run below it: an op autocast left float32 stays float32 in its decomposition.

Nothing else may cast again: the pass context records the state (``PassContext.autocast``), the
pass runner runs every pass with autocast off and only the tracing passes apply the recorded
state; library timings and compiled graphs (their extern calls) run with autocast off too.

The backward is traced with autocast off: eager's ``backward()`` after the ``with`` block runs
with it off, and a cast's backward is the cast back (docs/training.md, "Mixed precision").
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


def autocast_devices() -> list:
    return list(torch._C._autocast_supported_devices())


def autocast_enabled() -> bool:
    return torch._C._is_any_autocast_enabled()


@contextlib.contextmanager
def autocast_off():
    """Autocast off on every device, as outside any ``torch.autocast`` block."""
    with contextlib.ExitStack() as stack:
        for device in autocast_devices():
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


@contextlib.contextmanager
def no_autocast_cache():
    """Autocast keeps the casts of leaf tensors that require grad until its outermost block exits;
    a cast of a fake tensor must not stay there (make_fx turns the cache off for its trace too)."""
    enabled = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(enabled)


@dataclass(frozen=True)
class AutocastState:
    """The devices autocast is on for, each with its dtype: ``(("cpu", torch.bfloat16),)``."""
    enabled: tuple = ()

    @staticmethod
    def current() -> "AutocastState":
        return AutocastState(tuple((d, torch.get_autocast_dtype(d)) for d in autocast_devices()
                                   if torch.is_autocast_enabled(d)))

    @contextlib.contextmanager
    def applied(self):
        """Autocast as it was recorded (on top of whatever is on now: the runner turned it off)."""
        with contextlib.ExitStack() as stack:
            for device, dtype in self.enabled:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            yield
