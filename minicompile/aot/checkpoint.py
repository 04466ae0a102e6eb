"""Activation checkpointing: which forward values a ``torch.utils.checkpoint`` region computed, and
what the partitioner (aot/partition.py) makes of them.

Dynamo hands a checkpointed call over as the higher-order op ``tag_activation_checkpoint`` (a
body graph and its inputs; a selective policy's ``context_fn`` rides in the body's
``meta["_checkpoint_context_fn"]``, untraced). The joint trace runs it as torch does under a
tracer: torch's checkpoint with a selective-checkpoint policy that caches every value, so the
recomputation in the backward reads the forward's nodes (nothing is traced twice) and each ATen
node the region made carries ``meta["recompute"]`` and ``meta["ac_graph_id"]`` (one id per
region). Without a ``context_fn`` the policy is ``PREFER_RECOMPUTE`` for every op; with one, it
is the user's answer for the op eager's dispatch sees (``aten.addmm``, ``aten.bmm``,
``aten.gelu``: the policy is asked above our decompositions and the device policy's claims), and
every node that op's decomposition made carries it (an ``addmm`` MUST_SAVE: its ``mm`` and bias
``add``, or the ``_linear_pointwise`` that claimed it). ``config.checkpoint`` says what becomes of them:

    recompute   as eager: values the policy recomputes (MUST_/PREFER_RECOMPUTE) are recomputed in
                the backward from what flowed into the region, never saved, and so is what the
                backward makes of region values (a transpose of a saved operand); its outputs
                (values read outside the region) may be saved at their bytes, as eager saves them
                where a later op needs them. Values it saves (MUST_/PREFER_SAVE) are computed once,
                in the forward: the backward reads those it needs, saved (``kept``)
    min_cut     the preferences are ignored: the partitioner's cut decides as for any value (cheap
                chains recomputed, matrix products and reductions saved); MUST_SAVE and
                MUST_RECOMPUTE still hold

Random ops are the exception under both: a draw is never repeated, so the forward's draw is saved
(eager restores the generator's state and draws the same mask again: the values are the same). A
region that asks ``preserve_rng_state=False`` draws a new mask in eager's recomputation, which the
compiled backward does not reproduce: such a graph runs eagerly (aot/joint.py
``check_checkpoint_rng``).

In-place ops that composite kernels leave inside a region (dropout's ``bernoulli_`` and ``div_``
on its ``empty_like``) change a value after the checkpoint's cache took it, which torch's cache
refuses; the joint trace rewrites them functional afterwards (aot/trace.py ``leftover_inplace``),
so each region body is traced with the same always-recompute policy that allows it, or with the
user's policy told to allow it (``tolerant_bodies``).
"""
from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

POLICIES = ("recompute", "min_cut")
_CHECKPOINT_OP = "tag_activation_checkpoint"


def is_random(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in node.target.tags)


_RECOMPUTE = (CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_RECOMPUTE)


def tagged(node: torch.fx.Node) -> bool:
    """The node was computed inside a checkpointed region whose policy is to recompute it."""
    return node.meta.get("recompute") in _RECOMPUTE


def regions(nodes, forward: set) -> dict:
    """The checkpointed forward nodes among ``nodes`` (those in ``forward``), whatever their
    policy: node -> region id."""
    return {n: n.meta.get("ac_graph_id") for n in nodes if n in forward and n.op == "call_function"
            and isinstance(n.meta.get("recompute"), CheckpointPolicy)}


def region_outputs(region: dict, forward: set) -> set:
    """Region nodes a forward node outside their region reads (the checkpoint's results): eager
    saves such a value where a later op needs it, so the cut may save it."""
    return {n for n in region for u in n.users if u in forward and region.get(u, object()) != region[n]}


def kept(region: dict, policy: str) -> set:
    """The region nodes a selective policy saves, which the partitioner computes once, in the
    forward (the backward reads what it needs of them, saved): MUST_SAVE under both policies,
    PREFER_SAVE under ``recompute`` (under ``min_cut`` a preference is the cut's to weigh)."""
    wanted = (CheckpointPolicy.MUST_SAVE,) + ((CheckpointPolicy.PREFER_SAVE,) if policy == "recompute" else ())
    return {n for n in region if n.meta["recompute"] in wanted}


def made_by_backward(nodes: list, tangent_dependent: set) -> set:
    """Nodes autograd's backward made that read no tangent (a transpose of a matrix product's saved
    operand, a GELU derivative's terms): the joint trace records the whole forward first, so they
    are the nodes after the first that reads a tangent and do not read one."""
    start = next((k for k, n in enumerate(nodes) if n.op == "call_function" and n in tangent_dependent), len(nodes))
    return {n for n in nodes[start:] if n.op == "call_function" and n not in tangent_dependent}


def always_recomputed(region: dict, forward: set, policy: str, backward_made: set = frozenset()) -> set:
    """The region nodes that must not be saved under ``policy``: under ``recompute`` those the
    region's policy recomputes (MUST_ or PREFER_RECOMPUTE: all of a region without a selective
    policy), and what the backward makes of region values (eager computes it in its backward);
    under ``min_cut`` those it must recompute (MUST_RECOMPUTE). Never a region's outputs (values
    a forward op outside it reads) or its random draws."""
    if policy not in POLICIES:
        raise ValueError(f"minicompile: unknown checkpoint policy {policy!r}; choose one of {list(POLICIES)}")
    recomputing = _RECOMPUTE if policy == "recompute" else (CheckpointPolicy.MUST_RECOMPUTE,)
    outputs = region_outputs(region, forward - backward_made)
    chosen = {n for n in region if n.meta["recompute"] in recomputing and n not in outputs and not is_random(n)}
    if policy == "recompute" and region:
        derived = set(region)
        order = {n: k for k, n in enumerate(next(iter(region)).graph.nodes)}
        for n in sorted(backward_made, key=order.__getitem__):
            if any(a in derived for a in n.all_input_nodes) and not is_random(n):
                derived.add(n)
                chosen.add(n)
    return chosen


def summary(policy: str, region: dict, recomputed: set, saved: set, kept_nodes: set = frozenset()) -> str:
    """The report's checkpoint line: how many values the regions computed, what became of them,
    and what a selective policy kept (computed once; saved where the backward reads them)."""
    ids = {r for r in region.values()}
    random_saved = sorted(n.name for n in region if n in saved and is_random(n))
    line = (f"  checkpoint ({policy}): {len(region)} value(s) in {len(ids)} region(s); "
            f"{sum(n in recomputed for n in region)} recomputed in the backward, "
            f"{sum(n in saved for n in region)} saved")
    if random_saved:
        line += f" (random draws kept from the forward: {', '.join(random_saved)})"
    if kept_nodes:
        read = [n.name for n in region if n in kept_nodes and n in saved]
        line += (f"; the policy keeps {len(kept_nodes)} value(s) (MUST_SAVE/PREFER_SAVE), "
                 f"{len(read)} saved for the backward{': ' + ', '.join(read) if read else ''}")
    return line


def _always_recompute(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


_TOLERANT = functools.partial(create_selective_checkpoint_contexts, _always_recompute, allow_cache_entry_mutation=True)


@contextlib.contextmanager
def tolerant_bodies(gm: torch.fx.GraphModule):
    """While tracing: checkpoint bodies without a policy of the user's (``context_fn``) recompute
    everything, and a value cached by the checkpoint may be written in place afterwards (under a
    user's policy too: eager's cache holds only what the policy saves, the trace's holds every value)."""
    bodies = [getattr(n.graph.owning_module, n.args[0].target) for n in _checkpoint_calls(gm)
              if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "get_attr"]
    users = {b: b.meta.get("_checkpoint_context_fn") for b in bodies}
    quiet = logging.getLogger("torch._higher_order_ops.wrap")   # its "context_fn is passed" warning
    level = quiet.level
    for b, user in users.items():
        b.meta["_checkpoint_context_fn"] = _TOLERANT if user is None else functools.partial(_mutation_allowed, user)
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)
        for b, user in users.items():
            if user is None:
                b.meta.pop("_checkpoint_context_fn", None)
            else:
                b.meta["_checkpoint_context_fn"] = user


def _mutation_allowed(context_fn):
    forward, recompute = context_fn()
    if hasattr(recompute, "allow_cache_entry_mutation"):    # torch's _CachedTorchDispatchMode
        recompute.allow_cache_entry_mutation = True
    return forward, recompute


def _checkpoint_calls(gm: torch.fx.GraphModule) -> list:
    return [n for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes
            if n.op == "call_function" and getattr(n.target, "__name__", "") == _CHECKPOINT_OP]


def rng_not_preserved(gm: torch.fx.GraphModule) -> bool:
    """A checkpoint call in ``gm`` (or a region inside one) passes ``preserve_rng_state=False``."""
    return any(n.kwargs.get("preserve_rng_state") is False for n in _checkpoint_calls(gm))

