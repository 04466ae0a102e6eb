"""The ATen-graph passes of inference tracing: a captured FX graph -> one functional ATen graph.

Each pass is ``(gm, ctx: PassContext) -> gm``; aot/passes.py lists them in order
(``aten_passes()``) and ``trace_inference`` runs the list. The traced GraphModule takes the same
inputs as ``gm`` (plus, after ``lift``, one per tensor attribute) and returns the same output
structure (Dynamo graphs return a flat tuple; a single tensor, a list, or None entries come
back as they went in). It contains only ATen ops (plus ``operator.getitem`` on multi-output
ops), with our decompositions applied, and is functional except for one documented exception:

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

from dataclasses import dataclass, field

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

from minicompile.aot.autocast import AutocastState
from minicompile.aot.custom_ops import functionalize_custom_ops
from minicompile.aot.fake import is_symbolic, make_fx_aten, to_fake, tracing
from minicompile.aot.layout_readers import LayoutCheckingInterpreter
from minicompile.aot.lift import lift_attributes
from minicompile.aot.policy import NEUTRAL, DevicePolicy
from minicompile.aot.runner import AtenProgram
from minicompile.aot.strides import restride_elementwise
from minicompile.decomp import DECOMPOSITIONS

aten = torch.ops.aten


@dataclass
class PassContext:
    """What the passes share: the example inputs and the fake tensors they are traced as."""
    inputs: list                                   # real tensors, FakeTensors, python ints or SymInts
    lifted: tuple = ()                             # tensor attributes ``lift`` made inputs, in order
    fake_mode: FakeTensorMode | None = None
    fake_inputs: list = field(default_factory=list)
    symbolic: bool = False
    static: frozenset = frozenset()                # positions of parameter/buffer inputs (cpu/prepare.py)
    policy: DevicePolicy = NEUTRAL                 # the backend's claims and passes (aot/policy.py)
    choices: list = field(default_factory=list)    # what the policy measured, one line each (the header)
    constructed_by: tuple = ()                     # the runners' stamps (aot/runner.py)
    prepared: object = None                        # the CPU's CachedPreparation (cpu/prepare.py)

    def program(self, gm) -> AtenProgram:
        return AtenProgram(gm, tuple(self.lifted), self.prepared, self.constructed_by, tuple(self.choices))
    autocast: AutocastState = field(default_factory=AutocastState.current)   # applied by the tracing passes


def lift(gm, ctx: PassContext):
    """Tensor attributes (parameters, buffers, optimizer state) become trailing inputs (aot/lift.py)."""
    gm, ctx.lifted = lift_attributes(gm)
    ctx.inputs = list(ctx.inputs) + list(ctx.lifted)
    return gm


def custom_ops(gm, ctx: PassContext):
    """Mutating custom ops become their functional extern twins (aot/custom_ops.py)."""
    return functionalize_custom_ops(gm)


def functionalize(gm, ctx: PassContext):
    """make_fx + torch.func.functionalize with our decomposition table: FX graph -> ATen graph.

    ``ctx.inputs`` may be real tensors, FakeTensors of one existing FakeTensorMode (e.g.
    Dynamo's), python ints or SymInts; runs without autograd.
    """
    ctx.fake_mode = detect_fake_mode(ctx.inputs) or FakeTensorMode(shape_env=ShapeEnv())
    ctx.fake_inputs = [to_fake(ctx.fake_mode, x) for x in ctx.inputs]
    ctx.symbolic = any(is_symbolic(x) for x in ctx.fake_inputs)

    with tracing(ctx), ctx.autocast.applied():
        if _runs_functorch_transforms(gm):
            gm = _without_functorch_transforms(gm, ctx)

        def run_graph(*args):
            # node by node, so each ATen node inherits its source node's stack trace
            return TracingInterpreter(gm, ctx.symbolic, ctx.policy.relayout_active).run(*args)
        return _make_fx(torch.func.functionalize(run_graph, remove="mutations"), ctx)


def _runs_functorch_transforms(gm) -> bool:
    """Dynamo's graph enters and leaves a functorch transform itself (``_vmap_increment_nesting``
    ... ``_vmap_decrement_nesting``: the vmap that flex_attention's default block mask is built with),
    or calls flex_attention with captured tensors: its score_mod, traced again inside
    torch.func.functionalize, indexes them through an autograd.Function functorch cannot
    functionalize; traced once alone first, the indexing is ``aten.index``."""
    return any(n.op == "call_function" and (getattr(n.target, "__module__", "") == "torch._functorch.predispatch"
                                            or _flex_with_captured_tensors(n))
               for n in gm.graph.nodes)


def _flex_with_captured_tensors(node) -> bool:
    return node.target is torch.ops.higher_order.flex_attention and any(len(a) for a in node.args[7:9])


def _without_functorch_transforms(gm, ctx: PassContext) -> torch.fx.GraphModule:
    """``gm`` traced once to ATen with no transform of ours around it: a vmap layer that the graph
    pushes above torch.func.functionalize's layer fails functorch's checks, and traced here alone
    the vmap becomes the batched ATen ops it stands for."""
    return make_fx(torch.fx.Interpreter(gm).run, tracing_mode="symbolic" if ctx.symbolic else "fake")(*ctx.fake_inputs)


# Torch functions whose C++ composite reads sizes as plain ints (at::linear flattens a 3-d input
# with input.sizes()), which would specialise a symbolic size: with symbolic inputs they run as
# our decomposition instead, before the dispatcher sees them.
SYMBOLIC_PREDECOMPOSE = {torch._C._nn.linear: aten.linear.default}


def _dropout(input, p=0.5, training=True, inplace=False):
    return NotImplemented if inplace else DECOMPOSITIONS[aten.dropout.default](input, p, training)


def _alpha_dropout(input, p=0.5, training=False, inplace=False):
    return NotImplemented if inplace else DECOMPOSITIONS[aten.alpha_dropout.default](input, p, training)


def _bernoulli_(self, p=0.5, *, generator=None):
    if not isinstance(p, float):
        return NotImplemented
    return DECOMPOSITIONS[aten.bernoulli_.float](self, p, generator=generator)


def _pad(input, pad, mode="constant", value=None):
    """A constant pad of a tensor with a size from data (nonzero's): a filled tensor with ``input``
    copied into its middle. The C++ constant_pad_nd reads ``input.sizes()`` as ints, which raises
    GuardOnDataDependentSymNode there (an input's symbolic size it specialises, as before)."""
    sizes = list(input.shape)
    if (mode != "constant" or not free_unbacked_symbols(sizes)
            or not all(isinstance(p, int) and p >= 0 for p in pad) or len(pad) % 2 or len(pad) > 2 * len(sizes)):
        return NotImplemented
    dims = [len(sizes) - 1 - k for k in range(len(pad) // 2)]
    for k, d in enumerate(dims):
        sizes[d] = sizes[d] + pad[2 * k] + pad[2 * k + 1]
    out = torch.full(sizes, 0 if value is None else value, dtype=input.dtype, device=input.device)
    middle = out
    for k, d in enumerate(dims):
        middle = middle.narrow(d, pad[2 * k], input.shape[d])
    middle.copy_(input)
    return out


# Calls that run as our decomposition first (NotImplemented: as written), static sizes or not.
# Under functionalization the C++ composites of dropout and alpha dropout would run below our
# table, and their in-place bernoulli_ becomes bernoulli.p, which draws in logical order where
# eager draws a dense tensor in memory order (decomp/dropout.py).
PREDECOMPOSE = {torch.nn.functional.dropout: _dropout, torch.dropout: lambda x, p, train: _dropout(x, p, train),
                torch.nn.functional.alpha_dropout: _alpha_dropout,
                torch.alpha_dropout: lambda x, p, train: _alpha_dropout(x, p, train),
                torch.Tensor.bernoulli_: _bernoulli_, aten.bernoulli_.float: _bernoulli_,
                torch._C._nn.pad: _pad, torch.nn.functional.pad: _pad}


class TracingInterpreter(LayoutCheckingInterpreter):
    """Runs a captured graph inside the trace, with the calls above sent to our decompositions;
    in the channels-last trace, ops that read a layout check it is eager's (aot/layout_readers.py)."""

    def __init__(self, gm: torch.fx.GraphModule, symbolic: bool, relayout_active=lambda: False):
        super().__init__(gm, relayout_active)
        self.symbolic = symbolic

    def call_function(self, target, args, kwargs):
        op = SYMBOLIC_PREDECOMPOSE.get(target) if self.symbolic else None
        if op in DECOMPOSITIONS:
            return DECOMPOSITIONS[op](*args, **kwargs)
        out = PREDECOMPOSE[target](*args, **kwargs) if target in PREDECOMPOSE else NotImplemented
        return super().call_function(target, args, kwargs) if out is NotImplemented else out

    def call_method(self, target, args, kwargs):
        first = PREDECOMPOSE.get(getattr(torch.Tensor, target, None))
        out = first(*args, **kwargs) if first is not None else NotImplemented
        return super().call_method(target, args, kwargs) if out is NotImplemented else out


def leftover_inplace(gm, ctx: PassContext):
    """In-place ops on intermediates that composite kernels left -> out-of-place (then re-decompose)."""
    rewritten = _functionalize_leftover_inplace(gm)
    if not any(op in DECOMPOSITIONS for op in rewritten):
        return gm
    # e.g. masked_fill_ became masked_fill, which decomposes to where: trace again.
    with tracing(ctx):
        return _make_fx(torch.fx.Interpreter(gm).run, ctx)


def dce(gm, ctx: PassContext):
    gm.graph.eliminate_dead_code()
    return gm


def input_meta(gm, ctx: PassContext):
    _add_missing_input_meta(gm, ctx.fake_inputs, ctx.fake_mode)
    gm.recompile()
    return gm


def check_meta(gm, ctx: PassContext):
    _check_meta(gm)
    return gm


def restride(gm, ctx: PassContext):
    """Elementwise nodes' meta['val'] get the strides eager's TensorIterator picks (aot/strides.py)."""
    restride_elementwise(gm, ctx.fake_mode)
    return gm


def alias_outputs(gm, ctx: PassContext):
    alias_mutated_outputs(gm, ctx.fake_mode)
    return gm


def trace_table(claims: dict) -> dict:
    """Our decomposition table with a backend's claims layered on (aot/policy.py).

    Built per trace from the live tables: a claim that declines (returns None) defers to
    the device-neutral decomposition registered now.
    """
    table = dict(DECOMPOSITIONS)
    for op, claim in claims.items():
        table[op] = _claimed(op, claim)
    return table


def _claimed(op, claim):
    def decompose(*args, **kwargs):
        out = claim(*args, **kwargs)
        if out is not None:
            return out
        neutral = DECOMPOSITIONS.get(op)
        return NotImplemented if neutral is None else neutral(*args, **kwargs)
    return decompose


def _make_fx(fn, ctx: PassContext) -> torch.fx.GraphModule:
    return make_fx_aten(fn, ctx, trace_table(ctx.policy.claims))


def _functionalize_leftover_inplace(gm: torch.fx.GraphModule) -> list:
    """Rewrite in-place ops on intermediates into their out-of-place form; returns the
    out-of-place overloads it introduced.

    Composite (CompositeImplicitAutograd) kernels such as rms_norm (``mean(...).add_(eps)``)
    and cross_entropy with label smoothing (``masked_fill_``) reach make_fx with their
    in-place calls intact even under torch.func.functionalize in torch 2.13. The mutated
    value is always a fresh intermediate there, so ``y = op_(x, ...)`` becomes
    ``y = op(x, ...)`` and later readers of ``x`` read ``y``. Mutations of graph inputs
    (copy_ into a placeholder), of anything that has views and of a view (its base would not
    see the result) are left untouched.
    """
    rewritten = []
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        functional = out_of_place_overload(node)
        if functional is None:
            continue
        mutated = node.args[0]
        if (not isinstance(mutated, torch.fx.Node) or mutated.op != "call_function" or _has_views(mutated, node)
                or _returns_alias(mutated.target)):
            continue
        later_readers = [u for u in mutated.users if u is not node and order[u] > order[node]]
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_function(functional, positional_args(node), node.kwargs)
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


# In-place ops whose out-of-place form has another overload name. bernoulli.p fills a fresh
# contiguous tensor (empty_like + bernoulli_, the same draws from the generator), so it stands
# for bernoulli_ only on a contiguous tensor (dropout's empty_like of a contiguous input).
_RENAMED_OUT_OF_PLACE = {aten.bernoulli_.float: aten.bernoulli.p}


def positional_args(node: torch.fx.Node) -> tuple:
    """The node's positional arguments with the defaults FX left out (bernoulli_'s p=0.5 is a
    default there, but a required argument of bernoulli.p)."""
    args = list(node.args)
    for a in [a for a in node.target._schema.arguments if not a.kwarg_only][len(args):]:
        if a.name in node.kwargs or not a.has_default_value():
            break
        args.append(a.default_value)
    return tuple(args)


def out_of_place_overload(node: torch.fx.Node):
    """aten.add_.Scalar -> aten.add.Scalar for an in-place aten op; None otherwise."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target in _RENAMED_OUT_OF_PLACE:
        self = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return _RENAMED_OUT_OF_PLACE[target] if isinstance(self, torch.Tensor) and self.is_contiguous() else None
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_") or target.namespace != "aten":
        return None
    if name == "copy_":
        return None  # the write-back into a mutated input: kept on purpose
    packet = getattr(aten, name[:-1], None)
    if packet is None:
        return None
    # by argument types, not overload name: pow_.Scalar (Tensor self, Scalar exponent) is
    # pow.Tensor_Scalar; pow.Scalar takes a Scalar self
    types = _argument_types(target)
    return next((getattr(packet, o) for o in packet.overloads() if _argument_types(getattr(packet, o)) == types), None)


def _argument_types(op) -> list:
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def _has_views(node: torch.fx.Node, mutation: torch.fx.Node) -> bool:
    # A view of the mutated tensor would observe the mutation; replacing the base alone
    # would change what the view reads.
    return any(user is not mutation and _returns_alias(user.target) for user in node.users)


def _returns_alias(target) -> bool:
    """An ATen op whose result shares storage with an argument (a view)."""
    return isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None for r in target._schema.returns)


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
    return (node.op == "call_function" and _returns_alias(node.target) and not node.target._schema.is_mutable
            and len(node.target._schema.returns) == 1 and node.args and isinstance(node.args[0], torch.fx.Node))


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)
            and va.dtype == vb.dtype and tuple(va.shape) == tuple(vb.shape))
