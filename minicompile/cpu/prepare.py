"""Inference: what a graph computes from parameters and buffers alone is prepared once, not per call.

Dynamo and our front end hand a module's parameters and buffers to the graph as inputs, so
whatever the graph computes from them alone ran again on every call: ResNet-18 laid its
47 MB of convolution weights out channels-last (cpu/conv_layout.py) on each call, and each
BatchNorm recomputed ``rsqrt(var + eps) * weight`` inside the kernel after its convolution.
Three ATen passes (aot/passes.py):

    static_inputs   which inputs are parameters or buffers: an nn.Parameter, Dynamo's
                    static-input mark, our front end's ``static_input`` mark, a tensor
                    attribute ``lift`` made an input
    fold_conv_bn    ``convolution(x, w, b) * s + t`` with ``s`` and ``t`` per output channel and
                    computed from static inputs only (eval BatchNorm's scale and shift) becomes
                    ``convolution(x, w * s, b * s + t)``: the pass over the output is gone
    split_prepared  the static-only values a per-call node reads become trailing inputs of the
                    graph, computed by a small ATen graph that the host wrapper runs only when
                    one of its sources changed (runtime/prepared.py keys on identity, data
                    pointer and version counter)

A prepared value is never random, never a graph output or a view an output returns (the
caller could write into it), never a mere view of its sources (nothing to save). Only CPU
graphs with static sizes; training graphs never (backend.py: their parameters change every
step). ``MINICOMPILE_PREPARE_WEIGHTS=0`` turns all three off.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from minicompile.config import config
from minicompile.runtime.prepared import CachedPreparation

aten = torch.ops.aten


def static_inputs(gm: torch.fx.GraphModule, ctx):
    """``ctx.static``: positions of the placeholders that are parameters or buffers."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ctx.static = frozenset(k for k, (node, value) in enumerate(zip(placeholders, ctx.inputs))
                           if _is_static(node, value))
    return gm


def _is_static(node: torch.fx.Node, value) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    dynamo_mark = node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
    return isinstance(value, torch.nn.Parameter) or bool(
        dynamo_mark or node.meta.get("static_input") or node.meta.get("lifted_from"))


def prepares_weights(ctx) -> bool:
    """Values computed from parameters alone are prepared once per version for this graph."""
    return config.prepare_weights and bool(ctx.static) and not ctx.symbolic


def static_nodes(gm: torch.fx.GraphModule, static: frozenset) -> set:
    """The static placeholders and every pure node computed from them alone (topological order)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    nodes = {placeholders[k] for k in static}
    for node in gm.graph.nodes:
        inputs = node.all_input_nodes
        if node.op == "call_function" and _pure(node.target) and inputs and all(i in nodes for i in inputs):
            nodes.add(node)
    return nodes


def _pure(target) -> bool:
    """Same inputs, same result, nothing written: an ATen op neither random nor mutating."""
    if target is operator.getitem:
        return True
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


# -- conv + per-channel affine (eval BatchNorm) ----------------------------------------------------

def fold_conv_bn(gm: torch.fx.GraphModule, ctx):
    if not prepares_weights(ctx):
        return gm
    static = static_nodes(gm, ctx.static)
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    if sum(_fold(gm, conv, static, ctx.fake_mode) for conv in convs):
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _fold(gm, conv: torch.fx.Node, static: set, fake_mode) -> bool:
    x, w, b, *params = conv.args
    out = conv.meta.get("val")
    if params[3] or w not in static or (b is not None and b not in static) or not isinstance(out, torch.Tensor):
        return False  # params[3]: transposed, whose weight is (in, out) channels
    scaled = _channel_operand(conv, aten.mul.Tensor, static, out)
    if scaled is None:
        return False
    mul, s = scaled
    shifted = _channel_operand(mul, aten.add.Tensor, static, out)
    last, t = shifted if shifted else (mul, None)
    c, emit = out.shape[1], Emitter(gm.graph, fake_mode)
    with gm.graph.inserting_before(last):
        new_w = emit(aten.mul.Tensor, w, emit(aten.view.default, s, [c] + [1] * (w.meta["val"].dim() - 1)))
        s_c = emit(aten.view.default, s, [c])
        new_b = None if b is None else emit(aten.mul.Tensor, b, s_c)
        if t is not None:
            t_c = emit(aten.view.default, t, [c])
            new_b = t_c if new_b is None else emit(aten.add.Tensor, new_b, t_c)
        folded = emit(aten.convolution.default, x, new_w, new_b, *params)
    folded.meta = {**last.meta, "val": folded.meta["val"]}
    last.replace_all_uses_with(folded)
    return True


def _channel_operand(node: torch.fx.Node, op, static: set, out: torch.Tensor):
    """(user, other) when ``node``'s only user is ``op(node, other)`` with ``other`` static, of shape
    (1, C, 1, ...) and ``out``'s dtype, so the result is ``node`` scaled or shifted per channel."""
    users = list(node.users)
    if len(users) != 1 or users[0].target is not op or users[0].kwargs or len(users[0].args) != 2:
        return None
    user = users[0]
    a, b = user.args
    other = b if a is node else a
    val = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
    want = (1, out.shape[1]) + (1,) * (out.dim() - 2)
    if other is node or other not in static or not isinstance(val, torch.Tensor) or tuple(val.shape) != want \
            or val.dtype != out.dtype or val.device != out.device:
        return None
    return user, other


class Emitter:
    """Adds ``op(*args)`` to the graph with its fake value in ``meta['val']``."""

    def __init__(self, graph: torch.fx.Graph, fake_mode):
        self.graph, self.fake_mode = graph, fake_mode

    def __call__(self, op, *args) -> torch.fx.Node:
        node = self.graph.call_function(op, args)
        vals = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = op(*vals)
        return node


# -- the split -----------------------------------------------------------------------------------

def split_prepared(gm: torch.fx.GraphModule, ctx):
    """Static-only values the graph reads become trailing placeholders; ``ctx.prepared`` is the
    CachedPreparation that computes them (it stays None when there are none)."""
    if not prepares_weights(ctx):
        return gm
    hoisted = _hoistable(gm, static_nodes(gm, ctx.static))
    computed = _computed(gm, hoisted)
    frontier = [n for n in gm.graph.nodes if n in computed and any(u not in hoisted for u in n.users)]
    if not frontier or not all(_on_cpu(n) for n in hoisted):
        return gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = [n for n in placeholders if any(u in hoisted for u in n.users)]
    prepare = _prepare_module(gm, hoisted, sources, frontier)
    with gm.graph.inserting_after(placeholders[-1]):
        for k, node in reversed(list(enumerate(frontier))):
            ph = gm.graph.placeholder(f"prepared{k}")
            ph.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(ph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    layouts = [(tuple(n.meta["val"].shape), tuple(n.meta["val"].stride())) for n in frontier]
    ctx.prepared = CachedPreparation(prepare, tuple(placeholders.index(s) for s in sources), layouts)
    return gm


def _hoistable(gm, static: set) -> set:
    """Static call nodes whose value no output is or views (a returned tensor must be fresh)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    pinned, stack = set(), list(out.all_input_nodes)
    while stack:
        node = stack.pop()
        if node not in pinned:
            pinned.add(node)
            if _is_view(node):
                stack.extend(node.all_input_nodes)
    return {n for n in static if n.op == "call_function" and n not in pinned}


def _is_view(node) -> bool:
    return node.target is operator.getitem or getattr(node.target, "is_view", False)


def _computed(gm, hoisted: set) -> set:
    """Hoisted tensor values that are not mere views of the graph's inputs."""
    computed = set()
    for node in gm.graph.nodes:
        if node in hoisted and (not _is_view(node) or any(i in computed for i in node.all_input_nodes)):
            computed.add(node)
    return {n for n in computed if isinstance(n.meta.get("val"), torch.Tensor)}


def _on_cpu(node) -> bool:
    vals = torch.utils._pytree.tree_leaves(node.meta.get("val"))
    return all(v.device.type == "cpu" for v in vals if isinstance(v, torch.Tensor))


def _prepare_module(gm, hoisted: set, sources: list, frontier: list) -> torch.fx.GraphModule:
    graph, env = torch.fx.Graph(), {}
    for s in sources:
        env[s] = graph.placeholder(s.name)
    for node in gm.graph.nodes:
        if node in hoisted:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in frontier))
    return torch.fx.GraphModule(torch.nn.Module(), graph, "prepare")
