"""Compiling leaves torch's global state as it found it.

Dynamo guards its graphs on the functorch transform stack, grad mode, the dispatch mode
stack, the default dtype and autocast, and checks those guards right after the backend
returns ("Guard failed on the same frame it was created ... compare_functorch_state"). A trace that fails half way (make_fx under
torch.func.functionalize, with a transform the graph itself entered) can leave a functorch
layer pushed; with the eager fallback that would turn a recorded fallback into an error, or
change what the user's next eager op does. ``kept_global_state`` restores them all (and the CPU
random generator: a choice timed on random inputs would move it, and the user's next dropout
mask with it; Dynamo restores it around its own compiles, our front end relies on this), autocast's
nesting level too: a trace stopped inside an autocast region leaves the level raised, and eager
autocast then never clears its cache of cast weights at the end of a region, so each later
region reuses the weights as cast before the optimizer's updates (silently wrong training).
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def kept_global_state():
    functorch_depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    grad = torch.is_grad_enabled()
    forward_grad = torch._C._is_fwd_grad_enabled()
    dispatch_modes = torch._C._len_torch_dispatch_stack()
    default_dtype = torch.get_default_dtype()
    autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}
    autocast_cache = torch.is_autocast_cache_enabled()
    nesting = autocast_nesting()
    rng = torch.get_rng_state()   # choices timed on random inputs must not move the user's generator
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        if torch._C._functorch.get_dynamic_layer_stack_depth() > functorch_depth:
            torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(functorch_depth)
        while torch._C._len_torch_dispatch_stack() > dispatch_modes:
            torch._C._pop_torch_dispatch_stack()
        torch.set_grad_enabled(grad)
        torch._C._set_fwd_grad_enabled(forward_grad)
        torch.set_default_dtype(default_dtype)
        for device, (enabled, dtype) in autocast.items():
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(autocast_cache)
        _restore_autocast_nesting(nesting)


def autocast_nesting() -> int:
    """How many autocast regions are open (torch keeps the count; it has no getter)."""
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


def _restore_autocast_nesting(nesting: int) -> None:
    level = autocast_nesting()
    if level == nesting:
        return
    while level > nesting:
        level = torch.autocast_decrement_nesting()
    while level < nesting:
        level = torch.autocast_increment_nesting()
    if level == 0:
        torch.clear_autocast_cache()     # as leaving the outermost region does
