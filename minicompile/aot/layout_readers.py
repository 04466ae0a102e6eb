"""Ops that observe a tensor's memory layout, and the check that they see eager's.

Layouts are a contract (docs/architecture.md): ``as_strided(y, size, stride)`` reads ``y``'s storage with
strides relative to the layout eager gave ``y``; ``as_strided_scatter`` writes through such a
view of a copy of ``y``; ``set_`` with a geometry, ``stride()`` and ``data_ptr()`` read it too.
Random ops that fill ``empty_like(y)`` (dropout, ``rand_like``, in-place ``bernoulli_``/
``uniform_``...) draw a dense tensor in memory order, so their values depend on it as well.

The channels-last passes (conv_layout.py for inference, conv_layout_train.py for training)
change the layout of a convolution's output and of values computed from it. While one of them
traces a captured graph, ``LayoutCheckingInterpreter`` checks each such op's tensor arguments
against eager's strides for them (Dynamo's ``example_value``, which our front end records too)
and raises ``LayoutChanged`` on a difference; the pass then traces the graph in eager's layouts.
A reader of a layout the pass did not change (as_strided of a graph input, dropout of a pooled
vector) keeps the pass. A storage reader (STORAGE_READERS) of a view also checks the value that
owns the view's storage: conv(x)[:, 0, 0, 0] can have eager's strides in channels-last memory.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from minicompile.decomp.core_ops import STORAGE_READERS

LAYOUT_READERS = STORAGE_READERS | frozenset({"stride", "storage_offset", "data_ptr",
    "dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "rand_like", "randn_like", "randint_like",
    "bernoulli_", "uniform_", "normal_", "exponential_", "random_", "cauchy_", "log_normal_", "geometric_"})


class LayoutChanged(Exception):
    """An op of the captured graph would read a layout that differs from eager's."""


class LayoutCheckingInterpreter(torch.fx.Interpreter):
    """Runs a captured graph; while ``check()`` is true, an op in LAYOUT_READERS first checks that
    its tensor arguments have eager's strides."""

    def __init__(self, gm: torch.fx.GraphModule, check: Callable[[], bool]):
        super().__init__(gm)
        self.check = check
        # a storage reader of a view (y[:, 0, 0, 0]) reads the storage of the value it views: that
        # value's layout is checked too, though the view's strides can agree with eager's where it differs
        self.roots = {n: [r for a in n.all_input_nodes if (r := storage_root(a)) is not a]
                      if _op_name(gm, n) in STORAGE_READERS else [] for n in gm.graph.nodes if _is_reader(gm, n)}
        self.root_values: dict = {}  # kept past the interpreter's last use of them

    def run_node(self, n: torch.fx.Node):
        if n in self.roots and self.check():
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            check_layouts(n, pytree.tree_leaves((n.args, n.kwargs)), pytree.tree_leaves((args, kwargs)))
            check_layouts(n, self.roots[n], [self.root_values.get(r) for r in self.roots[n]])
        value = super().run_node(n)
        if any(n in roots for roots in self.roots.values()):
            self.root_values[n] = value
        return value


def _is_reader(gm: torch.fx.GraphModule, n: torch.fx.Node) -> bool:
    return n.op in ("call_function", "call_method", "call_module") and _op_name(gm, n) in LAYOUT_READERS


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose eager value owns ``node``'s eager storage (``node`` unless it is a view)."""
    while True:
        value = _eager(node)
        viewed = [a for a in node.all_input_nodes if isinstance(value, torch.Tensor) and isinstance(_eager(a), torch.Tensor)
                  and _eager(a).dtype == value.dtype and _same_storage(_eager(a), value)]
        if not viewed:
            return node
        node = viewed[0]


def _eager(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without storage (sparse, nested)
        return False


def check_layouts(node: torch.fx.Node, arg_nodes: list, values: list) -> None:
    """Raise LayoutChanged if a tensor in ``values`` is laid out otherwise than its node's eager value."""
    for arg, value in zip(arg_nodes, values):
        if not isinstance(value, torch.Tensor):
            continue
        eager = _eager(arg)
        if not all(isinstance(s, int) for s in (*value.shape, *value.stride())):
            continue  # symbolic sizes: the layout passes decline them
        known = isinstance(eager, torch.Tensor)  # unknown: taken to differ
        if not known or _layout(eager) != _layout(value):
            raise LayoutChanged(f"{node.format_node()} reads {arg} with strides {tuple(value.stride())}, "
                                f"where eager's are {tuple(eager.stride()) if known else 'unknown'}")


def _layout(t: torch.Tensor) -> tuple:
    """Where each element lies: the offset, and strides of dims longer than 1 (a size-1 one's moves nothing)."""
    return t.storage_offset(), tuple(s if n != 1 else None for n, s in zip(t.shape, t.stride()))


def _op_name(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    """``torch.as_strided``, ``Tensor.as_strided``, ``aten.as_strided.default`` and the method call
    ``y.as_strided(...)`` are all ``as_strided``; a dropout module (a symbolically traced graph's
    leaf) is ``dropout``."""
    if node.op == "call_method":
        return node.target
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return "dropout" if isinstance(module, torch.nn.modules.dropout._DropoutNd) else ""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    return getattr(target, "__name__", "")
