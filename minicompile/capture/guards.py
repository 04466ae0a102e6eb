"""Guards: the conditions under which a compiled entry is still valid.

Each guard is a Python expression over ``L`` (the frame's values: arguments on entry,
locals + cells + stack on resume) and named constants. All guards of one entry are
joined with ``and`` into ONE generated function, compiled once; the cache-hit path
evaluates that single expression and never loops over guard objects. When it fails,
the slow path re-evaluates the guards one by one to name the one that failed.
"""
from __future__ import annotations

import math
import types

import torch

from minicompile.capture.variables import NULL, ResumeIter

_LITERAL_TYPES = (int, str, bool, type(None), bytes)


class Namespace:
    """Constants referenced by generated code, bound as globals of the generated function."""

    def __init__(self):
        self.values: dict[str, object] = {
            "_grad": torch.is_grad_enabled,
            "_NULL": NULL,
            "_ResumeIter": ResumeIter,
        }
        self._by_id: dict[int, str] = {}
        self._keep: list = []  # keep constants alive so their ids stay unique

    def const(self, obj, hint: str = "c") -> str:
        name = self._by_id.get(id(obj))
        if name is None:
            name = f"_{hint}{len(self._by_id)}"
            self._by_id[id(obj)] = name
            self.values[name] = obj
            self._keep.append(obj)
        return name

    def literal(self, value) -> str:
        """Source text for a value: a literal when exact, else a bound constant."""
        if type(value) in _LITERAL_TYPES:
            return repr(value)
        if type(value) is float and math.isfinite(value):
            return repr(value)
        return self.const(value)


class Guards:
    """The guards collected while tracing one entry."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.exprs: list[str] = []
        self._seen: set[str] = set()

    def add(self, expr: str) -> None:
        if expr not in self._seen:
            self._seen.add(expr)
            self.exprs.append(expr)

    def grad_mode(self, enabled: bool) -> None:
        self.add(f"_grad() is {enabled}")

    def tensor(self, src: str, t: torch.Tensor) -> None:
        cls = self.ns.const(type(t), "T")
        dtype = self.ns.const(t.dtype, "dt")
        # is_cpu / get_device() are several times cheaper than comparing .device objects.
        self.add(f"type({src}) is {cls}")
        self.add(f"{src}.dtype is {dtype}")
        if t.device.type == "cpu":
            self.add(f"{src}.is_cpu")
        elif t.device.type == "cuda":
            self.add(f"{src}.get_device() == {t.get_device()}")
        else:
            self.add(f"{src}.device == {self.ns.const(t.device, 'dev')}")
        self.add(f"{src}.shape == {tuple(t.shape)!r}")
        self.add(f"{src}.stride() == {tuple(t.stride())!r}")
        self.add(f"{src}.requires_grad is {t.requires_grad}")

    def alias(self, src: str, other: str) -> None:
        self.add(f"{src} is {other}")

    def constant(self, src: str, value) -> None:
        """A Python constant: same type and equal value (NaN-aware)."""
        if value is None or value is True or value is False:
            self.add(f"{src} is {value!r}")
            return
        tp = self.ns.const(type(value), "T")
        self.add(f"type({src}) is {tp}")
        if type(value) is float and math.isnan(value):
            self.add(f"{src} != {src}")
        else:
            self.add(f"{src} == {self.ns.literal(value)}")

    def identity(self, src: str, obj) -> None:
        if obj is None or obj is NULL:
            self.add(f"{src} is {'None' if obj is None else '_NULL'}")
            return
        self.add(f"{src} is {self.ns.const(obj, _hint(obj))}")

    def type_is(self, src: str, tp: type) -> None:
        self.add(f"type({src}) is {self.ns.const(tp, 'T')}")

    def length(self, src: str, n: int) -> None:
        self.add(f"len({src}) == {n}")

    def compile(self, name: str = "check"):
        """One function evaluating every guard in a single ``and`` expression."""
        src = check_source(self.exprs, name)
        scope = dict(self.ns.values)
        exec(compile(src, f"<minicompile guards {name}>", "exec"), scope)
        return scope[name], src

    def first_failure(self, L) -> str | None:
        """Slow path: the text of the first guard that does not hold for ``L``."""
        scope = dict(self.ns.values)
        scope["L"] = L
        for expr in self.exprs:
            try:
                ok = eval(expr, scope)
            except Exception as e:  # a guard that raises is a guard that failed
                return f"{expr}  (raised {type(e).__name__})"
            if not ok:
                return expr
        return None


def check_source(exprs: list[str], name: str) -> str:
    body = "\n        and ".join(exprs) if exprs else "True"
    return (f"def {name}(L):\n"
            f"    try:\n"
            f"        return ({body})\n"
            f"    except Exception:\n"
            f"        return False\n")


def _hint(obj) -> str:
    if isinstance(obj, torch.nn.Module):
        return "mod"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return "fn"
    if isinstance(obj, type):
        return "cls"
    if isinstance(obj, types.ModuleType):
        return "pymod"
    return "obj"
