"""The joint trace: a captured forward graph -> one ATen graph of forward and backward.

    joint = trace_joint(gm, example_inputs)          JOINT_PASSES, run and stamped by aot/runner.py
    joint.graph: (*primals, *tangents) -> (*outputs, *grads)

make_fx runs "the forward, then ``torch.autograd.grad`` of its differentiable outputs with
tangent inputs" on fake tensors with our decomposition table, so autograd's backward formulas (``threshold_backward``, ``native_layer_norm_backward``, ...) decompose
into core ops (decomp/backward.py) and fuse like forward ones. ``grads[k]`` is the gradient
of primal ``grad_inputs[k]`` (None where no output depends on it). Each backward node carries
the source line of the forward node it differentiates (aot/backward_sources.py). Under
autocast the forward records eager's casts and the backward is traced with autocast off
(aot/autocast.py).

The result is functional, as the inference trace is, but not through torch.func.functionalize:
its wrappers hide ``requires_grad`` from autograd inside the transform. In-place ops on
inputs that do not require grad (BatchNorm's running statistics, ``num_batches_tracked``)
become their out-of-place form, later readers read the new value, and one ``copy_`` per
mutated input at the end writes it back: the inference trace's input write-back (aot/trace.py),
which the partitioner puts in the forward graph and CompiledGraph runs (``mutated_inputs``).
In-place ops composite kernels leave on intermediates are rewritten by the inference pass that
handles them (``trace.leftover_inplace``; dropout's ``bernoulli_`` too), and a joint graph that
still holds a mutating op (one on a view) is traced once more, through torch.func.functionalize
(gradients are explicit values by then); a mutating op left after that is refused.

Random ops (dropout's ``bernoulli``) stay extern ATen calls in the forward graph, in graph
order, so they draw from torch's generator exactly as eager does; the partitioner never
recomputes them, so backward reads the forward's mask.

Graphs whose training semantics the partitioned runtime does not reproduce yet are refused
up front with a reason (``TrainingUnsupported``); the caller runs them eagerly, so no
gradient is ever wrong: mutation of an input that requires grad, outputs aliasing inputs or
each other, tensor attributes that require grad (their gradient would be lost),
data-dependent sizes in the joint graph, and random draws in a checkpointed region that does not
preserve the RNG state (``torch.utils.checkpoint`` regions: aot/checkpoint.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.fx.traceback
from torch._dispatch.python import enable_python_dispatcher
from torch.multiprocessing.reductions import StorageWeakRef
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv, free_unbacked_symbols
from torch.utils import _pytree as pytree

from minicompile.aot import trace
from minicompile.aot.autocast import autocast_off, no_autocast_cache
from minicompile.aot.fake import make_fx_aten, real_constants_allowed, to_fake, tracing, with_item_memos
from minicompile.aot.conv_layout_train import layout_mode, restore_grads, restore_outputs, tangents_like
from minicompile.aot.backward_sources import SourceInterpreter, backward_sources
from minicompile.aot.checkpoint import is_random, rng_not_preserved, tagged, tolerant_bodies
from minicompile.aot.policy import NEUTRAL, DevicePolicy
from minicompile.aot.pool_offsets import compress_pool_indices
from minicompile.aot.runner import AtenPass, run_passes
from minicompile.aot.strides import is_non_overlapping_and_dense

aten = torch.ops.aten


class TrainingUnsupported(Exception):
    """A training graph the compiled runtime cannot reproduce exactly; the message says why."""


@dataclass
class JointGraph:
    graph: torch.fx.GraphModule    # (*primals, *tangents) -> (*outputs, *grads)
    num_primals: int
    num_outputs: int               # flat forward outputs, first in the joint's output tuple
    grad_inputs: tuple             # positions of the primals whose gradients come after the outputs
    diff_outputs: tuple            # positions of the outputs that take a tangent (differentiable)
    constructed_by: tuple = ()     # the joint trace's stamps (aot/runner.py)
    choices: tuple = ()            # what the device policy measured
    views: tuple = ()              # outputs the runtime rebuilds as views of an input or output (_views)


@dataclass
class JointContext(trace.PassContext):
    """The pass context (aot/trace.py) and what the joint trace learns on the way."""
    outputs: list = field(default_factory=list)    # the forward's outputs, fake
    grad_inputs: tuple = ()
    diff_outputs: tuple = ()
    rng_not_preserved: bool = False                # a checkpoint call says preserve_rng_state=False
    views: tuple = ()


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, policy: DevicePolicy = NEUTRAL) -> JointGraph:
    """Trace ``gm`` with its backward (``policy``'s claims layered on the decompositions,
    aot/policy.py); raises TrainingUnsupported for graphs that must run eagerly. The joint graph is
    stamped with JOINT_PASSES and their times (aot/runner.py)."""
    _check_graph(gm)
    ctx = JointContext(list(example_inputs), policy=policy)
    graph = run_passes(gm, ctx, JOINT_PASSES, "trace_joint")
    return JointGraph(graph, len(ctx.inputs), len(ctx.outputs), ctx.grad_inputs, ctx.diff_outputs, ctx.constructed_by,
                      tuple(ctx.choices), ctx.views)


def fake_forward(gm, ctx: JointContext):
    """The forward on fake tensors: its outputs, which of them take a tangent, and the refusals
    it reveals (mutation of an input that requires grad, outputs aliasing inputs)."""
    ctx.fake_mode = detect_fake_mode(ctx.inputs) or FakeTensorMode(shape_env=ShapeEnv())
    primals = [to_fake(ctx.fake_mode, x) for x in ctx.inputs]
    with ctx.autocast.applied():
        ctx.outputs = _fake_forward(gm, primals, ctx.fake_mode)
    ctx.views = _views(primals, ctx.outputs)
    ctx.grad_inputs = tuple(i for i, p in enumerate(primals) if isinstance(p, torch.Tensor) and p.requires_grad)
    ctx.diff_outputs = tuple(i for i, o in enumerate(ctx.outputs)
                             if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point)
    if not ctx.diff_outputs:
        raise TrainingUnsupported("no output depends on an input that requires grad")
    with ctx.fake_mode:
        tangents = [torch.empty(ctx.outputs[i].shape, dtype=ctx.outputs[i].dtype, device=ctx.outputs[i].device)
                    for i in ctx.diff_outputs]
    ctx.fake_inputs = primals + tangents
    ctx.rng_not_preserved = rng_not_preserved(gm)
    return gm


def trace_forward_backward(gm, ctx: JointContext):
    """make_fx of "the forward, then torch.autograd.grad" -> the joint graph (channels-last
    convolutions where that layout holds, aot/conv_layout_train.py)."""
    with tolerant_bodies(gm):   # torch.utils.checkpoint regions (aot/checkpoint.py)
        return _trace_channels_last(gm, ctx, ctx.outputs, ctx.grad_inputs, ctx.diff_outputs)


def name_inputs(graph, ctx: JointContext):
    """The joint graph's inputs are named for what they are: primals_1.., tangents_1.. (make_fx
    called them arg0_1..); the partition's report and both halves use these names."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(placeholders):
        name = f"primals_{k + 1}" if k < len(ctx.inputs) else f"tangents_{k - len(ctx.inputs) + 1}"
        node._rename(name)
        node.target = node.name
    graph.recompile()
    return graph


def functionalize_leftover(graph, ctx):
    """Mutating ops the backward formulas leave: traced once more, functionalized (rarely runs)."""
    return _functionalize(graph, ctx) if _mutating_nodes(graph) else graph


def _trace_channels_last(gm, ctx, eager_outputs: list, grad_inputs: tuple, diff_outputs: tuple):
    """The joint graph with CPU convolutions channels-last (aot/conv_layout_train.py); as the user
    wrote it if that layout fails (a view only NCHW allows, an output layout a clone cannot restore)."""
    shape = (gm, ctx.fake_inputs, eager_outputs, grad_inputs, diff_outputs)
    mode = layout_mode()
    if mode is not None and not ctx.policy.train_channels_last(gm, ctx.choices):   # measured by the policy
        mode = None
    try:
        return _trace(_joint_function(*shape, mode), ctx)
    except Exception:
        if mode is None or not mode.claimed:
            raise
    return _trace(_joint_function(*shape, None), ctx)


def _trace(joint_fn, ctx):
    with (torch.enable_grad(), real_constants_allowed(ctx.fake_mode), torch.fx.traceback.preserve_node_meta(),
          ctx.autocast.applied()):
        try:
            return make_fx_aten(joint_fn, ctx, trace.trace_table(ctx.policy.claims))
        except GuardOnDataDependentSymNode as e:
            raise TrainingUnsupported(f"the backward branches on a data-dependent value ({e.cond})") from None


def _joint_function(gm, fakes: list, eager_outputs: list, grad_inputs: tuple, diff_outputs: tuple, mode=None):
    """``fakes``: the joint's fake inputs, primals first; ``mode``: None, or the channels-last mode
    the forward runs under; outputs and gradients it changed get eager's layouts back
    (``eager_outputs``: the forward's outputs traced without it)."""
    num_primals = len(fakes) - len(diff_outputs)

    def joint(*args):
        primals = with_item_memos(args, fakes)[:num_primals]
        with mode if mode is not None else contextlib.nullcontext():
            changed_layouts = lambda: mode is not None and mode.claimed > 0  # noqa: E731
            run = SourceInterpreter(gm, changed_layouts)
            outputs = pytree.tree_leaves(run.run(*primals))
        tangents = list(args[num_primals:])
        if mode is not None and mode.claimed:
            tangents = tangents_like(tangents, [outputs[i] for i in diff_outputs])
            outputs = restore_outputs(outputs, eager_outputs)
        # backward nodes get their forward node's source line; autocast is off, as in eager's
        # backward() after the autocast block (aot/autocast.py)
        with backward_sources(run, outputs), autocast_off():
            grads = torch.autograd.grad([outputs[i] for i in diff_outputs], [primals[i] for i in grad_inputs],
                                        tangents, allow_unused=True)
        if mode is not None and mode.claimed:
            grads = restore_grads(grads, [primals[i] for i in grad_inputs])
        return (*outputs, *grads)
    return joint


def _fake_forward(gm, primals: list, fake_mode) -> list:
    """Run the forward on fake tensors: its outputs' metadata, and the refusals it reveals."""
    versions = [p._version if isinstance(p, torch.Tensor) else None for p in primals]
    # the Python dispatcher, as the symbolic trace has it: without it the fake kernel of some ops
    # (constant_pad_nd: HF's shifted labels) reads sizes as ints, fixing a symbolic size for good
    symbolic = any(isinstance(s, torch.SymInt) for p in primals if isinstance(p, torch.Tensor) for s in p.shape)
    python_kernels = enable_python_dispatcher() if symbolic else contextlib.nullcontext()
    with torch.enable_grad(), fake_mode, python_kernels, real_constants_allowed(fake_mode), no_autocast_cache():
        outputs = pytree.tree_leaves(torch.fx.Interpreter(gm).run(*primals))
    if any(isinstance(p, torch.Tensor) and p._version != v and p.requires_grad for p, v in zip(primals, versions)):
        raise TrainingUnsupported("the graph mutates an input that requires grad")
    return outputs


def _views(primals: list, outputs: list) -> tuple:
    """Outputs aliasing an input or another output as eager's do (Gemma2's cache: its keys, their
    last window): (output, base, size, stride, offset past the base's, the base's stride). The base: an input from the
    end (-1: the last) when the output is that input, or an output whose dense memory holds them all."""
    groups, views = {}, []
    for k, t in enumerate([*primals, *outputs]):
        if isinstance(t, torch.Tensor):
            groups.setdefault(StorageWeakRef(t.untyped_storage()), []).append((k - len(primals), t))
    for group in groups.values():
        outs = [m for m in group if m[0] >= 0]
        bases = [m for m in group if m[0] < 0] or group   # sharing an input's storage: a view of that input
        base = next((b for b in bases if all(m is b or _holds(*b, m[1]) for m in outs)), None)
        if base is None:
            raise TrainingUnsupported("an output aliases an input or another output (a view)")
        at = base[1].storage_offset()
        views += [(p, base[0], tuple(t.shape), t.stride(), t.storage_offset() - at, base[1].stride())
                  for p, t in outs if p != base[0]]
    return tuple(sorted(views))


def _holds(position: int, base: torch.Tensor, view: torch.Tensor) -> bool:
    geometry = lambda t: (tuple(t.shape), t.stride(), t.storage_offset())  # noqa: E731
    if base.dtype != view.dtype or not all(isinstance(v, int) for v in pytree.tree_leaves((geometry(base), geometry(view)))):
        return False
    if position < 0:   # an input: itself only (x.to(its device)); a view of it has a layout the caller's
        return view is base
    start = view.storage_offset() - base.storage_offset()
    end = start + sum((n - 1) * st for n, st in zip(view.shape, view.stride()))
    return is_non_overlapping_and_dense(base) and min(view.stride(), default=0) >= 0 and 0 <= start <= end < base.numel()


def _check_graph(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise TrainingUnsupported(f"tensor attribute {node.target} requires grad (it is not a graph input)")


def check_joint(graph: torch.fx.GraphModule, ctx=None) -> torch.fx.GraphModule:
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target._schema.is_mutable and not is_input_write(node):
            raise TrainingUnsupported(f"in-place op {node.target} in the forward or backward graph")
    return graph


def check_checkpoint_rng(graph: torch.fx.GraphModule, ctx) -> torch.fx.GraphModule:
    """A random draw in a checkpointed region that does not preserve the RNG state (aot/checkpoint.py)."""
    if ctx.rng_not_preserved and any(tagged(n) and is_random(n) for n in graph.graph.nodes):
        raise TrainingUnsupported("a checkpointed region draws random numbers with preserve_rng_state=False: "
                                  "eager's recomputation draws a new mask, which the compiled backward does "
                                  "not reproduce")
    return graph


def check_static(graph: torch.fx.GraphModule, ctx=None) -> torch.fx.GraphModule:
    """A data-dependent size (index_put with a boolean mask: its backward indexes by the mask's
    nonzero positions) cannot be compiled statically; Dynamo graph-breaks at such ops in the
    forward, but the backward formula is ours to trace."""
    for node in graph.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor) and free_unbacked_symbols(v):   # Dynamo's s33 is fine; u0 is not
                raise TrainingUnsupported(f"{node.target} has a data-dependent shape in the joint graph")
    return graph


def _mutating_nodes(graph: torch.fx.GraphModule) -> list:
    """Mutating ops other than the input write-backs (which stay, for the forward graph)."""
    return [n for n in graph.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target._schema.is_mutable and not is_input_write(n)]


def _functionalize(graph: torch.fx.GraphModule, ctx) -> torch.fx.GraphModule:
    """In-place ops that autograd's backward formulas leave (``fft_c2r_backward`` doubles a
    ``narrow`` of its result with ``mul_``) become functional ops: the joint graph is plain ATen
    with explicit gradients now, so torch.func.functionalize can trace it without autograd."""
    run = torch.func.functionalize(torch.fx.Interpreter(graph).run, remove="mutations")
    with tracing(ctx):
        graph = make_fx_aten(run, ctx, trace.trace_table(ctx.policy.claims))
    for p in _AFTER_TRACE:
        graph = p.run(graph, ctx)
    return graph


def drop_detach(graph: torch.fx.GraphModule, ctx=None) -> torch.fx.GraphModule:
    """Autograd's saved-value ``detach`` calls mean nothing in a graph without autograd."""
    for node in list(graph.graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            graph.graph.erase_node(node)
    graph.recompile()
    return graph


def is_input_write(node: torch.fx.Node) -> bool:
    """The ``copy_`` that writes a mutated input's new value back (the forward graph's last nodes)."""
    return node.target is aten.copy_.default and node.args[0].op == "placeholder"


def input_mutations(graph: torch.fx.GraphModule, ctx=None) -> torch.fx.GraphModule:
    """``x.add_(1)`` (or ``copy_(x, v)``) on an input -> ``y = x + 1``; later readers of x read y;
    one ``copy_(x, y)`` before the output. Inputs that require grad were refused already."""
    latest = {}
    for node in list(graph.graph.nodes):
        if node.op == "output":
            with graph.graph.inserting_before(node):
                for placeholder, value in latest.items():
                    write = graph.graph.call_function(aten.copy_.default, (placeholder, value))
                    write.meta["val"] = placeholder.meta.get("val")
            break
        mutated = _mutated_input(node)
        for placeholder, value in latest.items():
            node.replace_input_with(placeholder, value)
        if mutated is not None:
            latest[mutated] = _out_of_place(graph, node, mutated)
    graph.recompile()
    return graph


def _mutated_input(node: torch.fx.Node):
    if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.is_mutable and node.args and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].op == "placeholder"):
        return node.args[0]
    return None


def _out_of_place(graph: torch.fx.GraphModule, node: torch.fx.Node, mutated: torch.fx.Node) -> torch.fx.Node:
    """The node's new value of ``mutated``, computed without writing it; erases ``node``."""
    if node.target is aten.copy_.default:
        value, src = node.args[1], node.args[1].meta.get("val")
        dst = mutated.meta.get("val")
        if not (isinstance(src, torch.Tensor) and src.dtype == dst.dtype and src.shape == dst.shape):
            raise TrainingUnsupported(f"copy_ into input {mutated.name} that converts or broadcasts")
    else:
        functional = trace.out_of_place_overload(node)
        if functional is None:
            raise TrainingUnsupported(f"in-place op {node.target} on input {mutated.name}")
        with graph.graph.inserting_before(node):
            value = graph.graph.call_function(functional, trace.positional_args(node), node.kwargs)
        value.meta = dict(node.meta)
    node.replace_all_uses_with(value)
    graph.graph.erase_node(node)
    return value


# The ATen passes after the joint make_fx that the inference trace runs too (aot/trace.py).
_AFTER_TRACE = (AtenPass("leftover_inplace", trace.leftover_inplace), AtenPass("dce", trace.dce),
                AtenPass("input_meta", trace.input_meta), AtenPass("check_meta", trace.check_meta))

JOINT_PASSES = (
    AtenPass("custom_ops", trace.custom_ops),              # the captured graph: mutating custom ops -> functional
    AtenPass("fake_forward", fake_forward),                # outputs, tangents; refusals
    AtenPass("trace", trace_forward_backward),             # make_fx: forward + autograd.grad -> joint graph
    AtenPass("check_static", check_static),                # no data-dependent sizes
    AtenPass("check_checkpoint_rng", check_checkpoint_rng),  # checkpointed draws eager would not repeat
    AtenPass("drop_detach", drop_detach),                  # autograd's saved-value detach
    AtenPass("input_mutations", input_mutations),          # in-place ops on inputs -> out of place + copy_
    *_AFTER_TRACE,
    AtenPass("functionalize_leftover", functionalize_leftover),
    AtenPass("check_joint", check_joint),                  # no mutating op left but the input write-backs
    AtenPass("compress_pool_indices", compress_pool_indices),  # max pooling's indices: int8 offsets to save
    AtenPass("name_inputs", name_inputs),                  # primals_1.., tangents_1..
)
