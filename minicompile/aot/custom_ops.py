"""Mutating custom ops (``torch.library.custom_op(..., mutates_args=...)``) as functional calls.

Functionalization refuses a non-ATen op whose arguments carry write annotations
(``Tensor(a0!) x``). Before tracing, each call of such an op becomes a call of its functional
twin, registered here once per op, followed by ``copy_`` of the new values into the
arguments it mutates:

    scale_(z, 3.0)          ->   (z1,) = minicompile_functional.mctest_scale__default(z, 3.0)
                                 z.copy_(z1)

The twin clones the mutated arguments and runs the original op on the clones, so it is an
ordinary extern call in the compiled graph (the op runs, mutating its own arguments); the
``copy_`` is functionalized like any ATen mutation: later readers of ``z`` read ``z1``, and a
mutated graph input is written back once at the end of the graph.
"""
from __future__ import annotations

import operator
import re

import torch
import torch.fx

aten = torch.ops.aten
_LIB = torch.library.Library("minicompile_functional", "FRAGMENT")
_TWINS: dict = {}
_ALIAS = re.compile(r"\([a-z][a-z0-9]*!?\)")
_getitem = operator.getitem


def is_mutating_custom_op(target) -> bool:
    return (isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims")
            and target._schema.is_mutable)


def functionalize_custom_ops(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite calls of mutating custom ops in a copy of ``gm``; ``gm`` itself is unchanged."""
    if not any(n.op == "call_function" and is_mutating_custom_op(n.target) for n in gm.graph.nodes):
        return gm
    gm = torch.fx.GraphModule(gm, _copy_graph(gm.graph))
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_mutating_custom_op(node.target):
            continue
        twin, mutated, n_returns = _twin(node.target)
        args = _bind(node)
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(twin, tuple(args))
            call.meta = dict(node.meta)
            total = len(mutated) + n_returns

            def item(k):  # a schema with one return gives that value, not a tuple
                return call if total == 1 else gm.graph.call_function(_getitem, (call, k))
            for k, pos in enumerate(mutated):
                new = item(k)
                if isinstance(args[pos], torch.fx.Node):
                    gm.graph.call_function(aten.copy_.default, (args[pos], new))
            if n_returns == 1:
                result = item(len(mutated))
                node.replace_all_uses_with(result)
            elif n_returns > 1:
                result = [item(len(mutated) + k) for k in range(n_returns)]
                for user in list(node.users):  # a tuple-returning op is read through getitem
                    if user.target is _getitem:
                        user.replace_all_uses_with(result[user.args[1]])
                        gm.graph.erase_node(user)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


def _bind(node: torch.fx.Node) -> list:
    """The call's arguments in schema order, defaults filled in."""
    schema = node.target._schema
    values = []
    for k, arg in enumerate(schema.arguments):
        if k < len(node.args):
            values.append(node.args[k])
        elif arg.name in node.kwargs:
            values.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            values.append(arg.default_value)
        else:
            raise TypeError(f"{node.target}: missing argument {arg.name}")
    return values


def _twin(op: torch._ops.OpOverload):
    """(functional twin, positions of mutated arguments, number of original returns)."""
    if op in _TWINS:
        return _TWINS[op]
    schema = op._schema
    mutated = [k for k, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    if any(str(schema.arguments[k].type) != "Tensor" for k in mutated):
        raise NotImplementedError(f"{op}: only mutated arguments of type Tensor are compiled")
    if any(r.alias_info is not None for r in schema.returns):
        raise NotImplementedError(f"{op}: returns an alias of an argument")
    text = _ALIAS.sub("", str(schema))
    params = text[text.index("("):text.rindex(" -> ")]
    returns = ["Tensor"] * len(mutated) + [str(r.type) for r in schema.returns]
    name = f"{op.namespace}_{schema.name.split('::')[-1]}_{op._overloadname}"
    _LIB.define(f"{name}{params} -> ({', '.join(returns)})")

    def run(*args):
        args = list(args)
        clones = []
        for pos in mutated:
            args[pos] = args[pos].clone()
            clones.append(args[pos])
        out = op(*args)
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        result = (*clones, *outs)
        return result[0] if len(result) == 1 else result

    _LIB.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"minicompile_functional::{name}", run, lib=_LIB)
    twin = getattr(getattr(torch.ops.minicompile_functional, name), "default")
    _TWINS[op] = (twin, mutated, len(schema.returns))
    return _TWINS[op]
