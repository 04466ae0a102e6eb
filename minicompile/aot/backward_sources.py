"""Source lines for the backward: each ATen node of the backward gets the meta (stack trace,
module path) of the captured node whose forward created the autograd node it comes from.

    run = SourceInterpreter(gm, check)        the forward, node by node (records who made what)
    outputs = run.run(*primals)
    with backward_sources(run, outputs):      autograd's nodes run with their forward node's meta
        grads = torch.autograd.grad(outputs, ...)

The ATen nodes of the forward inherit their captured node's meta as make_fx records them
(``torch.fx.traceback.preserve_node_meta``); those of the backward are created while autograd
runs an autograd node, outside any captured node, and would have none ("No stacktrace found").
Every autograd node carries a sequence number, and the captured node that ran while it was
created is known, so a hook around each sets that node as the current one while it runs, as
AOTAutograd's stack-trace hooks do. Gradient accumulation (the engine's own adds) stays without.
"""
from __future__ import annotations

import bisect
import contextlib

import torch
import torch.fx
import torch.fx.traceback

from minicompile.aot.layout_readers import LayoutCheckingInterpreter


class SourceInterpreter(LayoutCheckingInterpreter):
    """Runs the captured graph (checking layouts, aot/layout_readers.py) and records which of
    its nodes created each autograd node: the range of sequence numbers taken while it ran."""

    def __init__(self, gm: torch.fx.GraphModule, check):
        super().__init__(gm, check)
        self.firsts: list = []      # sorted: the first sequence number each recorded node took
        self.ranges: list = []      # (first, end, node)

    def run_node(self, n: torch.fx.Node):
        first = torch.autograd._get_sequence_nr()
        value = super().run_node(n)
        end = torch.autograd._get_sequence_nr()
        if end > first:
            self.firsts.append(first)
            self.ranges.append((first, end, n))
        return value

    def node_of(self, seq: int) -> torch.fx.Node | None:
        k = bisect.bisect_right(self.firsts, seq) - 1
        if k < 0:
            return None
        first, end, node = self.ranges[k]
        return node if first <= seq < end else None


@contextlib.contextmanager
def backward_sources(run: SourceInterpreter, outputs: list):
    """Hooks on every autograd node behind ``outputs``; removed on exit."""
    handles, entered = [], []
    for fn in _autograd_nodes([o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]):
        node = run.node_of(fn._sequence_nr())
        if node is None or not node.meta:
            continue
        handles.append(fn.register_prehook(_enter(node, entered)))
        handles.append(fn.register_hook(_leave(entered)))
    try:
        yield
    finally:
        while entered:   # a backward that raised inside an autograd node
            entered.pop().__exit__(None, None, None)
        for h in handles:
            h.remove()


def _enter(node: torch.fx.Node, entered: list):
    def prehook(grad_outputs):
        current = torch.fx.traceback.set_current_meta(node)
        current.__enter__()
        entered.append(current)
    return prehook


def _leave(entered: list):
    def posthook(grad_inputs, grad_outputs):
        if entered:
            entered.pop().__exit__(None, None, None)
    return posthook


def _autograd_nodes(roots: list):
    seen, stack = set(), list(roots)
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        yield fn
        stack.extend(f for f, _ in fn.next_functions)
