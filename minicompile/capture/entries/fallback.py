"""When a function cannot be split into graphs: torch.fx.symbolic_trace, then eager.

symbolic_trace runs Python code once at trace time, so anything with a visible side
effect would be lost; we only try it when the code names none of the obvious ones, and
we specialize (and guard) every non-tensor argument.
"""
from __future__ import annotations

import inspect

import torch
import torch.fx
from torch import nn

from minicompile.capture.entries.guards import Guards, Namespace
from minicompile.capture.entries.segment import MISS
from minicompile.capture.interp.frame import arg_names

_SIDE_EFFECT_NAMES = {"print", "input", "open", "breakpoint", "exec", "eval", "setattr",
                      "item", "tolist", "append", "update", "pop", "extend", "insert", "write"}
_GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class FxEntry:
    """A whole-function graph from symbolic_trace, valid while the guards hold."""

    def __init__(self, fast, graph, guards):
        self.fast = fast
        self.graph = graph
        self.guards = guards


def try_fx(cache, fn, L: tuple) -> tuple[FxEntry | None, str]:
    """An FxEntry for ``fn`` called with ``L``, or (None, why not)."""
    code = cache.code
    if code.co_flags & _GENERATOR:
        return None, "generators cannot be symbolically traced"
    risky = _SIDE_EFFECT_NAMES & set(code.co_names)
    if risky:
        return None, f"code names {sorted(risky)}, which symbolic_trace would run only once"
    names = arg_names(code)
    if len(names) != len(L) or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return None, "variadic arguments"
    ns = Namespace()
    guards = Guards(ns)
    guards.grad_mode(torch.is_grad_enabled())
    concrete, tensor_idx = {}, []
    module = L[0] if names and isinstance(L[0], nn.Module) and names[0] == "self" else None
    for i, (name, v) in enumerate(zip(names, L)):
        if i == 0 and module is not None:
            guards.identity("L[0]", module)
        elif isinstance(v, torch.Tensor):
            guards.tensor(f"L[{i}]", v)
            tensor_idx.append(i)
        elif type(v) in (int, float, bool, str, type(None)):
            guards.constant(f"L[{i}]", v)
            concrete[name] = v
        else:
            return None, f"argument {name!r} of type {type(v).__name__}"
    try:
        if module is not None:
            gm = torch.fx.symbolic_trace(module, concrete_args=concrete or None)
        else:
            gm = torch.fx.symbolic_trace(fn, concrete_args=concrete or None)
    except Exception as e:  # symbolic_trace has many ways to refuse
        return None, f"symbolic_trace failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    example = list(L[1:] if module is not None else L)
    compiled = cache.ctx.backend(gm, example)
    # fx keeps every argument (concrete ones are checked at runtime); pass them all.
    argv = ", ".join(f"L[{i}]" for i in range(1 if module is not None else 0, len(L)))
    expr = " and ".join(f"({e})" for e in guards.exprs)
    ns.values["_MISS"] = MISS
    fn_name = ns.const(compiled, "graph")
    src = (f"def fast(L):\n    try:\n        ok = {expr}\n    except Exception:\n        ok = False\n"
           f"    if not ok:\n        return _MISS\n    return {fn_name}({argv})\n")
    scope = dict(ns.values)
    exec(compile(src, f"<minicompile fx {code.co_name}>", "exec"), scope)
    return FxEntry(scope["fast"], gm, guards), ""
