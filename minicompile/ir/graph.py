"""LoopGraph: what lowering hands on, a frozen value that prints as readable loop IR.

    graph = lower(aten_gm)          lowering/ -> ir/
    print(graph)                    one block per buffer, through PrintOps

Every consumer downstream (the scheduler, the code generators, the host wrapper, the
reports) reads this value and nothing else of lowering. A block shows the buffer's name,
dtype and shape (strides when not contiguous), the FX nodes it came from grouped by the
user's source line, and its loop body:

    buf2: f32[64, 128]  pointwise
      # layernorm_softmax.py:9: return torch.softmax(y, -1)  <- FX amax, sub, exp
      def body(i0, i1):
          tmp0 = ops.load('buf1', 128*i0 + i1)
          tmp1 = ops.exp(tmp0)
          ops.store('buf2', 128*i0 + i1, tmp1)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import torch

from minicompile.ir.expr import Expr, NotSymbolic, PythonRenderer, Sym, make_vars, symbols_of
from minicompile.ir.flex import SCORE, FlexAttention, FlexStat
from minicompile.ir.nodes import (Buffer, ComputedBuffer, ExternKernel, InputBuffer, MultiOutput, Reduction,
                                  StorageView, contiguous_strides, iteration_vars)
from minicompile.ir.ops import PrintOps, RecordOps


@dataclass(frozen=True)
class ExternRecord:
    """An FX node run as an eager ATen call, and why."""
    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class LoopGraph:
    inputs: tuple                     # InputBuffer per tensor placeholder, in order
    placeholders: tuple               # per placeholder: its InputBuffer, or the python value it was traced with
    constants: Mapping                # name -> tensor the graph captured (get_attr)
    constant_buffers: tuple           # InputBuffer per constant
    buffers: tuple                    # ComputedBuffer | ExternKernel | MultiOutput, in program order
    outputs: tuple                    # StorageView | python value, per flattened output
    sources: Mapping                  # FX node name -> "file.py:LINE: code" of the user's source
    externs: tuple                    # ExternRecord per node run eagerly
    # A symbol the graph computes (a data-dependent size: nonzero's row count, a value .item()
    # read) -> (the buffer that yields it, the dim of its size or None for the scalar itself)
    bound: Mapping = field(default_factory=dict)
    # Derived once, when lowering builds the graph; the scheduler and the code generators read them.
    by_name: Mapping = field(init=False, repr=False)     # every buffer kernels may name: computed,
                                                         # extern, inputs and constants
    mutations: Mapping = field(init=False, repr=False)   # computed buffer -> the input it writes into
    reads: Mapping = field(init=False, repr=False)       # buffer -> the names of the buffers it reads
    symbols: Mapping = field(init=False, repr=False)     # size symbol -> where the wrapper reads it

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, MappingProxyType(dict(value)))
        for name in ("constants", "sources", "bound"):
            put(name, getattr(self, name))
        put("by_name", {b.name: b for b in (*self.buffers, *self.inputs, *self.constant_buffers)})
        put("mutations", {b.name: b.mutates for b in self.buffers if isinstance(b, ComputedBuffer) and b.mutates})
        put("reads", {b.name: buffer_reads(b) for b in self.buffers})
        put("symbols", graph_symbols(self))

    def __str__(self) -> str:
        return format_loop_graph(self)


def recorded_body(buf: ComputedBuffer) -> RecordOps:
    """``buf``'s loop body run once on a RecordOps: what it reads, at which index, and its exprs."""
    rec = RecordOps()
    idx = iteration_vars(buf.data.ranges)
    if isinstance(buf.data, Reduction):
        buf.data.body(rec, idx, iteration_vars(buf.data.reduction_ranges, "r"))
    else:
        buf.data.body(rec, idx)
    return rec


def buffer_reads(buf) -> frozenset:
    """The names of the buffers ``buf`` reads: its loop body's loads, an extern's arguments."""
    if isinstance(buf, ComputedBuffer):
        return frozenset(r.name for r in recorded_body(buf).reads)
    if isinstance(buf, (MultiOutput, FlexStat)):
        return frozenset({buf.parent.name})
    if isinstance(buf, FlexAttention):
        return frozenset(v.buffer.name for v in buf.views())
    names = set()

    def visit(a):
        if isinstance(a, StorageView):
            names.add(a.buffer.name)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
    visit(buf.args)
    visit(buf.kwargs)
    return frozenset(names)


def graph_symbols(graph: LoopGraph) -> dict:
    """Each size symbol of a LoopGraph -> where the wrapper reads it at call time: ``(position,
    dim)``, dimension ``dim`` of input ``position``, or ``(position, None)``, an int input; a
    symbol the graph computes (graph.bound) -> ``(buffer name, dim or None)``, read once that
    buffer's step has run. A symbol that is neither (only ``2*s0`` seen) raises NotSymbolic."""
    where = {}
    for pos, p in enumerate(graph.placeholders):
        if _bare_symbol(p):
            where.setdefault(p.terms[0][0].name, (pos, None))
        elif isinstance(p, Buffer):
            for dim, s in enumerate(p.layout.size):
                if _bare_symbol(s):  # not a product (s0*s1: an input flattened before the graph)
                    where.setdefault(s.terms[0][0].name, (pos, dim))
    for sym, place in graph.bound.items():
        where.setdefault(sym, place)
    used = set()
    for b in (*graph.inputs, *graph.buffers):
        if b.layout is not None:
            for s in (*b.layout.size, *b.layout.stride, b.layout.offset):
                used |= {sym.name for sym in symbols_of(s)}
    missing = used - set(where)
    if missing:
        raise NotSymbolic(f"symbols {sorted(missing)} are no input's size")
    return dict(sorted(where.items()))


def _bare_symbol(e) -> bool:
    """``e`` is one symbol, ``s0``: not ``2*s0``, ``s0 + 1`` or ``s0*s1``."""
    return (isinstance(e, Expr) and len(e.terms) == 1 and e.terms[0][1] == 1 and not e.const
            and isinstance(e.terms[0][0], Sym))


def format_loop_graph(graph: LoopGraph) -> str:
    lines = [f"# loop IR: {len(graph.inputs)} input(s), {len(graph.constant_buffers)} constant(s), "
             f"{len(graph.buffers)} buffer(s), {len(graph.outputs)} output(s)"]
    for k, p in enumerate(graph.placeholders):
        lines.append(f"{p.name}: {_type(p)}  input {k}" if isinstance(p, InputBuffer) else f"_: {p!r}  input {k}")
    lines += [f"{c.name}: {_type(c)}  constant" for c in graph.constant_buffers]
    for buf in graph.buffers:
        lines.append("")
        lines += _block(buf, graph.sources)
    lines.append("")
    outs = [_output(o) for o in graph.outputs]
    lines.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return "\n".join(lines) + "\n"


def _block(buf: Buffer, sources) -> list[str]:
    if isinstance(buf, ExternKernel):
        args = [_arg(a) for a in buf.args] + [f"{k}={_arg(v)}" for k, v in buf.kwargs.items()]
        head = f"{buf.name}: {_type(buf) if buf.layout is not None else 'None'}  extern {buf.op}({', '.join(args)})"
        return [head, *_origins(buf, sources), f"  # runs eagerly: {buf.reason}"]
    if isinstance(buf, MultiOutput):
        path = "".join(f"[{k}]" for k in buf.path)
        return [f"{buf.name}: {_type(buf)}  = {buf.parent.name}{path}"]
    if isinstance(buf, FlexStat):
        return [f"{buf.name}: {_type(buf)}  = the {buf.which} (base 2) of {buf.parent.name}"]
    if isinstance(buf, FlexAttention):
        return [*_flex_head(buf), *_origins(buf, sources), *("  " + ln for ln in _flex_bodies(buf))]
    data = buf.data
    kind = "reduction" if isinstance(data, Reduction) else "pointwise"
    head = f"{buf.name}: {_type(buf)}  {kind}"
    if isinstance(data, Reduction):
        head += f" {data.reduction_type} over " + ", ".join(f"{v.name} < {v.size}" for v in make_vars("r", data.reduction_ranges))
    if buf.mutates:
        head += f", writes input {buf.mutates}"
    return [head, *_origins(buf, sources), *("  " + ln for ln in body_lines(buf))]


def body_lines(buf: ComputedBuffer) -> list[str]:
    """``buf``'s loop body as ``def body(i0, ..., r0, ...):`` with one line per op, ending in its store."""
    data, ops, render = buf.data, PrintOps(), PythonRenderer().render
    index = iteration_vars(data.ranges, "i")
    params = [str(v) for v in index]
    if isinstance(data, Reduction):
        rindex = iteration_vars(data.reduction_ranges, "r")
        params += [str(v) for v in rindex]
        value = ops.reduction(data.reduction_type, data.body(ops, index, rindex))
    else:
        value = data.body(ops, index)
    store = f"ops.store({buf.name!r}, {render(buf.store_index(index))}, {value})"
    ranges = [*data.ranges, *data.reduction_ranges]
    bounds = ", ".join(f"{p} < {n}" for p, n in zip(params, ranges))
    return [f"def body({', '.join(params)}):  # {bounds}", *("    " + ln for ln in ops.lines), "    " + store]


def _flex_head(buf: FlexAttention) -> list[str]:
    blocks = ", ".join(_view(v) for v in buf.partial + buf.full)
    return [f"{buf.name}: {_type(buf)}  flex_attention({_view(buf.query)}, {_view(buf.key)}, {_view(buf.value)}, "
            f"scale={buf.scale!r}, blocks {buf.q_block}x{buf.kv_block}: {blocks})"]


def _flex_bodies(buf: FlexAttention) -> list[str]:
    """The score and mask bodies, over the score (``ops.load('mc_score', 0)``) and (b, h, q_idx, kv_idx)."""
    lines = []
    for name, body in (("score", buf.score), ("mask", buf.mask)):
        if body is not None:
            ops = PrintOps()
            value = body(ops)
            lines += [f"def {name}(b, h, q_idx, kv_idx):" + (f"  # {SCORE}: the scaled q.k" if name == "score" else ""),
                      *("    " + ln for ln in ops.lines),
                      f"    return {value}"]
    return lines


def _origins(buf: Buffer, sources) -> list[str]:
    """The FX nodes behind ``buf``, one line per user source line they came from."""
    by_line: dict = {}
    for name in buf.origins:
        by_line.setdefault(sources.get(name, ""), []).append(name)
    return [f"  # {line + '  ' if line else ''}<- FX {', '.join(names)}" for line, names in by_line.items()]


_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
          torch.bool: "b8"}


def _type(buf: Buffer) -> str:
    lay = buf.layout
    text = f"{_SHORT.get(lay.dtype, str(lay.dtype).replace('torch.', ''))}{list(lay.size)}"
    if tuple(lay.stride) != contiguous_strides(lay.size):
        text += f" strides {tuple(lay.stride)}"
    return text


def _view(v: StorageView) -> str:
    if v.is_whole():
        return v.buffer.name
    return f"{v.buffer.name}.as_strided({list(v.size)}, {tuple(v.stride)}, {v.offset})"


def _arg(a) -> str:
    if isinstance(a, StorageView):
        return _view(a)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    return repr(a)


def _output(o) -> str:
    return _view(o) if isinstance(o, StorageView) else repr(o)
