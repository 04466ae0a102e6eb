"""The host wrapper: Python that allocates buffers, calls kernels and externs, returns outputs.

``WrapperCode(graph, plan, kernel_args).generate()`` (an ir.LoopGraph, its Schedule and the
kernels' argument names) writes a module that defines ``make(lib, externs, constants) -> call``,
where ``call(args)`` runs the graph. It imports torch and the host buffer pool (the runtime
hands it the kernel library), allocates outputs with eager's strides (large CPU buffers from
the pool, chosen when the wrapper is generated), and hands a dead intermediate's memory to
the next buffer of the same size and dtype. A horizontal group of kernels (the Schedule's,
scheduler/groups.py) is one call, made where its last kernel was; its kernels' buffers are
allocated at their own steps and none is handed on before that call.

When cpu/prepare.py moved values computed from parameters alone out of the graph, its last
placeholders are those values: ``call`` gets them from a runtime.prepared.CachedPreparation,
which recomputes them only when a parameter changed.

With symbolic sizes the wrapper binds each symbol at call time (``s77 = arg1.size(0)``, or
the int input Dynamo passes), sizes its buffers with expressions over the symbols, and
passes the symbols a kernel names after its pointers.

``call`` first checks one flag, whether a torch profiler is running; if one is, it runs
``call_profiled`` instead: the same steps, with the graph call, each kernel call (by kernel
name) and each extern call (by op name) recorded as profiler events (docs/modes.md).
"""
from __future__ import annotations

import math

import torch

from minicompile.codegen.common import INDEX_FAULT, comment_text
from minicompile.ir.expr import Expr, PythonRenderer
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import (ComputedBuffer, ExternKernel, InputBuffer, MultiOutput, ScalarRef, StorageView,
                                  contiguous_strides)
from minicompile.runtime import host_pool
from minicompile.runtime.extern_args import ALIGNED_ROW_ARGS, aligned_rows, fast_call
from minicompile.runtime.packed_gemm import packed_mm, packed_mm_into
from minicompile.runtime.prepared import CachedPreparation
from minicompile.scheduler.fusion import Schedule, TemplateKernel
from minicompile.scheduler.kernel import FusedKernel


class WrapperCode:
    def __init__(self, graph: LoopGraph, schedule: Schedule, kernel_args: dict,
                 prepared: CachedPreparation | None = None, reuse_memory: bool = True):
        self.graph = graph
        self.reuse_memory = reuse_memory  # off: every buffer keeps its own memory (testing/check.py)
        self.prepared = prepared        # supplies the trailing placeholders (runtime/prepared.py)
        self.schedule = schedule
        self.storage = graph.mutations  # a buffer that writes into an input is that input
        self.kernel_args = kernel_args  # kernel (or group) name -> [pointer names]
        # A kernel in a horizontal group -> (the group, the group's last kernel): its buffers
        # are allocated at its step, the group is called at the last one's
        self.group_of = {k: (g.name, g.kernels[-1]) for g in schedule.groups for k in g.kernels}
        self.suffix = ".data_ptr()" if schedule.caps.pass_pointers else ""
        self.externs = []               # ops and odd constants the wrapper refers to
        self.lines = []
        self.symbols = graph.symbols    # symbol -> (input position, dim or None)

    def _ref(self, obj) -> str:
        self.externs.append(obj)
        return f"externs[{len(self.externs) - 1}]"

    def value(self, a) -> str:
        if isinstance(a, StorageView):
            return self.view(a)
        if isinstance(a, ScalarRef):
            return a.name
        if isinstance(a, Expr):
            return PythonRenderer().render(a)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.value(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, str):  # an exact literal of any string, in ASCII: quotes and newlines escaped
            return ascii(a)
        if isinstance(a, bool) or a is None or isinstance(a, int):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else f"float('{a}')"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, torch.device):
            return f"torch.device({str(a)!r})"
        if isinstance(a, (torch.layout, torch.memory_format)):
            return str(a)
        return self._ref(a)

    def view(self, v: StorageView, returned: bool = False) -> str:
        """``v`` of its buffer. Inside the call a view is torch's C++ reinterpretation (no autograd
        view, a third of as_strided's time); one the call returns is as_strided, a view as eager's."""
        name = self.storage.get(v.buffer.name, v.buffer.name)
        if v.is_whole():
            return name
        if not returned:
            return f"reinterpret_tensor({name}, {tuple(v.size)}, {tuple(v.stride)}, {v.offset})"
        base = f"{name}.storage_offset() + {v.offset}" if not _owned(v.buffer) else str(v.offset)
        return f"as_strided({name}, {tuple(v.size)}, {tuple(v.stride)}, {base})"

    def generate(self) -> str:
        graph = self.graph
        from_inputs = {sym: w for sym, w in self.symbols.items() if isinstance(w[0], int)}
        int_inputs = {pos: sym for sym, (pos, dim) in from_inputs.items() if dim is None}
        names = [p.name if isinstance(p, InputBuffer) else int_inputs.get(k, "_")
                 for k, p in enumerate(graph.placeholders)]
        sizes = [f"{sym} = {names[pos]}.size({dim})" for sym, (pos, dim) in from_inputs.items() if dim is not None]
        self.steps = self._steps()  # per schedule step: (profiler event, lines), run one by one in testing/check.py
        self.lines = [ln for _, lines in self.steps for ln in lines]
        return self._module_text(names, sizes)

    def _steps(self) -> list:
        """(profiler event name or None, lines) per schedule step; after each step, the buffers
        nobody reads any more go to the pool, for the next buffer of their size and dtype."""
        last_use = self._last_uses()
        outputs = {o.buffer.name for o in self.graph.outputs if isinstance(o, StorageView)}
        pool: dict = {}
        steps = []
        for step_no, step in enumerate(self.schedule.steps):
            if isinstance(step, FusedKernel):
                call = self._call_name(step)
                steps.append((call, self._kernel_lines(step, call, pool, outputs)))
            elif isinstance(step, TemplateKernel):
                lines = [self._alloc(b, pool, outputs) for b in step.outputs]
                steps.append((step.name, lines + [self._call_line(step.name)]))
            else:
                steps.append((_extern_event_name(step), self._extern_lines(step.buffer, pool, outputs)))
            for name in sorted(n for n, last in last_use.items() if last == step_no):
                buf = self.graph.by_name.get(name)
                if name in outputs or buf is None or isinstance(buf, InputBuffer) or name in self.storage:
                    continue
                if self.reuse_memory and (isinstance(buf, ComputedBuffer) or writes_out(buf)):
                    pool.setdefault(_pool_key(buf), []).append(name)
        return steps

    def _kernel_lines(self, step: FusedKernel, call: str | None, pool: dict, outputs: set) -> list:
        """The buffers a kernel writes, allocated; the call of the kernel (or of its group)."""
        lines = [self._alloc(n, pool, outputs) for n in step.nodes if step.in_memory(n.name) and not n.mutates]
        if call:
            lines.append(self._call_line(call))
        if call and INDEX_FAULT in self.kernel_args[call]:   # it read an index from memory: one out of bounds raises
            lines.append("if index_faults[0]: raise_index_fault(index_faults)")
        return lines

    def _call_line(self, call: str) -> str:
        ptrs = ", ".join(p if p in self.symbols or p == INDEX_FAULT else f"{p}{self.suffix}" for p in self.kernel_args[call])
        return f"{call}({ptrs})"

    def _extern_lines(self, b, pool: dict, outputs: set) -> list:
        """A library call (into its own buffer where it has an out= form), or an item of a
        multi-output result; the sizes it defines bound, its result in the compiled layout."""
        lines = []
        if isinstance(b, ExternKernel):
            texts = [self.value(a) for a in b.args] + _defaults(b.op, len(b.args), b.kwargs)
            if b.op in ALIGNED_ROW_ARGS and len(texts) > ALIGNED_ROW_ARGS[b.op]:
                at = ALIGNED_ROW_ARGS[b.op]
                texts[at] = f"{self._ref(aligned_rows)}({texts[at]})"
            args = ", ".join(texts + [f"{k}={self.value(v)}" for k, v in b.kwargs.items()])
            if writes_out(b):  # into its own buffer, already in the layout kernels index
                out_op = OUT_VARIANTS[b.op]
                lines.append(self._alloc(b, pool, outputs))
                shown = out_op if isinstance(out_op, torch._ops.OpOverload) else out_op.__name__
                lines.append(f"{self._ref(fast_call(out_op))}({args}, out={b.name})  # "
                             + comment_text(f"{shown} into {b.name}: {b.reason}"))
            else:
                lines.append(f"{b.name} = {self._ref(fast_call(b.op))}({args})  "
                             f"# {comment_text(f'{b.op}: {b.reason}')}")
                lines += self._bind_sizes(b)
                if b.layout is not None:
                    lines.append(self._conform(b))
        elif isinstance(b, MultiOutput):
            lines.append(f"{b.name} = {b.parent.name}{''.join(f'[{k}]' for k in b.path)}")
            lines += self._bind_sizes(b)
            lines.append(self._conform(b))
        return lines

    def _module_text(self, names: list, sizes: list) -> str:
        """The module: its helpers, then ``make`` binding the kernels and constants and defining
        ``call`` and ``call_profiled`` over the steps."""
        graph = self.graph
        ret = ", ".join(self.view(o, returned=True) if isinstance(o, StorageView) else self.value(o)
                        for o in graph.outputs)
        head = [
            "# minicompile host wrapper: allocate, call kernels and externs in order, return outputs.",
            "import torch",
            "import torch.autograd.profiler as autograd_profiler",
            "",
            "from minicompile.runtime.host_pool import take as pooled  # large CPU buffers nobody holds any more",
            "from minicompile.runtime.host_pool import empty_strided as pooled_if_large  # a symbolic size: decided per call",
            "from minicompile.runtime.host_pool import empty_strided_cpu, reinterpret_tensor  # torch's C++ fast paths",
            "from minicompile.runtime.profiling import graph_event_name, record_function",
            "",
            "empty_strided = torch.empty_strided",
            "as_strided = torch.as_strided",
            "",
            "",
            "def conform(t, size, stride):",
            "    \"\"\"An extern's result in the layout the kernels index it with (a copy if eager chose another);",
            "    None where the op left an optional output undefined (cuDNN attention's logsumexp without grad).",
            "    A size other than the compiled one (a size from data that a check made while tracing fixed) raises.\"\"\"",
            "    if t is not None and t.shape != size:",
            "        raise RuntimeError(f'Runtime assertion failed: an extern returned size {tuple(t.shape)}, compiled for {size}')",
            "    if t is None or t.stride() == stride or all(a == b or n == 1 for a, b, n in zip(t.stride(), stride, size)):",
            "        return t",
            "    return empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)",
            "",
            "",
            "def make(lib, externs, constants):",
        ]
        if any(INDEX_FAULT in a for a in self.kernel_args.values()):
            head[-1:-1] = ["from minicompile.runtime.index_faults import fault_record, raise_index_fault",
                           f"{INDEX_FAULT}, index_faults = fault_record()  # where a kernel records an index out of bounds", "", ""]
        head += [f"    {name} = lib.{name}" for name in self.kernel_args]
        head += [f"    {c} = constants[{c!r}]" for c in graph.constants]
        head.append("    graph_event = graph_event_name()")
        unpack = self.prologue = self._unpack(names) + sizes
        ret_line = f"return ({ret}{',' if len(graph.outputs) == 1 else ''})"
        profiled = ["with record_function(graph_event):"] + _indent(unpack + _with_events(self.steps) + [ret_line])
        plain = ["if autograd_profiler._is_profiler_enabled:  # the one check a call pays without a profiler",
                 "    return call_profiled(args)"] + unpack + self.lines + [ret_line]
        functions = ["", "    def call(args):", *_indent(plain, 2), "",
                     "    def call_profiled(args):", *_indent(profiled, 2), "", "    return call", ""]
        return "\n".join(head + functions)

    def _unpack(self, names: list) -> list:
        """The caller's arguments, then the prepared values computed from them (cached)."""
        k = len(names) - (len(self.prepared.layouts) if self.prepared else 0)
        lines = [f"{', '.join(names[:k])}{',' if k == 1 else ''} = args"] if k else []
        if self.prepared:
            lines.append(f"{', '.join(names[k:])}, = {self._ref(self.prepared)}(args)  "
                         "# computed from parameters, kept while they are unchanged")
        return lines

    def _bind_sizes(self, b) -> list:
        """The symbols ``b``'s size defines (nonzero's row count), read from its result."""
        return [f"{sym} = {b.name}.size({dim})  # a size computed from data"
                for sym, (name, dim) in self.graph.bound.items() if name == b.name and dim is not None]

    def _conform(self, b) -> str:
        lay = b.layout
        return f"{b.name} = conform({b.name}, {lay.size}, {lay.stride})"

    def _alloc(self, n: ComputedBuffer, pool, outputs) -> str:
        lay = n.layout
        key = _pool_key(n)
        if n.name not in outputs and pool.get(key):
            old = pool[key].pop()
            return f"{n.name} = {old}  # reuses the memory of {old}" if _same_layout(self.graph.by_name[old], n) else \
                f"{n.name} = reinterpret_tensor({old}, {lay.size}, {lay.stride}, 0)  # reuses {old}"
        nbytes = lay.storage_numel() * lay.dtype.itemsize
        # decided here, not on every call, unless the size is symbolic
        if lay.device.type == "cpu" and isinstance(nbytes, Expr):
            return f"{n.name} = pooled_if_large({lay.size}, {lay.stride}, dtype={lay.dtype}, device=torch.device('cpu'))"
        if lay.device.type == "cpu" and nbytes >= host_pool.MIN_BYTES:
            return f"{n.name} = pooled({lay.size}, {lay.stride}, {lay.dtype}, {nbytes})"
        if lay.device.type == "cpu":
            return f"{n.name} = empty_strided_cpu({lay.size}, {lay.stride}, {lay.dtype})"
        return (f"{n.name} = empty_strided({lay.size}, {lay.stride}, dtype={lay.dtype}, "
                f"device=torch.device({str(lay.device)!r}))")

    def _call_name(self, step) -> str | None:
        """What a kernel step calls: itself, its group (at the group's last kernel), or nothing."""
        if not isinstance(step, FusedKernel):
            return None
        group, last = self.group_of.get(step.name, (step.name, step.name))
        return group if step.name == last else None

    def _last_uses(self) -> dict:
        """Buffer name -> the step after which nothing reads it (a group's buffers: its last
        kernel's step, where the group is called)."""
        last, views = {}, []
        for k, step in enumerate(self.schedule.steps):
            if isinstance(step, (FusedKernel, TemplateKernel)):
                call = self._call_name(step) if isinstance(step, FusedKernel) else step.name
                for p in self.kernel_args[call] if call else ():
                    last[p] = k
            else:
                b = step.buffer
                last[b.name] = max(last.get(b.name, k), k)
                for r in step.reads:
                    last[r] = k
                op = b.parent.op if isinstance(b, MultiOutput) else b.op
                if isinstance(b, MultiOutput) or (isinstance(op, torch._ops.OpOverload) and op.is_view):
                    views.append((b.name, step.reads))
        # an extern's view (x[:k] of a length from data) keeps what it views alive: as long as
        # it is read, and for good where it is returned
        outputs = {o.buffer.name for o in self.graph.outputs if isinstance(o, StorageView)}
        for name, bases in reversed(views):
            until = len(self.schedule.steps) if name in outputs else last.get(name, 0)
            for r in bases:
                last[r] = max(last.get(r, 0), until)
        return last


# Library calls that write into a buffer the wrapper gives them, as kernels do: their results come
# from the buffer pool and the dead-buffer reuse, not a fresh allocation whose pages are faulted in
# again on every call once glibc has returned them (measured in docs/models.md).
OUT_VARIANTS = {torch.ops.aten.mm.default: torch.ops.aten.mm.out, torch.ops.aten.bmm.default: torch.ops.aten.bmm.out,
                packed_mm._opoverload: packed_mm_into}


def _defaults(op, given: int, kwargs: dict) -> list:
    """The positional arguments after the ``given`` ones, spelled out from ``op``'s schema where a
    generated binding (extern_args.fast_call) stands in: its defaults can differ from the schema's
    (``torch._C._nn.soft_margin_loss`` reduces nothing unless told ``reduction=1``)."""
    if fast_call(op) is op:
        return []
    rest = [a for a in op._schema.arguments[given:] if not a.kwarg_only and a.name not in kwargs]
    return [repr(a.default_value) for a in rest[:next((k for k, a in enumerate(rest) if not a.has_default_value()), None)]]


def writes_out(b) -> bool:
    """``b`` is a library call the wrapper runs into its own CPU buffer (OUT_VARIANTS)."""
    lay = getattr(b, "layout", None)
    return (isinstance(b, ExternKernel) and b.op in OUT_VARIANTS and lay is not None and lay.device.type == "cpu"
            and tuple(lay.stride) == tuple(contiguous_strides(lay.size)))


def _extern_event_name(step) -> str | None:
    """An extern step's name in a profiler trace: its op (a kernel step's is what it calls)."""
    if isinstance(step.buffer, ExternKernel):
        op = step.buffer.op
        return str(op) if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))
    return None


def _with_events(steps) -> list:
    """The steps' lines, each kernel and extern call inside a profiler event of its name."""
    out = []
    for event, lines in steps:
        out += [f"with record_function({ascii(event)}):", *_indent(lines)] if event and lines else lines
    return out


def _indent(lines, levels: int = 1) -> list:
    return ["    " * levels + ln for ln in lines]


def _owned(buf) -> bool:
    return isinstance(buf, ComputedBuffer) and not buf.mutates


def _pool_key(b):
    return (b.layout.dtype, str(b.layout.device), b.layout.storage_numel())


def _same_layout(a, b) -> bool:
    return a is not None and (a.layout.size, a.layout.stride) == (b.layout.size, b.layout.stride)
