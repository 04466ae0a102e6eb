"""Fake tensors and make_fx, shared by the ATen tracers: inference (aot/trace.py) and the joint
forward/backward trace (aot/joint.py).

    fake = to_fake(fake_mode, x)                  a real tensor -> a FakeTensor of its exact layout
    with tracing(ctx): gm = make_fx_aten(fn, ctx, decompositions)

``ctx`` is the pass context (aot/trace.py ``PassContext``): ``fake_mode``, ``fake_inputs``
(what ``fn`` is called with) and ``symbolic``. ``refake_from`` re-runs the fake kernels of the
nodes downstream of placeholders whose fake values changed (a graph compiled for inputs laid out
a little differently from the ones it was traced with).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx
import torch.fx.traceback
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def to_fake(fake_mode: FakeTensorMode, x):
    if isinstance(x, FakeTensor) or not isinstance(x, torch.Tensor):
        return x
    # A real tensor keeps its exact sizes and strides: the caller specialised on them.
    return fake_mode.from_tensor(x, static_shapes=True)


def is_symbolic(x) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))
    return False


@contextlib.contextmanager
def real_constants_allowed(fake_mode: FakeTensorMode):
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


@contextlib.contextmanager
def tracing(ctx):
    """No autograd, real constants allowed, each ATen node keeping its source node's meta."""
    with torch.no_grad(), real_constants_allowed(ctx.fake_mode), torch.fx.traceback.preserve_node_meta():
        yield


def make_fx_aten(fn, ctx, decompositions: dict) -> torch.fx.GraphModule:
    """``fn`` traced on ``ctx.fake_inputs`` to an ATen graph, with ``decompositions`` applied."""
    # "symbolic" reuses the inputs' ShapeEnv and turns on the Python dispatcher, which
    # some decompositions of dynamic shapes need; with static inputs "fake" is enough.
    return make_fx(
        fn,
        decomposition_table=decompositions,
        tracing_mode="symbolic" if ctx.symbolic else "fake",
    )(*ctx.fake_inputs)


def refake_from(gm: torch.fx.GraphModule, fake_mode: FakeTensorMode, changed: set) -> None:
    """Re-run the fake kernel of every node that reads a node in ``changed`` (placeholders whose
    ``meta["val"]`` was replaced), so each ``meta["val"]`` follows its inputs' new strides."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not any(a in changed for a in node.all_input_nodes):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        with fake_mode:
            val = node.target(*args, **kwargs)
        node.meta["val"] = val
        changed.add(node)


def dynamo_fakes(example_inputs: list) -> list | None:
    """Dynamo's real example inputs as fake tensors with its symbolic sizes, in the fake mode it
    hands the backend (the TracingContext's: a fresh mode on Dynamo's ShapeEnv), as AOTAutograd
    fakes them: each tensor with the symbolic context Dynamo recorded for it, so its sizes are
    Dynamo's symbols (``s33``) and a float input Dynamo made a tensor keeps its SymFloat (the
    ``.item()`` of LayerNorm's eps). The placeholders' ``example_value`` fakes belong to Dynamo's
    own tracing mode, which the backend's mode would convert (losing those). None outside Dynamo."""
    context = torch._guards.TracingContext.try_get()
    mode = getattr(context, "fake_mode", None)
    if mode is None or mode.shape_env is None:
        return None
    fakes = []
    for x in example_inputs:
        if isinstance(x, FakeTensor) or not isinstance(x, torch.Tensor):
            fakes.append(x)
            continue
        symbolic = context.tensor_to_context.get(x) if x in context.tensor_to_context else None
        if symbolic is None:
            fakes.append(mode.from_tensor(x, static_shapes=True))
        else:
            fakes.append(mode.from_tensor(x, symbolic_context=symbolic, source=symbolic.tensor_source, trace=False))
    return fakes


def with_item_memos(args: tuple, fakes: list) -> tuple:
    """make_fx in symbolic mode hands the traced function fresh fakes of its inputs, without the
    number a fake scalar stands for (``item_memo``: a float input Dynamo made a tensor, whose
    ``.item()`` is the SymFloat ``zf41``); each gets its input's back, as AOTAutograd's
    ``_detach_and_copy_item_memo`` does, so ``.item()`` is that symbol, not a data-dependent read."""
    for arg, fake in zip(args, fakes):
        memo = getattr(fake, "item_memo", None) if isinstance(fake, FakeTensor) else None
        if memo is not None and isinstance(arg, FakeTensor) and arg is not fake:
            arg.item_memo = memo
    return args
