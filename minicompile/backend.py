"""The entry point TorchDynamo calls: ``torch.compile(model, backend="minicompile")``.

Registered through the ``torch_dynamo_backends`` entry point in pyproject.toml, so the name
works after ``pip install`` without importing minicompile.
"""
from __future__ import annotations

import logging

import torch

from minicompile.config import config
from minicompile.pipeline import compile_graph
from minicompile.runtime import CompilerNotFound

log = logging.getLogger("minicompile")


def needs_autograd(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def has_symbolic_shapes(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Dynamo marked some size dynamic: the graph must serve more than one shape."""
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt):
            return True
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False


class PerShapeGraph:
    """Compiles a dynamic-shape graph once per concrete input signature (shapes are static inside)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.compiled = {}

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                    for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = compile_or_fallback(self.gm, list(args))
        return fn(*args)


def minicompile_backend(gm: torch.fx.GraphModule, example_inputs):
    """Compile a captured FX graph; returns a callable taking the graph's inputs."""
    if needs_autograd(example_inputs):
        # Training graphs (joint forward/backward) are not compiled yet: run the captured graph
        # eagerly so outputs and gradients are exactly eager's.
        log.warning("minicompile: graph needs gradients; running it eagerly (training is not compiled yet)")
        return gm.forward
    if has_symbolic_shapes(gm, example_inputs):
        return PerShapeGraph(gm)
    return compile_or_fallback(gm, list(example_inputs))


def compile_or_fallback(gm, example_inputs):
    """A missing compiler is the user's to fix (the error says how); a compiler bug must not cost the
    user their program: the graph runs eagerly and the warning says why."""
    try:
        return compile_graph(gm, example_inputs)
    except CompilerNotFound:
        raise
    except Exception as e:
        if not config.fallback_on_error:
            raise
        log.warning("minicompile: compiling this graph failed (%s: %s); running it eagerly. "
                    "Set MINICOMPILE_FALLBACK=0 to raise instead.", type(e).__name__, e)
        return gm.forward
