"""Named profiler events for compiled graphs (the generated wrappers import this).

A compiled graph's wrapper checks ``torch.autograd.profiler._is_profiler_enabled`` once per
call: a plain module attribute that every torch profiler session (``torch.profiler.profile``,
``torch.autograd.profiler.profile``) sets on entry and clears on exit, and the flag Inductor's
own generated code reads for the same purpose. Reading it costs a dictionary lookup; the
public-looking alternative, ``torch._C._autograd._profiler_enabled()``, is a C call and cost
more per call (docs/modes.md has the numbers). When it is set, the graph call, each kernel
call and each extern call run inside ``record_function`` events named after the graph, the
kernel and the op.
"""
from __future__ import annotations

import itertools

from torch.autograd.profiler import record_function

__all__ = ["graph_event_name", "record_function"]

_graph_numbers = itertools.count()


def graph_event_name() -> str:
    """``minicompile_graph_<n>``: n counts the compiled graphs loaded in this process."""
    return f"minicompile_graph_{next(_graph_numbers)}"
