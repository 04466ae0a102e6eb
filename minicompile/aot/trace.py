"""Inference tracing: a captured FX graph -> one functional ATen graph, via our table.

    traced = trace_inference(gm, example_inputs)

The traced GraphModule takes the same inputs as ``gm`` and returns the same output
structure (Dynamo graphs return a flat tuple; a single tensor, a list, or None entries
come back as they went in). It contains only ATen ops (plus ``operator.getitem`` on
multi-output ops), with our decompositions applied, and is functional except for one
documented exception:

    input mutation: ``x.add_(1)`` on a graph input ``x`` is traced as the out-of-place
    ``aten.add`` and, at the very end of the graph (before the output node), an
    ``aten.copy_.default(x, new_value)`` that writes the final value back into the
    input's storage. The copy_ nodes are the only mutating nodes; nothing reads them.

Every placeholder, get_attr and call_function node carries ``node.meta["val"]``: a
FakeTensor with eager's size/stride/dtype/device (elementwise ops' strides are recomputed
as eager's TensorIterator picks them, see ``strides.py``; or a tuple of them for multi-output
ops, or a python/Sym int for int inputs).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
import torch.fx.traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from minicompile.aot.custom_ops import functionalize_custom_ops
from minicompile.aot.strides import restride_elementwise
from minicompile.decomp import DECOMPOSITIONS
from minicompile.decomp.linalg import fold_gelu_into_onednn_linear

aten = torch.ops.aten


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
    """Trace ``gm`` (called with ``example_inputs``) to a functional, decomposed ATen graph.

    ``example_inputs`` may be real tensors, FakeTensors of one existing FakeTensorMode
    (e.g. Dynamo's), python ints or SymInts. Runs without autograd: only call it when no
    gradients are needed.
    """
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(shape_env=ShapeEnv())
    fake_inputs = [_to_fake(fake_mode, x) for x in example_inputs]
    symbolic = any(_is_symbolic(x) for x in fake_inputs)

    gm = functionalize_custom_ops(gm)

    def run_graph(*args):
        # node by node, so each ATen node inherits its source node's stack trace
        return torch.fx.Interpreter(gm).run(*args)

    with torch.no_grad(), _real_constants_allowed(fake_mode), torch.fx.traceback.preserve_node_meta():
        traced = _make_fx(torch.func.functionalize(run_graph, remove="mutations"), fake_inputs, symbolic)
        rewritten = _functionalize_leftover_inplace(traced)
        if any(op in DECOMPOSITIONS for op in rewritten):
            # e.g. masked_fill_ became masked_fill, which decomposes to where: trace again.
            traced = _make_fx(torch.fx.Interpreter(traced).run, fake_inputs, symbolic)
    traced.graph.eliminate_dead_code()
    fold_gelu_into_onednn_linear(traced)
    _add_missing_input_meta(traced, fake_inputs, fake_mode)
    traced.recompile()
    _check_meta(traced)
    restride_elementwise(traced, fake_mode)
    alias_mutated_outputs(traced, fake_mode)
    return traced


@contextlib.contextmanager
def _real_constants_allowed(fake_mode: FakeTensorMode):
    """Let real tensors held by gm (parameters, buffers, constants) meet fake inputs.

    make_fx records them as get_attr nodes; the flag is restored afterwards because the
    fake mode may be Dynamo's.
    """
    saved = fake_mode.allow_non_fake_inputs
    fake_mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        fake_mode.allow_non_fake_inputs = saved


def _make_fx(fn, fake_inputs, symbolic: bool) -> torch.fx.GraphModule:
    # "symbolic" reuses the inputs' ShapeEnv and turns on the Python dispatcher, which
    # some decompositions of dynamic shapes need; with static inputs "fake" is enough.
    return make_fx(
        fn,
        decomposition_table=DECOMPOSITIONS,
        tracing_mode="symbolic" if symbolic else "fake",
    )(*fake_inputs)


def _to_fake(fake_mode: FakeTensorMode, x):
    if isinstance(x, FakeTensor) or not isinstance(x, torch.Tensor):
        return x
    # A real tensor keeps its exact sizes and strides: the caller specialised on them.
    return fake_mode.from_tensor(x, static_shapes=True)


def _is_symbolic(x) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))
    return False


def _functionalize_leftover_inplace(gm: torch.fx.GraphModule) -> list:
    """Rewrite in-place ops on intermediates into their out-of-place form; returns the
    out-of-place overloads it introduced.

    Composite (CompositeImplicitAutograd) kernels such as rms_norm (``mean(...).add_(eps)``)
    and cross_entropy with label smoothing (``masked_fill_``) reach make_fx with their
    in-place calls intact even under torch.func.functionalize in torch 2.13. The mutated
    value is always a fresh intermediate there, so ``y = op_(x, ...)`` becomes
    ``y = op(x, ...)`` and later readers of ``x`` read ``y``. Mutations of graph inputs
    (copy_ into a placeholder) and of anything that has views are left untouched.
    """
    rewritten = []
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        functional = _out_of_place_overload(node)
        if functional is None:
            continue
        mutated = node.args[0]
        if not isinstance(mutated, torch.fx.Node) or mutated.op != "call_function" or _has_views(mutated, node):
            continue
        later_readers = [u for u in mutated.users if u is not node and order[u] > order[node]]
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_function(functional, node.args, node.kwargs)
        replacement.meta = dict(node.meta)
        order[replacement] = order[node]
        node.replace_all_uses_with(replacement)
        for user in later_readers:
            user.replace_input_with(mutated, replacement)
        gm.graph.erase_node(node)
        rewritten.append(functional)
    if rewritten:
        gm.recompile()
    return rewritten


def _out_of_place_overload(node: torch.fx.Node):
    """aten.add_.Scalar -> aten.add.Scalar for an in-place aten op; None otherwise."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_") or target.namespace != "aten":
        return None
    if name == "copy_":
        return None  # the write-back into a mutated input: kept on purpose
    packet = getattr(aten, name[:-1], None)
    overload = target._overloadname
    if packet is None or overload not in packet.overloads():
        return None
    return getattr(packet, overload)


def _has_views(node: torch.fx.Node, mutation: torch.fx.Node) -> bool:
    # A view of the mutated tensor would observe the mutation; replacing the base alone
    # would change what the view reads.
    return any(
        user is not mutation
        and isinstance(user.target, torch._ops.OpOverload)
        and any(r.alias_info is not None for r in user.target._schema.returns)
        for user in node.users
    )


def _add_missing_input_meta(gm: torch.fx.GraphModule, fake_inputs: list, fake_mode: FakeTensorMode) -> None:
    """make_fx leaves meta['val'] off python-int placeholders (they are specialised) and
    off get_attr constants; fill both in so every input-like node carries one."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, fake_inputs):
        node.meta.setdefault("val", value)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and "val" not in node.meta:
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)


def _check_meta(gm: torch.fx.GraphModule) -> None:
    for n in gm.graph.nodes:  # ops that return nothing (e.g. _linalg_check_errors) carry val=None
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and not n.target._schema.returns:
            n.meta.setdefault("val", None)
    missing = [n.format_node() for n in gm.graph.nodes if n.op in ("placeholder", "call_function") and "val" not in n.meta]
    if missing:
        raise RuntimeError(
            "trace_inference produced nodes without meta['val'] (a tracing bug; please report "
            "it with this graph):\n  " + "\n  ".join(missing)
        )


def alias_mutated_outputs(gm: torch.fx.GraphModule, fake_mode: FakeTensorMode) -> None:
    """An output that is a mutated input (or a view of one) is that input, as in eager.

    Functionalization turns ``x.mul_(2); return x`` into ``mul = x * 2; copy_(x, mul);
    return mul``: a new tensor with the right values but not ``x`` itself, so a later
    ``out.add_(1)`` by the caller would not reach ``x``. Here such an output (``mul``, or a
    chain of views of it) is rebuilt on the input after its ``copy_``, so the wrapper hands
    back the caller's tensor or a view of its storage.
    """
    output = next(n for n in gm.graph.nodes if n.op == "output")
    written = {n.args[1]: n for n in gm.graph.nodes
               if n.op == "call_function" and n.target is aten.copy_.default and n.args[0].op == "placeholder"}
    if not written:
        return
    changed = False

    def rebuild(leaf):
        nonlocal changed
        chain, node = [], leaf
        while isinstance(node, torch.fx.Node) and node not in written and _is_view(node):
            chain.append(node)
            node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node not in written:
            return leaf
        copy = written[node]
        value = copy.args[0]
        if not _same_meta(value, node):
            return leaf
        with gm.graph.inserting_before(output):
            for view in reversed(chain):
                new = gm.graph.call_function(view.target, (value, *view.args[1:]), dict(view.kwargs))
                new.meta = dict(view.meta)
                try:
                    with fake_mode:
                        new.meta["val"] = view.target(value.meta["val"], *view.args[1:], **view.kwargs)
                except Exception:  # the view is not expressible on the input's strides: keep a copy
                    return leaf
                value = new
        changed = True
        return value

    output.args = (torch.fx.node.map_arg(output.args[0], rebuild),)
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and node.args
            and isinstance(node.args[0], torch.fx.Node) and not target._schema.is_mutable
            and len(target._schema.returns) == 1 and target._schema.returns[0].alias_info is not None)


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)
            and va.dtype == vb.dtype and tuple(va.shape) == tuple(vb.shape))
