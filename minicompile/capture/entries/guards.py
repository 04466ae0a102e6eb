"""Guards: the conditions under which a compiled entry is still valid.

Each guard is a Python expression over ``L`` (the frame's values: arguments on entry,
locals + cells + stack on resume) and named constants. All guards of one entry are
joined with ``and`` into ONE generated function, compiled once; the cache-hit path
evaluates that single expression and never loops over guard objects. When it fails,
the slow path re-evaluates the guards one by one to name the one that failed. Each guarded
value is also kept as one readable GuardRecord for reports.
"""
from __future__ import annotations

import math
import types

import torch

from minicompile.capture.explain import GuardRecord
from minicompile.capture.interp.variables import NULL, ResumeIter

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
        self.records: list[GuardRecord] = []
        self._seen: set[str] = set()

    def add(self, *exprs: str, kind: str = "EXPR", what: str = "", check: str = "") -> None:
        """Guard on every expression in ``exprs``; reports show them as one ``kind`` record."""
        new = [e for e in exprs if e not in self._seen]
        if not new:
            return
        self._seen.update(new)
        self.exprs.extend(new)
        self.records.append(GuardRecord(kind, what, check or " and ".join(new)))

    def grad_mode(self, enabled: bool) -> None:
        self.add(f"_grad() is {enabled}", kind="GRAD_MODE", check=f"grad mode {'on' if enabled else 'off'}")

    def tensor(self, src: str, t: torch.Tensor, sizes: bool = True) -> None:
        """Type, dtype, device, requires_grad, and (``sizes``) the exact shape and strides; a
        symbolic input's sizes are guarded by its ShapeEnv instead (capture.dynamic)."""
        cls = self.ns.const(type(t), "T")
        dtype = self.ns.const(t.dtype, "dt")
        # is_cpu / get_device() are several times cheaper than comparing .device objects.
        if t.device.type == "cpu":
            device = f"{src}.is_cpu"
        elif t.device.type == "cuda":
            device = f"{src}.get_device() == {t.get_device()}"
        else:
            device = f"{src}.device == {self.ns.const(t.device, 'dev')}"
        desc = (f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} stride {tuple(t.stride())} {t.device}"
                f"{' requires_grad' if t.requires_grad else ''} (type, dtype, device, shape, stride, requires_grad)")
        shape = [f"{src}.shape == {tuple(t.shape)!r}", f"{src}.stride() == {tuple(t.stride())!r}"] if sizes else []
        self.add(f"type({src}) is {cls}", f"{src}.dtype is {dtype}", device, *shape,
                 f"{src}.requires_grad is {t.requires_grad}", kind="TENSOR_MATCH", what=src, check=desc)

    def distinct_storages(self, sources: list[str], groups: tuple) -> None:
        """Tensors at ``sources`` in different ``groups`` (the storages the trace saw them in)
        share no memory: what a graph with in-place ops assumed of its inputs. One guard, one
        report line, however many inputs."""
        if len(set(groups)) < 2:
            return
        self.ns.values["_distinct"] = distinct_storages
        shown = ", ".join(sources[:3]) + (", ..." if len(sources) > 3 else "")
        self.add(f"_distinct({groups!r}, {', '.join(sources)})", kind="NO_TENSOR_ALIASING",
                 what=f"{len(sources)} tensor inputs", check=f"no two share memory ({shown})")

    def alias(self, src: str, other: str) -> None:
        self.add(f"{src} is {other}", kind="ALIAS_MATCH", what=src, check=f"is {other}")

    def constant(self, src: str, value) -> None:
        """A Python constant: same type and equal value (NaN-aware)."""
        if value is None or value is True or value is False:
            self.add(f"{src} is {value!r}", kind="CONSTANT_MATCH", what=src, check=f"is {value!r}")
            return
        tp = self.ns.const(type(value), "T")
        nan = type(value) is float and math.isnan(value)
        self.add(f"type({src}) is {tp}", f"{src} != {src}" if nan else f"{src} == {self.ns.literal(value)}",
                 kind="CONSTANT_MATCH", what=src, check=f"{type(value).__name__} == {value!r}")

    def identity(self, src: str, obj) -> None:
        if obj is None or obj is NULL:
            self.add(f"{src} is {'None' if obj is None else '_NULL'}", kind="ID_MATCH", what=src,
                     check=f"is {'None' if obj is None else 'NULL'}")
            return
        self.add(f"{src} is {self.ns.const(obj, _hint(obj))}", kind="ID_MATCH", what=src,
                 check=f"is the same {type(obj).__name__}")

    def type_is(self, src: str, tp: type) -> None:
        self.add(f"type({src}) is {self.ns.const(tp, 'T')}", kind="TYPE_MATCH", what=src,
                 check=f"type is {tp.__name__}")

    def length(self, src: str, n: int) -> None:
        self.add(f"len({src}) == {n}", kind="SEQUENCE_LENGTH", what=src, check=f"len == {n}")

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


def distinct_storages(groups: tuple, *tensors) -> bool:
    """No storage holds tensors of two ``groups`` (empty storages hold nothing)."""
    group_of = {}
    for group, t in zip(groups, tensors):
        storage = t.untyped_storage()
        if storage.nbytes() and group_of.setdefault(storage.data_ptr(), group) != group:
            return False
    return True


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
