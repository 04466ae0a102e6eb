"""Lowering: a functional ATen FX graph -> a LoopGraph (ir/graph.py) of loop-IR buffers.

    graph = lower(aten_gm, compute_expensive_once=...)

``GraphLowering`` is the pass and its working state; it hands on only the frozen LoopGraph.
Each node is lowered by its registered lowering (lowering/registry.py) or, failing that,
becomes an ExternKernel: an eager ATen call with the reason recorded. Pointwise results stay
lazy (inlined into readers) until something needs memory: a graph output, an extern's
argument, a reduction's result, or a value read by many consumers.
"""
from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from minicompile.config import config
from minicompile.decomp.core_ops import STORAGE_READERS
from minicompile.ir.expr import Expr, NotSymbolic, Sym, size_value, symbols_of
from minicompile.ir.graph import ExternRecord, LoopGraph
from minicompile.ir.nodes import (Buffer, ComputedBuffer, ExternKernel, InputBuffer, Layout, Lazy,
                                  MultiOutput, Pointwise, ReindexView, ScalarRef, StorageView, TensorValue,
                                  contiguous_strides, in_memory_order, is_static, iteration_vars, memory_order, prod,
                                  shape_of, strides_of, sym_value)
from minicompile.ir.ops import SUPPORTED_DTYPES, TRANSCENDENTAL, RecordOps
from minicompile.lowering.registry import Unsupported, lowering_for


def lower(gm: torch.fx.GraphModule, compute_expensive_once: bool = False, templates: frozenset = frozenset()) -> LoopGraph:
    """Lower ``gm`` to loop IR.

    ``compute_expensive_once``: a lazy value that uses a transcendental op and has several
    readers gets a buffer, so it is computed once. The pipeline passes the backend's
    ``BackendCaps.row_scratch``: with a row scratch array (C++) that buffer costs no memory
    traffic, without one (Triton) it would be stored and re-read, and recomputing is cheaper.
    It is lowering's flag, not the scheduler's, because only lowering decides what is a buffer
    and what is inlined into its readers; the scheduler can only group the buffers it gets.

    ``templates``: the whole kernels the backend generates (``BackendCaps.templates``, e.g.
    flex_attention's fused attention, lowering/flex.py); an op with none stays an extern call.
    """
    return GraphLowering(gm, sources=user_sources(gm), compute_expensive_once=compute_expensive_once,
                         templates=templates).run()


@dataclass
class GraphLowering:
    gm: torch.fx.GraphModule
    buffers: list = field(default_factory=list)        # ComputedBuffer / ExternKernel, in order
    inputs: list = field(default_factory=list)         # InputBuffer per tensor placeholder
    placeholders: list = field(default_factory=list)   # InputBuffer or python value, per placeholder
    constants: dict = field(default_factory=dict)      # name -> tensor (get_attr)
    constant_buffers: list = field(default_factory=list)  # InputBuffer per constant
    outputs: list = field(default_factory=list)        # StorageView | python value, per output
    externs: list = field(default_factory=list)        # ExternRecord
    sources: dict = field(default_factory=dict)        # FX node name -> user source line
    compute_expensive_once: bool = False                # realize transcendental values read twice
    templates: frozenset = frozenset()                  # whole kernels the backend generates (lower())
    env: dict = field(default_factory=dict)
    bound: dict = field(default_factory=dict)          # symbol the graph computes -> (buffer, dim or None)
    checked_equal: dict = field(default_factory=dict)  # size -> a size a run-time check found it equal to
    records: dict = field(default_factory=dict)        # lazy value -> its loader run on a RecordOps
    stored_roots: dict = field(default_factory=dict)   # FX node -> its lazy value, which a view of it stored
    _counter: int = 0

    def recorded(self, value) -> RecordOps:
        """A lazy value's loader run once on a RecordOps (what it reads, where, its ops), kept:
        every input mutation asks it of every value still to be read (without it, a foreach
        optimizer's graph spent 4 s of a 9 s compile there), and each multi-reader value."""
        if value not in self.records:
            self.records[value] = rec = RecordOps()
            value.loader()(rec, iteration_vars(value.size))
        return self.records[value]

    # -- naming and buffers -------------------------------------------------------------
    def new_name(self, prefix="buf") -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    def register(self, buf: Buffer) -> Buffer:
        self.buffers.append(buf)
        return buf

    # -- realization ----------------------------------------------------------------------
    def realize(self, value: TensorValue, layout: Layout | None = None, origins=None) -> StorageView:
        """Give ``value`` memory (unless it has some) and return a view of that memory."""
        if isinstance(value, StorageView) and layout is None:
            return value
        if isinstance(value, StorageView) and value.is_whole() and value.buffer.layout == layout:
            return value
        size = tuple(value.size)
        if layout is None:
            layout = Layout(size, contiguous_strides(size), 0, value.dtype, value.device)
        assert tuple(layout.size) == size, (layout.size, size)
        names = list(dict.fromkeys(list(getattr(value, "origins", [])) + list(origins or [])))
        data, order = Pointwise(size, value.loader()), memory_order(layout)
        if order is not None:  # e.g. channels-last: loop in memory order, not NCHW's
            data = in_memory_order(data, order)
        buf = ComputedBuffer(self.new_name(), layout, names, data=data, loop_order=order)
        self.register(buf)
        return StorageView.whole(buf)

    def realize_as_node(self, value: TensorValue, node: torch.fx.Node, padded: bool = False) -> StorageView:
        """Realize with eager's strides for ``node`` (outputs and views of it must match eager). With
        ``padded``, also strides with gaps between rows: an extern may need them (CUDA attention
        reads a mask whose rows eager padded to 16 elements, and rejects other strides)."""
        meta = node.meta.get("val")
        if isinstance(value, StorageView):
            return value
        if isinstance(meta, torch.Tensor) and shape_of(meta) == tuple(value.size):
            lay = Layout(shape_of(meta), strides_of(meta), 0, value.dtype, value.device)
            if (lay.storage_numel() == _numel(lay.size) or (padded and _gapped(lay))  # same strides as eager
                    or (not is_static(lay.size + lay.stride) and _never_overlaps(lay))):
                return self.realize(value, lay, origins=[node.name])
        return self.realize(value, origins=[node.name])

    def storage_view(self, value: TensorValue, node: torch.fx.Node) -> StorageView:
        """``node``'s value with eager's strides in memory laid out as eager's storage of it, for ops
        that address storage (STORAGE_READERS: as_strided's and as_strided_scatter's strides and
        offset count from the storage's start). A chain of views (slice, select, permute, unfold,
        expand, split...) is followed back to the value that owns the storage, which gets memory
        in eager's layout: realizing the last view alone gave it a storage of its own size, which
        as_strided read out of bounds. Where no buffer can hold eager's storage (a graph input's,
        an owner eager lays out sparsely) the value is realized as before."""
        root = _storage_root(node)
        meta, root_meta, base = node.meta.get("val"), root.meta.get("val"), self.env.get(root)
        if not (isinstance(meta, torch.Tensor) and isinstance(root_meta, torch.Tensor)
                and isinstance(base, TensorValue) and shape_of(root_meta) == tuple(base.size)):
            return self.realize_as_node(value, node)
        if isinstance(base, StorageView) and base.is_whole() and isinstance(base.buffer, (ExternKernel, MultiOutput)):
            offset = sym_value(meta.storage_offset()) - sym_value(root_meta.storage_offset())  # from its data_ptr
            return StorageView(base.buffer, shape_of(meta), strides_of(meta), size_value(offset))
        lay = Layout(shape_of(root_meta), strides_of(root_meta), 0, base.dtype, base.device)
        if (isinstance(base, StorageView) and not _owned(base.buffer)) or sym_value(root_meta.storage_offset()) != 0 \
                or lay.storage_numel() != _numel(lay.size):
            return self.realize_as_node(value, node)
        if not (isinstance(base, StorageView) and base.is_whole() and base.buffer.layout == lay):
            stored = self.realize(base, lay, origins=[root.name])
            if not isinstance(base, StorageView):  # its other readers share the memory
                self.env[root] = stored
            base = stored
        return StorageView(base.buffer, shape_of(meta), strides_of(meta), sym_value(meta.storage_offset()))

    # -- the walk -----------------------------------------------------------------------
    def run(self) -> LoopGraph:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node)
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                self._output(node)
        return LoopGraph(tuple(self.inputs), tuple(self.placeholders), self.constants, tuple(self.constant_buffers),
                         tuple(self.buffers), tuple(self.outputs), self.sources, tuple(self.externs), self.bound)

    def _placeholder(self, node):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            buf = InputBuffer(f"arg{len(self.placeholders)}", _at_data_ptr(Layout.of(val)), [node.name],
                              position=len(self.placeholders))
            self.inputs.append(buf)
            self.placeholders.append(buf)
            return StorageView.whole(buf)
        if isinstance(val, torch.SymInt):  # a symbolic size Dynamo passes as an input
            val = sym_value(val)
        self.placeholders.append(val)
        return val

    def _constant(self, node):
        tensor = getattr(self.gm, node.target)
        if not isinstance(tensor, torch.Tensor):
            return tensor
        name = f"const{len(self.constants)}"
        self.constants[name] = tensor
        buf = InputBuffer(name, _at_data_ptr(Layout.of(tensor)), [node.name], position=-1)
        self.constant_buffers.append(buf)
        return StorageView.whole(buf)

    def _call(self, node):
        args = torch.fx.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.map_arg(node.kwargs, lambda n: self.env[n])
        if node.target is operator.getitem:   # one value of a multi-output op: its readers are the getitem's
            return self._maybe_realize(args[0][args[1]], node)
        if isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.scalar(node, args, kwargs)
        if node.target is torch.ops.aten._assert_scalar.default:
            self._learn_equal(node.args[0])
        if any(isinstance(a, ScalarRef) for a in pytree.tree_leaves((args, kwargs))):
            return self.extern(node, args, kwargs, "takes a number computed at run time")
        if self._defines_a_size(node.meta.get("val")):   # x[:k.item()]: its length is min(k, n), clamped
            return self.extern(node, args, kwargs, "its size is a new symbol only the run knows")
        reason = _unsupported_dtype(node)
        if "extern_reason" in node.meta:  # a backend's choice of a vendor library, stamped (cpu/claims.py)
            return self.extern(node, args, kwargs, reason or node.meta["extern_reason"])
        lowering = lowering_for(node.target)
        if lowering is None and reason is None:
            reason = f"no lowering for {_op_name(node.target)}"
        if reason is None:
            try:
                value = lowering(self, node, *args, **kwargs)
                _record_origins(value, node, args)
                return self._maybe_realize(value, node)
            except Unsupported as e:
                reason = str(e)
        return self.extern(node, args, kwargs, reason)

    def _maybe_realize(self, value, node):
        """A lazy value (or a view of one) read by several nodes gets memory when recomputing it
        in each reader would cost more than storing it: many readers, many ops, many buffers
        loaded, or a transcendental op where the backend keeps rows in scratch arrays. A view
        counts as what it views: Swin's patch merging reads the residual stream through a
        reshape of a permute, and its LayerNorm recomputed the whole roll/window chain in each
        of its three passes until the view itself was stored (once, as a row in scratch)."""
        if not isinstance(value, Lazy) and not (isinstance(value, ReindexView) and _views_lazy(value)):
            return value
        users = len(node.users)
        if users <= 1:
            return value
        rec = self.recorded(value)
        if (users > config.realize_reads_threshold or rec.op_count > config.realize_opcount_threshold
                or len({r.name for r in rec.reads}) > config.realize_loads_threshold
                or (self.compute_expensive_once and rec.ops_used & TRANSCENDENTAL)):
            return self.realize_as_node(value, node)
        return value

    def scalar(self, node, args, kwargs):
        """A node whose value is a number (SymInt, SymFloat, SymBool). A size expression over the
        symbols known so far (inputs' sizes, sizes the graph computed) stays an expression. Any
        other number is computed by the wrapper at run time, with the node's own op, into a
        variable named after the symbol it defines (``u0 = _local_scalar_dense(buf1)``, for
        ``.item()``) or ``scalarN``; kernels get a symbol as a size argument."""
        val = node.meta["val"]
        if _replaced(node):
            return self._checked_replacement(node, args, kwargs)
        if val.node.expr.is_number:
            return _python_number(val)
        if isinstance(val, torch.SymInt) and not _data_dependent(val):
            return sym_value(val)  # the inputs' sizes and arithmetic on them (NotSymbolic: per shape)
        if isinstance(val, torch.SymInt):
            try:
                value = sym_value(val)
            except NotSymbolic:
                value = None
            if value is not None and {s.name for s in symbols_of(value)} <= self._known_symbols():
                return value
            expr = val.node.expr
            if expr.is_Symbol and expr.name not in self._known_symbols():
                self.bound[expr.name] = (expr.name, None)
                self.extern(node, args, kwargs, "a size computed from data at run time", name=expr.name)
                return Expr.of(Sym(expr.name))
        name = self.new_name("scalar")
        self.extern(node, args, kwargs, "a number computed at run time", name=name)
        return ScalarRef(name)

    def _checked_replacement(self, node, args, kwargs):
        """A number from data (``u0 = x.sum().item()``) that a check torch made while tracing
        (``Eq(u0, 4)``, from broadcasting against a size 4) replaced by the value it checked: the
        graph's nodes, that check's too, hold the replacement. The wrapper reads the number and
        checks it is that value (torch's runtime assert), and later nodes take the value."""
        name, cond = self.new_name("scalar"), self.new_name("scalar")
        self.extern(node, args, kwargs, "a number from data the trace replaced", name=name)
        value = _python_number(node.meta["val"]) if node.meta["val"].node.expr.is_number else sym_value(node.meta["val"])
        message = f"Runtime assertion failed: {node.name} ({next(iter(node.meta['unbacked_bindings']))}) == {value}"
        for buf_name, op, op_args in [(cond, operator.eq, (ScalarRef(name), value)),
                                      (self.new_name(), torch.ops.aten._assert_scalar.default, (ScalarRef(cond), message))]:
            self.externs.append(ExternRecord(node.name, _op_name(op), "a check of a number from data"))
            self.register(ExternKernel(buf_name, None, [node.name], op=op, args=op_args, reason="a check of a number from data"))
        return value

    def _learn_equal(self, cond) -> None:
        """``_assert_scalar(a == b)``: torch checks at run time that two sizes it could not tell
        apart (``u5`` of ``v[:k]``, ``u3`` of a nonzero, broadcast together) are equal, as does
        Inductor's wrapper; ours runs the check before any kernel using them (scheduler's
        ``_checks_first``), so later lowerings may take them as one."""
        if isinstance(cond, torch.fx.Node) and cond.target is operator.eq and len(cond.args) == 2:
            a, b = (self._root(self.env.get(x) if isinstance(x, torch.fx.Node) else x) for x in cond.args)
            if a != b and all(isinstance(x, (int, Expr)) for x in (a, b)):
                self.checked_equal[a] = b

    def _root(self, size):
        while isinstance(size, (int, Expr)) and size in self.checked_equal:
            size = self.checked_equal[size]
        return size

    def same_size(self, a, b) -> bool:
        """``a == b`` as expressions, or checked equal at run time by an earlier ``_assert_scalar``."""
        return a == b or (bool(self.checked_equal) and self._root(a) == self._root(b))

    def _known_symbols(self) -> set:
        """Symbols the wrapper can read at this point: the inputs' sizes and those bound so far."""
        known = set(self.bound)
        for p in self.placeholders:
            for e in (p.layout.size + p.layout.stride if isinstance(p, InputBuffer) else (p,)):
                known |= {s.name for s in symbols_of(e)}
        return known

    def _defines_a_size(self, meta) -> bool:
        """A tensor sized by a data-dependent symbol nothing bound yet: only running the op tells it."""
        sizes = [s for s in (meta.shape if isinstance(meta, torch.Tensor) else ()) if isinstance(s, torch.SymInt)]
        new = {f.name for s in sizes if _data_dependent(s) for f in s.node.expr.free_symbols}
        return bool(new - self._known_symbols()) if new else False

    def _bind_sizes(self, buf: Buffer) -> None:
        """An extern's result whose size is a new symbol (nonzero's row count) binds that symbol."""
        for dim, s in enumerate(buf.layout.size):
            if isinstance(s, Expr) and len(s.terms) == 1 and s.terms[0][1] == 1 and not s.const:
                sym = s.terms[0][0]
                if isinstance(sym, Sym) and sym.name not in self._known_symbols():
                    self.bound[sym.name] = (buf.name, dim)

    def extern(self, node, args, kwargs, reason: str, name: str | None = None):
        """Run ``node`` as an eager ATen call; tensor arguments get memory first."""
        reads_storage = getattr(getattr(node.target, "overloadpacket", None), "__name__", "") in STORAGE_READERS
        for n in node.all_input_nodes:  # with eager's strides, shared with every later reader
            value = self.env.get(n)
            if isinstance(value, TensorValue) and reads_storage:
                self.env[n] = self.storage_view(value, n)
            elif isinstance(value, TensorValue) and not isinstance(value, StorageView):
                # a view as large as the value it views (a reshape, not a slice) shares that value's memory
                whole = isinstance(value, ReindexView) and _at_least(prod(value.size), prod(self.view_root(value, n)[0].size))
                self.env[n] = (self.realize_through_views if whole else self.realize_as_node)(value, n, padded=True)
        args = torch.fx.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.map_arg(node.kwargs, lambda n: self.env[n])

        def prep(a):
            if isinstance(a, TensorValue):
                return self.realize(a)
            return a
        args = torch.fx.node.map_aggregate(args, prep)
        kwargs = torch.fx.node.map_aggregate(kwargs, prep)
        self.externs.append(ExternRecord(node.name, _op_name(node.target), reason))
        meta = node.meta.get("val")
        ext = ExternKernel(name or self.new_name(), _layout_or_none(meta), [node.name], op=node.target,
                           args=args, kwargs=kwargs, reason=reason)
        self.register(ext)
        if isinstance(meta, torch.Tensor):
            self._bind_sizes(ext)
            return StorageView.whole(ext)
        if isinstance(meta, (list, tuple)):
            outs = []
            for k, m in enumerate(meta):
                if isinstance(m, torch.Tensor):
                    child = MultiOutput(self.new_name(), _at_data_ptr(Layout.of(m)), [node.name], parent=ext, path=(k,))
                    ext.outputs.append(child)
                    self.register(child)
                    self._bind_sizes(child)
                    outs.append(StorageView.whole(child))
                else:
                    outs.append(m)
            return outs
        ext.layout = None
        return None

    def _output(self, node):
        (outs,) = node.args
        for out in pytree.tree_leaves(outs):  # the pipeline restores the structure
            if isinstance(out, torch.fx.Node):
                value = self.env[out]
                if isinstance(value, TensorValue):  # once: a node returned twice is one buffer
                    value = self.env[out] = self.realize_through_views(value, out)
                self.outputs.append(value)
            else:
                self.outputs.append(out)

    def realize_through_views(self, value: TensorValue, node, padded: bool = False) -> StorageView:
        """Memory for ``node``'s value with eager's strides (outputs, extern arguments). A view of a lazy
        value realizes the value it views (once: the viewed node's env entry becomes that memory) and
        returns a view of it, as eager aliases them. Realizing the view itself instead gave the viewed
        value no memory, so its other readers stored it a second time (a softmax read by a bmm through
        a view and saved for backward: two buffers; the normalised rows Llama's query, key and value
        products read through views of their own: three) or recomputed it from its inputs."""
        if isinstance(value, StorageView):
            return value
        if isinstance(value, ReindexView):
            root, root_node = self.view_root(value, node)
            if root_node is not None and _aliases(node, root_node):
                stored = self.stored_roots.get(root_node) is root
                base = self.env[root_node] if stored else self.realize_as_node(root, root_node)
                if self.env.get(root_node) is root:
                    self.env[root_node], self.stored_roots[root_node] = base, root
                meta = node.meta["val"]
                view = StorageView(base.buffer, shape_of(meta), strides_of(meta), sym_value(meta.storage_offset()))
                if _same_memory(base, root_node.meta["val"]) and _at_least(view.buffer.layout.storage_numel(), _view_extent(view)):
                    return view
        return self.realize_as_node(value, node, padded)

    def view_root(self, value, node):
        """The value a chain of views views, and the FX node on ``node``'s chain of first arguments
        that holds it (None if none does). Not one node a view: a view may return its input unchanged
        (an expand to the same size), and the node one step further back then held another value
        (a square matrix's transpose, whose strides read the stored root wrongly: fuzz seed 711780)."""
        root = value
        while isinstance(root, ReindexView):
            root = root.base
        while node is not None and self.env.get(node) is not root and self.stored_roots.get(node) is not root:
            node = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        return root, node


def user_sources(gm: torch.fx.GraphModule) -> dict:
    """FX node name -> "file.py:LINE: code", the user's source line it came from (when recorded)."""
    out = {}
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if trace:
            out[node.name] = _last_frame(trace)
        elif node.meta.get("nn_module_stack"):   # code inside torch's own modules (nn.Sequential's children)
            path, kind = list(node.meta["nn_module_stack"].values())[-1]
            out[node.name] = f"module {_module_path(path)} ({getattr(kind, '__name__', kind)})"
    return out


def _module_path(source: str) -> str:
    """Dynamo's ``L['fn'].0`` or ``L['self'].layers[0]`` -> ``0`` / ``layers[0]``: the user's path."""
    path = re.sub(r"^L\['\w+'\]\.?", "", source)
    return path or "(the model)"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _last_frame(trace: str) -> str:
    # A traceback frame is 'File "f.py", line N, in fn' + the code line, and since Python
    # 3.11 often a '^^^^' marker line, which says nothing to a reader of kernel headers.
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip() and set(ln.strip()) - set("^~ ")]
    for k in range(len(lines) - 1, -1, -1):
        m = _FRAME.search(lines[k])
        if m:
            code = lines[k + 1] if k + 1 < len(lines) else ""
            return f"{os.path.basename(m['file'])}:{m['line']}: {code}".rstrip(": ")
    return lines[-1] if lines else ""


def _record_origins(value, node, args) -> None:
    """A lazy value remembers every FX node inlined into it, for kernel header comments."""
    if not isinstance(value, (Lazy, ReindexView)):
        return
    names = []
    for leaf in pytree.tree_leaves(args):
        if isinstance(leaf, (Lazy, ReindexView)):
            names += leaf.origins
    value.origins = list(dict.fromkeys(names + [node.name]))


def _storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose value owns ``node``'s eager storage: back through view ops (and the getitems
    of split/unbind) whose eager value shares its input's storage and dtype."""
    while node.op == "call_function":
        viewed = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if node.target is operator.getitem and viewed is not None and viewed.op == "call_function":
            viewed, op = (viewed.args[0] if viewed.args else None), viewed.target
        else:
            op = node.target
        if not (getattr(op, "is_view", False) and isinstance(viewed, torch.fx.Node) and _aliases(node, viewed)
                and node.meta["val"].dtype == viewed.meta["val"].dtype):
            return node
        node = viewed
    return node


def _owned(buf) -> bool:
    """The compiled code allocates ``buf`` and indexes it from its storage's start."""
    return isinstance(buf, ComputedBuffer) and not buf.mutates


def _views_lazy(value: ReindexView) -> bool:
    while isinstance(value, ReindexView):
        value = value.base
    return isinstance(value, Lazy)


def _aliases(node, root_node) -> bool:
    """``node``'s eager tensor is a view of ``root_node``'s (same fake storage)."""
    a, b = node.meta.get("val"), root_node.meta.get("val")
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage()))


def _same_memory(base: StorageView, root_meta) -> bool:
    """``base`` lays its elements out as eager's tensor does (strides, no offset): only then do
    eager's view strides and offset, taken relative to that storage, address ``base``'s buffer.
    A root realized with other strides (eager's were not dense) would be read wrongly."""
    return (base.offset == 0 and tuple(base.stride) == tuple(strides_of(root_meta))
            and sym_value(root_meta.storage_offset()) == 0 and tuple(base.buffer.layout.stride) == tuple(base.stride))


def _view_extent(view: StorageView) -> int:
    return Layout(view.size, view.stride, view.offset, view.dtype, view.device).storage_numel()


def _at_least(a, b) -> bool:
    """a >= b for every value of the symbols (False where that cannot be shown)."""
    if isinstance(a, int) and isinstance(b, int):
        return a >= b
    return (Expr.of(a) - b).range()[0] >= 0


def _data_dependent(val) -> bool:
    """``val`` depends on a symbol only the run knows (torch names them u0, u1, ...)."""
    return any(s.name.startswith("u") for s in val.node.expr.free_symbols)


def _replaced(node) -> bool:
    """``node`` reads a number from data (it binds symbol ``u0``), whose traced value is no longer
    that symbol: a check made while tracing replaced it (``Eq(u0, 4)``: 4)."""
    bindings = node.meta.get("unbacked_bindings") or {}
    val = node.meta.get("val")
    return len(bindings) == 1 and isinstance(val, torch.SymInt) and val.node.expr != next(iter(bindings))


def _python_number(val):
    """A SymInt/SymFloat/SymBool whose value the trace knows exactly, as a Python number."""
    kind = int if isinstance(val, torch.SymInt) else float if isinstance(val, torch.SymFloat) else bool
    return kind(val.node.expr)


def _gapped(lay: Layout) -> bool:
    """Static positive strides that never make two elements share memory, with gaps (padded rows)."""
    if not (is_static(lay.size) and is_static(lay.stride)) or _numel(lay.size) == 0:
        return False
    span = 1
    for st, sz in sorted((st, sz) for sz, st in zip(lay.size, lay.stride) if sz > 1):
        if st < span:
            return False
        span = st * sz
    return True


def _never_overlaps(lay: Layout) -> bool:
    """No two elements share memory at any sizes the symbols take. Eager's strides for a fresh
    symbolic output may be dense only at the sizes the graph is guarded to (a size ``s//3`` that
    is 1 there): dense is then unprovable, but keeping them is right, where row-major is not."""
    dims = [(Expr.of(st), Expr.of(sz)) for sz, st in zip(lay.size, lay.stride) if not (isinstance(sz, int) and sz <= 1)]
    dims.sort(key=lambda d: (d[0].range()[0], str(d[0])))
    span = Expr.of(1)
    for st, sz in dims:
        if not _at_least(st, span):
            return False
        span = st * sz
    return True


def _numel(size):
    return prod(size)


def _layout_or_none(meta):
    return _at_data_ptr(Layout.of(meta)) if isinstance(meta, torch.Tensor) else None


def _at_data_ptr(layout: Layout) -> Layout:
    """Kernels index from a tensor's data_ptr, which already includes its storage offset."""
    return Layout(layout.size, layout.stride, 0, layout.dtype, layout.device)


def _op_name(target) -> str:
    return str(target) if not hasattr(target, "__name__") else getattr(target, "__qualname__", target.__name__)


def _unsupported_dtype(node):
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for v in vals:
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and t.dtype not in SUPPORTED_DTYPES:
                return f"dtype {t.dtype} is not compiled"
            if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "cuda"):
                return f"device {t.device} is not compiled"
    return None
