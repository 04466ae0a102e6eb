"""The entry point TorchDynamo calls: ``torch.compile(model, backend="minicompile")``.

Registered through the ``torch_dynamo_backends`` entry point in pyproject.toml, so the name
works after ``pip install`` without importing minicompile.
"""
from __future__ import annotations

import logging

import torch

from minicompile.pipeline import compile_graph

log = logging.getLogger("minicompile")


def needs_autograd(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def minicompile_backend(gm: torch.fx.GraphModule, example_inputs):
    """Compile a captured FX graph; returns a callable taking the graph's inputs."""
    if needs_autograd(example_inputs):
        # Training graphs (joint forward/backward) are not compiled yet: run the captured graph
        # eagerly so outputs and gradients are exactly eager's.
        log.warning("minicompile: graph needs gradients; running it eagerly (training is not compiled yet)")
        return gm.forward
    return compile_graph(gm, list(example_inputs))
