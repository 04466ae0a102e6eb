"""Lift a graph's tensor attributes to inputs, so compiling never touches the user's tensors.

Dynamo hands parameters, buffers and optimizer state to the backend as attributes of the
GraphModule (``get_attr`` nodes), not as inputs. Traced as attributes they are *real*
tensors inside a fake-tensor trace: an in-place op on one (``p.add_(...)``, ``buf.mul_(0.9)``)
can run on the real storage while the trace is in flight, and a compile that then fails
leaves them changed before the eager fallback runs the step again.

    lifted_gm, attrs = lift_attributes(gm)

``lifted_gm`` is a new GraphModule (``gm`` is not changed) that takes ``gm``'s inputs
followed by one input per tensor attribute; ``attrs`` are those tensors, in order. Traced
as inputs they become fake tensors like every other input, and their mutations become the
ordinary input write-back (``copy_`` at the end of the graph), applied once per call.
"""
from __future__ import annotations

import operator

import torch
import torch.fx


def lift_attributes(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple]:
    attrs = {}                         # attribute path -> tensor, in first-use order
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            if isinstance(value, torch.Tensor):
                attrs.setdefault(node.target, value)
    if not attrs:
        return gm, ()
    graph = torch.fx.Graph()
    env: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        env[node] = graph.node_copy(node, lambda n: env[n])
    lifted = {}
    for target in attrs:
        ph = graph.placeholder(_placeholder_name(target))
        ph.meta["lifted_from"] = target
        lifted[target] = ph
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr" and node.target in lifted:
            env[node] = lifted[node.target]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    new = torch.fx.GraphModule(gm, graph)
    new.meta.update(getattr(gm, "meta", {}))
    return new, tuple(attrs.values())


def _placeholder_name(target: str) -> str:
    return "attr_" + "".join(c if c.isalnum() else "_" for c in target)
