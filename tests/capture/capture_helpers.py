"""Shared checks: a compiled call equals eager, and capture made the expected graphs/breaks."""
from __future__ import annotations

import copy

import torch

from minicompile.capture import compile, explain


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.allclose(a, b, equal_nan=True, atol=1e-6))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def check(fn, *args, graphs: int, breaks: int, fallbacks: int = 0, calls: int = 2,
          recompiles: int = 0, **kwargs):
    """Run ``fn`` eagerly and captured (explain, then ``calls`` cache-hit calls); compare."""
    expected = fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    report = explain(fn)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    assert same(report.output, expected), f"explain output differs\n{report.output}\n{expected}"
    assert report.graph_count == graphs, f"expected {graphs} graphs\n{report}"
    assert report.break_count == breaks, f"expected {breaks} breaks\n{report}"
    assert len(report.fallbacks) == fallbacks, f"expected {fallbacks} fallbacks\n{report}"
    compiled = compile(fn)
    for _ in range(calls):
        got = compiled(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert same(got, expected), f"compiled output differs\n{got}\n{expected}"
    assert len(compiled.capture_report.recompiles) == recompiles, compiled.capture_report
    return report
