"""torch.compile's ``backend``, ``mode`` and ``options`` for ``minicompile.compile``: what
compiles each graph our capture produces.

    minicompile.compile(fn)                                  # the minicompile pipeline
    minicompile.compile(fn, mode="max-autotune")             # its modes and options (docs/modes.md)
    minicompile.compile(fn, backend="inductor")              # any Dynamo backend, by name ...
    minicompile.compile(fn, backend=my_backend)              # ... or as a callable(gm, example_inputs)

Mode and options are handed to the backend as torch.compile hands them (never both; Inductor gets
its own mode handling); for the minicompile pipeline they are checked when ``compile`` is called,
so an unknown one is an error listing the valid ones, not a fallback at the first call.
"""
from __future__ import annotations

import torch

from minicompile.config import graph_knobs

PIPELINE = "minicompile"


def _pipeline(mode=None, options=None):
    def minicompile(gm, example_inputs):
        from minicompile.backend import minicompile_backend
        return minicompile_backend(gm, example_inputs, mode=mode, options=options)
    return minicompile


def _is_pipeline(backend) -> bool:
    if backend is None or backend == PIPELINE:
        return True
    return getattr(backend, "__module__", None) == "minicompile.backend" \
        and getattr(backend, "__name__", None) == "minicompile_backend"


def graph_compiler(backend=None, mode=None, options=None, dynamic=None):
    """The ``(gm, example_inputs) -> callable`` that compiles each captured graph.

    ``backend``: None or "minicompile" (the pipeline), a registered Dynamo backend name
    ("inductor", "eager", "aot_eager", ...) or a callable. ``mode``/``options`` as torch.compile's."""
    if mode is not None and options is not None:
        raise ValueError("minicompile.compile: give mode or options, not both (torch.compile refuses "
                         "both too); put the mode's settings in options instead")
    if _is_pipeline(backend):
        graph_knobs(mode, options)   # unknown modes and options raise here, listing the valid ones
        return _pipeline(mode, options)
    if isinstance(backend, str):
        names = torch._dynamo.list_backends(exclude_tags=())
        if backend not in names:
            raise ValueError(f"minicompile.compile: unknown backend {backend!r}; registered backends: "
                             f"{', '.join(sorted(names))} (or pass a callable(gm, example_inputs))")
    elif not callable(backend):
        raise TypeError(f"minicompile.compile: backend must be a name or a callable(gm, example_inputs), "
                        f"got {type(backend).__name__}")
    if backend == "inductor":   # Inductor's own mode and option handling, as torch.compile builds it
        return torch._TorchCompileInductorWrapper(mode or "default", options, dynamic)
    if mode in (None, "default") and not options:
        return torch._dynamo.lookup_backend(backend)
    return torch._TorchCompileWrapper(backend, mode, options, dynamic)


__all__ = ["graph_compiler"]
