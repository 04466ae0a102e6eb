"""How far a float32 training step is from a float64 one: ours against eager's.

A compiled step and eager's both differ from the exact gradients by rounding; "as accurate as
eager" means ours is no farther from a float64 run of the same model and input than eager
float32 is. Comparing with eager alone cannot tell a less accurate sum from a reordered one.

    dist = float64_distances(model, x, compile_model)
    dist["ours"] <= factor * dist["eager"] + floor     # each entry: relative L2 over every gradient

``compile_model(module) -> callable`` compiles a copy (``torch.compile(m, backend=...)``).
The backward seeds the output with a fixed random gradient (seed 0), so no gradient is a plain
sum of ones.
"""
from __future__ import annotations

import copy

import torch


def _step(model: torch.nn.Module, x: torch.Tensor, run) -> torch.Tensor:
    x = x.detach().clone().requires_grad_()
    out = run(x)
    seed = torch.Generator().manual_seed(0)
    (out * torch.randn(out.shape, generator=seed, dtype=torch.float64).to(out.dtype)).sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return torch.cat([torch.zeros(0, dtype=torch.float64)] + [g.detach().double().flatten() for g in grads if g is not None])


def float64_distances(model: torch.nn.Module, x: torch.Tensor, compile_model) -> dict:
    """Relative L2 distance of every gradient (input and parameters, concatenated) to a float64
    run: eager float32 ("eager") and compiled ("ours"), each on a fresh copy of ``model``."""
    m64 = copy.deepcopy(model).double()
    exact = _step(m64, x.double(), m64)
    m32 = copy.deepcopy(model)
    eager = _step(m32, x, m32)
    mc = copy.deepcopy(model)
    ours = _step(mc, x, compile_model(mc))
    norm = exact.norm().clamp_min(1e-300)
    return {"eager": ((eager - exact).norm() / norm).item(), "ours": ((ours - exact).norm() / norm).item()}
