"""The state of one trace: the FX graph being built, guards, graph inputs, side effects.

``Tracer.wrap`` turns a real value read from somewhere the next call can read again (a
*source*: an argument, a global, an attribute) into its symbolic form and installs the
guards that keep that form valid. ``Tracer.call_graph`` adds one op to the graph,
running it on fake tensors first so shapes and dtypes are known and data-dependent ops
are caught before they are recorded.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import operator
import re
import types
from dataclasses import dataclass

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode

from minicompile.capture import dynamic
from minicompile.capture.entries.guards import Guards, Namespace
from minicompile.capture.interp.graph_args import graph_constant, has_tensor, map_args, to_fake
from minicompile.capture.interp.variables import (NULL, GradModeExit, GradRestore, GraphBreak, MissingAttribute, OpaqueValue,
                                                  ResumeIter, ScalarVar, SymBoundMethod, SymCell, SymIter, TensorMethod, TensorVar)

_CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device,
                torch.layout, torch.memory_format)

# Python modules whose attributes we treat as fixed (library code, not user state).
_STABLE_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "typing", "numbers", "numpy")


_DICT_VIEWS = {type(getattr(d, kind)()): kind for d in ({}, collections.OrderedDict())
               for kind in ("keys", "values", "items")}


def _identity_key(k) -> bool:
    """A dict key hashed and compared by identity (a module, a function, a plain object)."""
    return type(k).__eq__ is object.__eq__ and type(k).__hash__ is object.__hash__


def view_owner(view) -> dict:
    """The dict a ``dict_keys``/``dict_values``/``dict_items`` view reads (its one referent)."""
    return gc.get_referents(view)[0]


@dataclass
class SideEffect:
    """A write the graph cannot express, replayed in order after the graph runs."""
    kind: str          # "setattr" | "setitem_global" | "cell"
    target: str        # source expression of the object written to
    name: str
    value: object


@dataclass
class TrackedContainer:
    """A list/dict read from a source: we trace on a copy and replay its final contents."""
    source: str
    copy: object
    snapshot: list


@dataclass
class GraphInput:
    source: str
    var: TensorVar
    real: torch.Tensor


class Tracer:
    """The state of one trace.

    ``call`` (capture.calls.call) is injected by whoever builds the tracer, as CPython's eval
    loop is reached through type slots and Dynamo hands ``tx`` to its variables: the semantics
    of a value can then run user code (a property getter) without importing the interpreter.
    """

    def __init__(self, forced_breaks: dict, *, call, sizes=None, symbolic: bool = False):
        self._call = call
        self.graph = torch.fx.Graph()
        self.sizes = sizes            # dynamic.FrameSizes: which input sizes are symbolic
        self.symbolic = symbolic      # trace on a ShapeEnv
        self.fake_mode = (dynamic.shape_env_mode(FakeTensorMode) if self.symbolic
                          else FakeTensorMode(allow_non_fake_inputs=False))
        self.sym_nodes = dynamic.SymNodes(self.graph)
        self.symbolic_inputs: list[GraphInput] = []
        self.symbolic_ints: list[tuple[str, torch.SymInt]] = []   # (source, SymInt): ints made symbolic
        self.ns = Namespace()
        self.guards = Guards(self.ns)
        self.grad_enabled = torch.is_grad_enabled()
        self.guards.grad_mode(self.grad_enabled)
        self.inputs: list[GraphInput] = []
        self.by_source: dict[str, object] = {}
        self.tensor_by_id: dict[int, TensorVar] = {}
        self.opaque_by_id: dict[int, OpaqueValue] = {}
        # Floats in the frame at a resume point are unspecialised inputs (ScalarVar), except these
        # sources, whose values a trace needed (set by segment._trace).
        self.scalar_inputs = False
        self.specialised: set = set()
        self.obj_source: dict[int, str] = {}
        self.tracked: list[TrackedContainer] = []
        self.tracked_by_id: dict[int, TrackedContainer] = {}
        self.copy_of: dict[int, TrackedContainer] = {}   # id(original container) -> its copy
        self.side_effects: list[SideEffect] = []
        self.attr_overlay: dict[tuple[int, str], object] = {}
        self.forced_breaks = forced_breaks
        self.frames: list = []        # the interpreter's frame stack, innermost last
        self.top_offset: int | None = None
        self.steps = 0
        self.source_names: dict[str, str] = {}   # "L[0]" -> "x", for readable placeholders
        self.placeholder_names: set = set()      # taken: FX writes them as the graph's arguments
        self.grad_changed = False     # the graph switches grad mode (with torch.no_grad())
        self._keep: list = []         # real objects whose ids we index must stay alive
        self.view_owner: dict[int, tuple] = {}   # id(dict view) -> (its dict, "keys"|...)
        self.new_objects: dict[int, object] = {}  # objects made while tracing (capture.objects)

    def call(self, fn, args: list, kwargs: dict):
        """Trace a call of ``fn``: inline a Python function, or record a known callable."""
        return self._call(self, fn, args, kwargs)

    # ------------------------------------------------------------------ locations
    def where(self) -> str | None:
        return self.frames[-1].where() if self.frames else None

    def add_new(self, obj) -> None:
        self.new_objects[id(obj)] = obj

    def is_new(self, obj) -> bool:
        return id(obj) in self.new_objects

    # ------------------------------------------------------------------ sources
    def source_of(self, obj) -> str | None:
        return self.obj_source.get(id(obj))

    def const_source(self, obj, hint: str = "c") -> str:
        """A source for an object the generated code holds directly (e.g. a closure cell)."""
        src = self.ns.const(obj, hint)
        self.obj_source.setdefault(id(obj), src)
        self._keep.append(obj)
        return src

    def wrap(self, value, source: str):
        """The symbolic form of ``value`` read from ``source``, with guards installed."""
        if source in self.by_source:
            return self.by_source[source]
        tracked = self.copy_of.get(id(value))
        if tracked is not None:   # one container reached from two sources: one traced copy
            self.guards.alias(source, tracked.source)
            self.by_source[source] = tracked.copy
            return tracked.copy
        result = self._wrap(value, source)
        self.by_source[source] = result
        return result

    def _wrap(self, value, source: str):
        """Tensors and numbers that become graph inputs, constants guarded by value, modules by
        identity; containers and other objects in their own steps."""
        g = self.guards
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        if type(value) is float and self.scalar_inputs and _frame_value(source) and source not in self.specialised:
            return self._wrap_scalar(value, source)
        if type(value) is int and self.scalar_inputs and self.sizes is not None and _FRAME_ITEM.match(source):
            if self.sizes.dynamic_int(source, value) and self.symbolic:
                return self._wrap_symint(value, source)
        if type(value) in _CONST_TYPES:
            g.constant(source, value)
            return value
        if _is_data(value, source):
            return self._wrap_opaque(value, source)
        if isinstance(value, torch.nn.Module):
            g.identity(source, value)
            self._remember(value, source)
            return value
        if _is_container(value):
            return self._wrap_container(value, source)
        return self._wrap_object(value, source)

    def _wrap_container(self, value, source: str):
        """A tuple of wrapped items; a list, deque, dict or set traced on a copy (its final contents
        replayed); a dict view read through its dict."""
        g = self.guards
        named = isinstance(value, tuple) and hasattr(type(value), "_fields")
        if type(value) is tuple or isinstance(value, torch.Size) or named:
            g.type_is(source, type(value))
            if not named:
                g.length(source, len(value))
            items = [self.wrap(v, f"{source}[{i}]") for i, v in enumerate(value)]
            if all(a is b for a, b in zip(items, value)):   # constants: the caller's own tuple
                self._remember(value, source)
                return value
            return type(value)(*items) if named else type(value)(items)
        if type(value) is list:
            g.type_is(source, list)
            g.length(source, len(value))
            copy = [self.wrap(v, f"{source}[{i}]") for i, v in enumerate(value)]
            self._track(source, copy, value)
            return copy
        if type(value) is collections.deque:   # traced on a copy, like a list
            g.type_is(source, collections.deque)
            g.length(source, len(value))
            g.add(f"{source}.maxlen == {value.maxlen!r}")
            copy = collections.deque([self.wrap(v, f"{source}[{i}]") for i, v in enumerate(value)], value.maxlen)
            self._track(source, copy, value)
            return copy
        if type(value) in (dict, collections.OrderedDict):
            g.type_is(source, type(value))
            keys = list(value.keys())
            if not all(type(k) in _CONST_TYPES or _identity_key(k) for k in keys):
                raise GraphBreak(f"dict with keys compared by value (not constants) at {source}")
            g.add(f"list({source}) == {self.ns.const(keys, 'keys')}")   # identity keys: `is` first
            copy = type(value)((k, self.wrap(value[k], f"{source}[{self.ns.literal(k)}]")) for k in keys)
            self._track(source, copy, value)
            return copy
        if type(value) in (set, frozenset):
            g.type_is(source, type(value))
            g.add(f"{source} == {self.ns.const(frozenset(value))}")
            if type(value) is set:
                self._track(source, copy := set(value), value)
                return copy
            return value
        return self._wrap_view(value, source)

    def _wrap_object(self, value, source: str):
        """Bound methods made per read and closures, guarded by what they run; functions, classes
        and modules by identity; any other object by its type (its attributes when read)."""
        g = self.guards
        if isinstance(value, types.BuiltinMethodType) and not isinstance(
                value.__self__, (types.ModuleType, type(None))) and getattr(
                value.__self__, value.__name__, None) is not value:
            # a bound method made per read (``d.update``, ``x.clamp``): guard its object and name,
            # not its identity
            g.type_is(source, type(value))
            g.add(f"{source}.__name__ == {value.__name__!r}")
            owner = self.wrap(value.__self__, f"{source}.__self__")
            if isinstance(owner, OpaqueValue):   # ``a.sum`` of an array: calling it is a break
                return self._wrap_opaque(value, source)
            if isinstance(owner, TensorVar):
                return TensorMethod(owner, value.__name__)
            return getattr(owner, value.__name__)
        if type(value) is types.MethodType and type(value.__func__) is types.FunctionType \
                and _frame_value(source) and not isinstance(value.__self__, (type, types.ModuleType)):
            # a bound method made per read (a with-block's ``ctx.__exit__`` handed over at a
            # break): guard its function and its object, not the method's identity
            g.type_is(source, types.MethodType)
            g.add(f"{source}.__func__ is {self.ns.const(value.__func__, 'fn')}")
            return SymBoundMethod(value.__func__, self.wrap(value.__self__, f"{source}.__self__"))
        if type(value) is ResumeIter:
            g.type_is(source, ResumeIter)
            g.add(f"{source}.pos == 0")
            g.length(f"{source}.items", len(value.items))
            return SymIter([self.wrap(v, f"{source}.items[{i}]") for i, v in enumerate(value.items)])
        if type(value) is types.CellType:
            # A cell handed over at a graph break; its contents are read lazily by LOAD_DEREF.
            g.type_is(source, types.CellType)
            self._remember(value, source)
            return value
        if value is NULL:
            g.identity(source, NULL)
            return NULL
        if type(value) is GradRestore:
            g.type_is(source, GradRestore)
            g.add(f"{source}.restore is {value.restore}")
            return GradModeExit(value.restore)
        if isinstance(value, types.FunctionType) and "<locals>" in value.__qualname__:
            # A closure is a new object on every call of its maker: guard what it runs
            # (code, defaults, cell contents via their sources), not its identity.
            g.type_is(source, types.FunctionType)
            g.add(f"{source}.__code__ is {self.ns.const(value.__code__, 'code')}")
            for i, cell in enumerate(value.__closure__ or ()):
                self._remember(cell, f"{source}.__closure__[{i}]")
            self._remember(value, source)
            return value
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                              types.ModuleType, type, types.MethodDescriptorType,
                              types.WrapperDescriptorType)) or callable(value) and not hasattr(value, "__dict__"):
            g.identity(source, value)
            self._remember(value, source)
            return value
        if isinstance(value, (slice, range, frozenset)):
            g.type_is(source, type(value))
            g.add(f"{source} == {self.ns.const(value)}")
            return value
        if isinstance(value, (set, frozenset, SymCell, SymIter)):
            raise GraphBreak(f"cannot trace a {type(value).__name__} read from {source}")
        # Any other object: same type; its attributes are guarded when read.
        g.type_is(source, type(value))
        self._remember(value, source)
        return value

    def _wrap_opaque(self, value, source: str) -> OpaqueValue:
        same = self.opaque_by_id.get(id(value))
        if same is not None:
            self.guards.alias(source, same.source)
            return same
        self.guards.type_is(source, type(value))
        self.opaque_by_id[id(value)] = var = OpaqueValue(type(value), source)
        self._keep.append(value)
        return var

    def _wrap_scalar(self, value: float, source: str) -> ScalarVar:
        """A float the graph takes as a 0-d float64 input, its value unguarded (``.item()``'s)."""
        self.guards.type_is(source, float)
        self.ns.values["_f64"] = _f64
        real = _f64(value)
        node = self._placeholder(source)
        fake = self.fake_mode.from_tensor(real, static_shapes=True)
        node.meta["example_value"] = fake
        var = TensorVar(node, fake, torch.Tensor, None)
        self.inputs.append(GraphInput(f"_f64({source})", var, real))
        self._keep.append(real)
        return ScalarVar(float, source, var)

    def _wrap_symint(self, value: int, source: str) -> torch.SymInt:
        """An int that changed between traces (``.item()``'s): a SymInt guarded only as the ShapeEnv
        needs, a graph input from the first op that uses it."""
        self.guards.type_is(source, int)
        sym = dynamic.symbolic_int(self.fake_mode, value, source)

        def placeholder():
            node = self._placeholder(source)
            node.meta["example_value"] = sym
            self.inputs.append(GraphInput(source, TensorVar(node, sym, int, source), value))
            return node

        self.sym_nodes.add_int(sym, source, placeholder)
        self.symbolic_ints.append((source, sym))
        return sym

    def _wrap_view(self, view, source: str):
        """A dict view handed over at a graph break: a live view of its (wrapped) dict."""
        self.ns.values["_view_owner"] = view_owner
        owner = self.wrap(view_owner(view), f"_view_owner({source})")
        if type(owner) not in (dict, collections.OrderedDict):
            raise GraphBreak(f"a view of a {type(owner).__name__} read from {source}")
        kind = _DICT_VIEWS[type(view)]
        self.register_view(result := getattr(owner, kind)(), owner, kind)
        return result

    def register_view(self, view, owner: dict, kind: str) -> None:
        """``view`` is ``owner.<kind>()``: generated code rebuilds it from its dict."""
        self.view_owner[id(view)] = (owner, kind)
        self._keep.append(view)

    def _wrap_tensor(self, value: torch.Tensor, source: str) -> TensorVar:
        same = self.tensor_by_id.get(id(value))
        if same is not None:
            self.guards.alias(source, same.source)
            return same
        if value.is_sparse or value.layout != torch.strided:
            raise GraphBreak(f"non-strided tensor input at {source}")
        dims = self.sizes.dynamic_dims(source, value) if self.sizes is not None else ()
        if dims and self.symbolic:
            fake = dynamic.symbolic_fake(self.fake_mode, value, dims)
        else:
            dims, fake = (), self.fake_mode.from_tensor(value, static_shapes=True)
        node = self._placeholder(source)
        node.meta["example_value"] = fake
        var = TensorVar(node, fake, type(value), source)
        self.guards.tensor(source, value, sizes=not dims)
        self.inputs.append(GraphInput(source, var, value))
        if dims:   # its sizes and strides are guarded by the ShapeEnv (dynamic.produce_guards)
            self.symbolic_inputs.append(self.inputs[-1])
            self.sym_nodes.add_input(node, fake, source)
        self.tensor_by_id[id(value)] = var
        self._keep.append(value)
        return var

    def _placeholder(self, source: str) -> torch.fx.Node:
        """A graph input read from ``source``. Inputs are discovered lazily, but FX wants placeholders
        first: it goes after the last one."""
        anchor = self.inputs[-1].var.node if self.inputs else None
        with self.graph.inserting_after(anchor) if anchor else self.graph.inserting_before(None):
            return self.graph.placeholder(self._placeholder_name(source))

    def _placeholder_name(self, source: str) -> str:
        """A readable argument name, unique in the graph: two long sources can read the same once
        cut to 60 characters (HF Swin's ..._relative_position_bias_table and _index)."""
        name = unique = _readable(source, self.source_names)
        k = 1
        while unique in self.placeholder_names:
            unique, k = f"{name}_{k}", k + 1
        self.placeholder_names.add(unique)
        return unique

    def _remember(self, obj, source: str) -> None:
        self.obj_source.setdefault(id(obj), source)
        self._keep.append(obj)

    def _track(self, source: str, copy, original) -> None:
        snap = list(copy.items()) if isinstance(copy, dict) else list(copy)
        t = TrackedContainer(source, copy, snap)
        self.tracked.append(t)
        self.tracked_by_id[id(copy)] = t
        self.copy_of[id(original)] = t
        self._keep.append(original)

    # ------------------------------------------------------------------ side effects
    def record_setattr(self, obj, name: str, value) -> None:
        src = self.source_of(obj)
        if src is None:
            raise GraphBreak(f"attribute write {type(obj).__name__}.{name} on an object the "
                              f"tracer cannot find again after the graph runs")
        self.attr_overlay[(id(obj), name)] = value
        self.side_effects.append(SideEffect("setattr", src, name, value))

    def record_global(self, globals_dict: dict, name: str, value) -> None:
        src = self.const_source(globals_dict, "G")
        self.attr_overlay[(id(globals_dict), name)] = value
        self.side_effects.append(SideEffect("setitem_global", src, name, value))

    def record_cell(self, cell, value) -> None:
        src = self.source_of(cell) or self.const_source(cell, "cell")
        self.attr_overlay[(id(cell), "cell_contents")] = value
        self.side_effects.append(SideEffect("cell", src, "cell_contents", value))

    def record_delattr(self, obj, name: str) -> None:
        self.record_setattr(obj, name, _DELETED)

    def overlay(self, obj, name: str, default=NULL):
        value = self.attr_overlay.get((id(obj), name), default)
        if value is _DELETED:   # deleted in this trace (a class attribute would show: not modeled)
            raise MissingAttribute(f"AttributeError: attribute {name!r} was deleted")
        return value

    # ------------------------------------------------------------------ grad mode
    def set_grad(self, enabled: bool) -> None:
        """Switch grad mode inside the graph (entering/leaving ``with torch.no_grad()``)."""
        if enabled != self.grad_enabled:
            self.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            self.grad_enabled = enabled
            self.grad_changed = True

    # ------------------------------------------------------------------ graph ops
    def call_graph(self, kind: str, target, args: tuple, kwargs: dict | None = None,
                   allow_constant_result: bool = False, mutates: bool = False):
        """Record one op; returns its symbolic result.

        ``kind`` is ``call_function`` or ``call_method``. Non-tensor results are only
        accepted (as constants) when ``allow_constant_result`` says they depend on
        metadata alone; anything else is data-dependent and cannot be traced.
        """
        args, kwargs = map_args(args, graph_constant), map_args(kwargs or {}, graph_constant)
        fake_args = map_args(args, to_fake)
        fake_kwargs = map_args(kwargs, to_fake)
        try:   # symbolic: the Python dispatcher (Dynamo's, make_fx's), or baddbmm's meta fails to expand
            with self.fake_mode, enable_python_dispatcher() if self.symbolic else contextlib.nullcontext(), \
                    torch.set_grad_enabled(self.grad_enabled):
                if kind == "call_method":
                    result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
        except GraphBreak:
            raise
        except Exception as e:
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            raise GraphBreak(f"{name}: {type(e).__name__}: {_short(e)} "
                              f"(data-dependent or unsupported while tracing)") from None
        to_node = self._to_node
        if result is None and mutates:  # e.g. setitem: recorded for its effect, returns None
            node = self.graph.create_node(kind, target, map_args(args, to_node), map_args(kwargs, to_node))
            node.meta["example_value"] = None
            return None
        if not has_tensor(result):
            if allow_constant_result:
                return result
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            raise GraphBreak(f"{name} returns a non-tensor value ({type(result).__name__}) "
                              f"that depends on tensor data")
        node = self.graph.create_node(kind, target, map_args(args, to_node), map_args(kwargs, to_node))
        node.meta["example_value"] = result
        where = self.where()
        if where:
            node.meta["stack_trace"] = f"  File {where}"
        return self._wrap_result(node, result)

    def _to_node(self, v):
        if isinstance(v, TensorVar):
            return v.node
        return self.sym_nodes.node_of(v) if isinstance(v, dynamic.SYM_TYPES) else v

    def _wrap_result(self, node: torch.fx.Node, result):
        if isinstance(result, torch.Tensor):
            return TensorVar(node, result)
        if isinstance(result, (tuple, list)):
            items = []
            for i, r in enumerate(result):
                if isinstance(r, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["example_value"] = r
                    items.append(TensorVar(item, r))
                elif has_tensor(r):
                    raise GraphBreak("nested tensor containers returned by an op")
                else:
                    items.append(r)
            if isinstance(result, list):
                return items
            if type(result) is tuple:
                return tuple(items)
            return type(result)(items)  # torch.return_types structseqs take one sequence
        raise GraphBreak(f"op returned {type(result).__name__} holding tensors")


_DELETED = type("Deleted", (), {"__repr__": lambda self: "<deleted>"})()


def _is_container(value) -> bool:
    """A value ``Tracer._wrap_container`` wraps: exactly a tuple, list, deque, dict or dict view,
    a torch.Size, a named tuple, or a set of constants."""
    named = isinstance(value, tuple) and hasattr(type(value), "_fields")
    return (type(value) in (tuple, list, collections.deque, dict, collections.OrderedDict, *_DICT_VIEWS) or named
            or isinstance(value, torch.Size) or type(value) in (set, frozenset) and all(type(v) in _CONST_TYPES for v in value))


def _f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def _is_data(value, source: str) -> bool:
    """A NumPy array anywhere, or a NumPy scalar in the frame itself (``.numpy()``'s, or a
    reduction's, handed over at a graph break): values that may hold a tensor's data, which
    the trace must neither compute with nor guard on (OpaqueValue). A NumPy scalar held in an
    attribute or a global is a constant of the program, guarded by value like a float."""
    if type(value).__module__ != "numpy":   # (no NumPy import: torch runs without it)
        return False
    if type(value).__name__ in ("ndarray", "matrix", "memmap", "recarray"):
        return True
    return getattr(value, "shape", None) == () and _frame_value(source)


# A frame value or an item of a container there (L[2], L[2]['n']); attributes stay constants, as Dynamo's.
_FRAME_ITEM = re.compile(r"L\[\d+\](\[[^\]]+\])*$")


def _frame_value(source: str) -> bool:
    return source.startswith("L[") and source.endswith("]") and source[2:-1].isdigit()


def _readable(source: str, names: dict) -> str:
    head = source.split("]", 1)[0] + "]" if source.startswith("L[") else ""
    if head in names:
        source = names[head] + source[len(head):]
    name = "".join(c if c.isalnum() else "_" for c in source).strip("_")
    for noise in ("_parameters_", "_buffers_", "_modules_"):
        name = name.replace(noise, "_")
    while "__" in name:
        name = name.replace("__", "_")
    name = name[:60] or "input"
    return name if name[0].isalpha() else f"v_{name}"


def _short(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


def is_stable_module(mod: types.ModuleType) -> bool:
    name = getattr(mod, "__name__", "")
    return name.split(".")[0] in _STABLE_MODULE_PREFIXES
