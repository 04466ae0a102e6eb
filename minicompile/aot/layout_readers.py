"""Ops that observe a tensor's memory layout, and whether a layout pass may change their input's.

Layouts are a contract (DESIGN.md): ``as_strided(y, size, stride)`` reads ``y``'s storage with
strides relative to the layout eager gave ``y``; ``as_strided_scatter`` writes through such a
view of a copy of ``y``; ``set_`` with a geometry, ``stride()`` and ``data_ptr()`` read it too.
The channels-last passes (conv_layout.py for inference, conv_layout_train.py for training)
change the layout of a convolution's output and of everything computed from it, so they may only
act on a graph in which no such op reads such a value: ``relaid_storage_reader(gm)`` names the
first one in the captured graph, and for that graph the passes keep eager's layouts.
"""
from __future__ import annotations

import torch

# ops whose result (or side effect) depends on the storage layout of a tensor argument
LAYOUT_READERS = frozenset({
    "as_strided", "as_strided_", "as_strided_copy", "as_strided_scatter", "set_", "stride",
    "storage_offset", "data_ptr", "untyped_storage", "storage"})
# ops whose output layout the channels-last passes choose
CONVOLUTIONS = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution"})


def relaid_storage_reader(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The first node of ``gm`` (a captured graph) that reads the layout of a value computed from
    a convolution; None if there is none."""
    relaid: set = set()
    for node in gm.graph.nodes:
        reads_relaid = any(arg in relaid for arg in node.all_input_nodes)
        if reads_relaid and _op_name(gm, node) in LAYOUT_READERS:
            return node
        if reads_relaid or _op_name(gm, node) in CONVOLUTIONS:
            relaid.add(node)
    return None


def _op_name(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    """``torch.as_strided``, ``Tensor.as_strided``, ``aten.as_strided.default`` and the method call
    ``y.as_strided(...)`` are all ``as_strided``; a convolution module (a symbolically traced
    graph's leaf) is ``convolution``."""
    if node.op == "call_method":
        return node.target
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return "convolution" if isinstance(module, torch.nn.modules.conv._ConvNd) else ""
    if node.op != "call_function":
        return ""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    return getattr(target, "__name__", "")
