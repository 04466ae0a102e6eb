"""Triton code generation: every kernel of a graph in one Python module of ``@triton.jit`` kernels.

A FusedKernel becomes one Triton kernel. A pointwise kernel runs one program per XBLOCK
elements of its flat index space; a reduction kernel one program per XBLOCK rows, each row
reduced over RBLOCK lanes at a time. When a row fits in one block (rnumel <= the persistent
limit) the reduction is *persistent*: the whole row is in registers, there is no loop, and
a row value computed by one stage is reused by the next. Otherwise each "loop" stage is one
``for roffset in range(0, rnumel, RBLOCK)`` loop with running per-lane accumulators, reduced
across lanes after the loop. Values have the shape of the loop variables they depend on:
``[XBLOCK, 1]`` for per-row values, ``[1, RBLOCK]`` or ``[XBLOCK, RBLOCK]`` inside a row, and
masks are built from the same variables, so loads and stores always match their masks.

Loop bodies are rendered by running the IR's body functions against TritonOps, which emits
one temporary per value, as CppOps does for C++.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import torch

from minicompile.codegen.common import ARG_REDUCTIONS, GeneratedKernels, KernelRenderer, reductions_of
from minicompile.codegen.same_code import code_key
from minicompile.codegen.triton_flex import render_flex_triton
from minicompile.codegen.triton_ops import PRELUDE, REDUCTIONS, TL, TritonRenderer, literal, template
from minicompile.config import config
from minicompile.ir.expr import Expr, Var, atoms_of, size_value
from minicompile.ir.nodes import Reduction, is_static
from minicompile.ir.ops import BOOL_RESULT, compute_dtype
from minicompile.runtime.triton_launch import load as load_triton
from minicompile.scheduler.caps import BackendCaps

_R = TritonRenderer()
INT32_LIMIT = 2 ** 31 - 1


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclass
class TV:
    """A Triton value: an expression (usually a temporary), its compute dtype, and which loop
    groups ("x" rows / elements, "r" reduced lanes) it varies over, which fixes its shape."""
    expr: str
    dtype: torch.dtype
    groups: frozenset = frozenset()
    tensor: bool = False     # ``expr`` is a Triton tensor (a temporary, a tl.full), not a bare literal
    number: object = None    # the Python number a bare literal spells (None otherwise)

    def __str__(self):
        return self.expr


@dataclass
class TritonOps:
    """Emits Triton statements for a loop body into ``lines``; values are TV."""
    kernel: "TritonKernel"
    lines: list
    known: dict                                  # buffer name -> (index Expr, TV) already in registers
    cse: dict = field(default_factory=dict)
    mask_groups: frozenset = frozenset()         # groups every load is masked by, whatever its index

    def __post_init__(self):
        if self.kernel.persistent:  # one row in registers: a value computed once serves every stage
            self.cse = self.kernel.row_cse

    def _tmp(self, dtype, expr, groups) -> TV:
        key = (expr, dtype)
        if key in self.cse:
            return self.cse[key]
        name = f"tmp{next(self.kernel.counter)}"
        self.lines.append(f"{name} = {expr}")
        value = TV(name, dtype, frozenset(groups), tensor=True)
        self.kernel.groups_of[name] = value.groups
        self.cse[key] = value
        return value

    def load(self, name, index, dtype):
        if name in self.known:
            where, value = self.known[name]
            if where == index:
                return value
        assert name not in self.kernel.k.local, f"local {name} read at {index} outside its registers"
        groups = self.kernel.index_groups(index)
        rendered = _R.render(index)
        # Groups the load varies over without its index using them: the masked ones (an empty row:
        # every lane masked off), and "x" for a scalar (a 0-d input), loaded as a block since
        # Triton's interpreter cannot combine a 0-d bool with a block (maximum(scalar, x)'s
        # `(a != a) | (a > b)`: fuzzer seed 900023); on a GPU every lane reads one address
        padded = self.mask_groups if groups else self.mask_groups | {"x"}
        for g in sorted(padded - groups):
            rendered = f"{rendered} + 0 * {g}index"
        groups |= padded
        if name in self.kernel.written:
            # written earlier by this kernel at another lane: make that store visible first
            self.lines.append("tl.debug_barrier()")
        ptr = self.kernel.pointer(name)
        mask = self.kernel.mask(groups)
        raw = f"tl.load({ptr} + ({rendered}){', ' + mask + ', other=0' if mask else ''})"
        if compute_dtype(dtype) != dtype:
            raw += f".to({TL[compute_dtype(dtype)]})"
        return self._tmp(compute_dtype(dtype), raw, groups)

    def constant(self, value, dtype):
        return _constant(value, compute_dtype(dtype))

    def index_expr(self, expr, dtype):
        groups = self.kernel.index_groups(expr)
        if expr.is_const:
            return _constant(expr.const, dtype)
        if not groups:  # sizes only: Triton passes an int argument equal to 1 as a constexpr, which has no .to
            return self._tmp(dtype, f"tl.full([], {_R.render(expr)}, tl.int64).to({TL[dtype]})", groups)
        return self._tmp(dtype, f"({_R.render(expr)}).to({TL[dtype]})", groups)

    def to_dtype(self, x, dtype):
        if dtype == torch.bfloat16:  # computed in float32, rounded as eager rounds
            f32 = _as_tensor(x) if x.dtype == torch.float32 else f"{_as_tensor(x)}.to(tl.float32)"
            return self._tmp(torch.float32, f"mc_round_bf16({f32})", x.groups)
        if dtype == torch.float16:
            return self._tmp(torch.float32, f"{x}.to({TL[dtype]}).to(tl.float32)", x.groups)
        if x.dtype == dtype:
            return x
        if x.number is not None:   # a bare literal converts as a literal
            return _constant(x.number, dtype)
        return self._tmp(dtype, f"{_as_tensor(x)}.to({TL[dtype]})", x.groups)

    def pointwise(self, op, *args, dtype):
        operand = args[1].dtype if op == "where" else args[0].dtype
        groups = frozenset().union(*(a.groups for a in args))
        if op == "where" and args[0].dtype != torch.bool:  # lowering may hand a 0/1 number as the condition
            args = (TV(f"({args[0]} != 0)", torch.bool, args[0].groups),) + args[1:]
        expr = template(op, operand).format(*args)
        if op not in BOOL_RESULT and operand != dtype:
            expr = f"({expr}).to({TL[dtype]})"
        return self._tmp(dtype, expr, groups)


def _constant(value, dtype: torch.dtype) -> TV:
    """A constant of ``dtype`` (triton_ops.literal): float64 and an int64 beyond int32 are spelled
    as a tl.full tensor; inf and nan as ``float('inf')``, a literal but not a plain number."""
    if dtype == torch.bool:
        full, number = False, bool(value)
    elif dtype.is_floating_point:
        full = dtype == torch.float64
        number = None if full or not math.isfinite(float(value)) else float(value)
    else:
        full = dtype == torch.int64 and not -2 ** 31 <= int(value) < 2 ** 31
        number = None if full else int(value)
    return TV(literal(value, dtype), dtype, tensor=full, number=number)


def _as_tensor(x: TV) -> str:
    """``.to`` needs a tensor: a bare literal becomes a 0-d one."""
    if x.groups or x.tensor:
        return x.expr
    return f"tl.full([], {x.expr}, {TL[x.dtype]})"


class TritonKernel(KernelRenderer):
    """Renders one FusedKernel to a ``@triton.jit`` function (and its launch metadata)."""

    COMMENT = "#"
    REDUCTIONS = REDUCTIONS
    # Per-lane accumulators and a tree reduction across lanes keep a long float32 sum close to
    # eager's without float64, which is many times slower on GPUs.
    WIDE_SUMS_ABOVE = None
    literal = staticmethod(literal)

    def __init__(self, kernel, buffers: dict, storage: dict, sources: dict, symbols=()):
        super().__init__(kernel, buffers, storage, sources)
        self.symbols = symbols       # the graph's size symbols; those this kernel names become arguments
        self.size_args = []
        self.groups_of = {}          # temporary name -> groups (for indirect indices)
        self.written = set()         # buffers this kernel has stored so far (while rendering)
        self.row_cse = {}            # persistent kernels: values stay valid for the whole row
        self.reduction = kernel.is_reduction
        self.xnumel = kernel.outer_numel
        self.rnumel = kernel.inner_numel if self.reduction else 1
        static = is_static([self.xnumel, self.rnumel])
        # a symbolic row length has no bound to size a register block by: it is looped
        self.persistent = self.reduction and static and next_power_of_2(self.rnumel) <= config.triton_persistent_rnumel
        numels = [b.layout.storage_numel() for b in buffers.values() if b.layout is not None]
        # symbolic sizes: 64-bit indices, right for every size the graph may see
        big = not static or not is_static(numels) or max(numels + [0]) > INT32_LIMIT
        self.index_dtype = "tl.int64" if big or self.xnumel * self.rnumel > INT32_LIMIT else None

    # -- masks --------------------------------------------------------------------------------
    def index_groups(self, index: Expr) -> frozenset:
        groups = set()
        for a in atoms_of(index):
            if isinstance(a, Var):
                groups.add(a.name[0])
            else:
                groups |= self.groups_of.get(a.name, frozenset())
        return frozenset(groups)

    def mask(self, groups) -> str:
        return " & ".join(f"{g}mask" for g in ("x", "r") if g in groups)

    # -- rendering --------------------------------------------------------------------------
    def render(self) -> str:
        k = self.k
        body = self._body()
        named = {sym.name for sym in k.named_symbols()}   # as the C++ plan's (scheduler/kernel.py)
        self.size_args = [s for s in self.symbols if s in named]  # passed after the tensors
        lines = self.header() + [f"# {self.describe()}"]
        lines += ["@triton.jit", f"def {k.name}("]
        lines += [f"    {a.name},  # {a.describe()}" for a in self.args]
        lines += [f"    {s},  # a size, known at call time" for s in self.size_args]
        lines.append("    XBLOCK: tl.constexpr,  # " + ("rows per program" if self.reduction else "elements per program"))
        if self.reduction:
            what = "the whole row (persistent)" if self.persistent else "lanes per loop step"
            lines.append(f"    RBLOCK: tl.constexpr,  # reduced elements per row held at once: {what}")
        lines.append("):")
        lines += ["    " + ln if ln else "" for ln in body]
        # what decides whether two kernels are the same code (codegen/same_code.py): parameters and body
        self.code_lines = [a.name for a in self.args] + self.size_args + ["XBLOCK", "RBLOCK" * self.reduction] + body
        return "\n".join(lines)

    def describe(self) -> str:
        if not self.reduction:
            return f"pointwise over {self.xnumel} elements (outer loops {list(self.k.outer_ranges)})"
        form = "persistent" if self.persistent else "looped"
        return (f"{form} reduction: {self.xnumel} rows x {self.rnumel} reduced elements "
                f"(outer {list(self.k.outer_ranges)}, inner {list(self.k.inner_ranges)})")

    def _body(self) -> list:
        k = self.k
        out = [f"xnumel = {_size(self.xnumel)}"]
        if self.reduction:
            out.append(f"rnumel = {_size(self.rnumel)}")
        shape = "[:, None]" if self.reduction else ""
        pid = "tl.program_id(0)" + (f".to({self.index_dtype})" if self.index_dtype else "")
        out += [f"xoffset = {pid} * XBLOCK",
                f"xindex = xoffset + tl.arange(0, XBLOCK){shape}",
                "xmask = xindex < xnumel"]
        out += _unravel("xindex", k.outer_vars, k.outer_ranges)
        if self.reduction and self.persistent:
            out += ["rindex = tl.arange(0, RBLOCK)[None, :]", "rmask = rindex < rnumel"]
            out += _unravel("rindex", k.inner_vars, k.inner_ranges)
        return self.walk_stages(out, {}, separator=("",))

    # -- the stage walk's hooks (codegen/common.py) --------------------------------------------
    def ops(self, lines: list, known: dict) -> TritonOps:
        return TritonOps(self, lines, known)

    def store_or_keep(self, ops, n, value, known, level_groups=frozenset({"x"})):
        """Store ``n``'s value (masked by the loop groups it is computed at), and remember it."""
        where = self.k.store_index(n)
        known[n.name] = (where, value)
        if n.name in self.k.local:
            return
        groups = self.index_groups(where)
        index = _R.render(where)
        for g in sorted(set(level_groups) - groups):  # a broadcast store still needs one pointer per lane
            index = f"{index} + 0 * {g}index"
        value_text = str(value)
        if value.dtype != n.dtype or not value.groups:
            value_text = f"{_as_tensor(value)}.to({TL[n.dtype]})"
        mask = self.mask(level_groups)
        ptr = self.pointer(n.name)
        ops.lines.append(f"tl.store({ptr} + ({index}), {value_text}, {mask})")
        self.written.add(n.name)
        for key in [k for k in ops.cse if k[0].startswith(f"tl.load({ptr} +")]:
            del ops.cse[key]  # the memory changed under that load

    def loop(self, stage, known) -> list:
        """One stage over the row: in registers (persistent), or a loop of RBLOCK-wide steps."""
        k = self.k
        reds = reductions_of(stage.nodes)
        pre, inner, post = [], [], []
        accs = {}
        for n in reds:
            kind, dt = n.data.reduction_type, self.acc_dtype(n)
            acc = f"acc{next(self.counter)}"
            accs[n.name] = (acc, dt)
            if not self.persistent:
                pre.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {self.identity(kind, dt)}, {TL[dt]})")
                if kind in ARG_REDUCTIONS:
                    pre.append(f"{acc}_index = tl.full([XBLOCK, RBLOCK], {INT32_LIMIT}, tl.int64)")
        loop_known = dict(known)
        # an empty row reads nothing, even where the index does not depend on the row
        ops = TritonOps(self, inner, loop_known, mask_groups=frozenset({"r"}) if self.rnumel == 0 else frozenset())
        if not self.persistent:
            inner += ["rindex = roffset + tl.arange(0, RBLOCK)[None, :]", "rmask = rindex < rnumel"]
            inner += _unravel("rindex", k.inner_vars, k.inner_ranges)
        for n in stage.nodes:
            v = self.evaluate(ops, n)
            if not isinstance(n.data, Reduction):
                self.store_or_keep(ops, n, v, loop_known, {"x", "r"})
                continue
            acc, dt = accs[n.name]
            kind = n.data.reduction_type
            lanes = f"tl.where(xmask & rmask, {v}, {self.identity(kind, dt)})"
            if v.dtype != dt:
                lanes = f"tl.where(xmask & rmask, {_as_tensor(v)}.to({TL[dt]}), {self.identity(kind, dt)})"
            if self.persistent:
                inner.append(f"{acc} = {lanes}")
                result = self._finish(kind, acc, dt, inner, "rindex")
            else:
                if kind == "sum":
                    inner.append(f"{acc} = {acc} + {lanes}")
                elif kind in ARG_REDUCTIONS:
                    inner.append(f"{acc}_next, {acc}_index_next = {self.combine(kind)}({acc}, {acc}_index, {lanes}, "
                                 f"rindex.to(tl.int64))")
                    inner.append(f"{acc} = tl.where(xmask & rmask, {acc}_next, {acc})")
                    inner.append(f"{acc}_index = tl.where(xmask & rmask, {acc}_index_next, {acc}_index)")
                else:
                    inner.append(f"{acc} = tl.where(xmask & rmask, {self.combine(kind)}({acc}, {lanes}), {acc})")
                result = self._finish(kind, acc, dt, post, f"{acc}_index")
            out_dt = torch.int64 if kind in ARG_REDUCTIONS else compute_dtype(n.dtype)
            if out_dt != dt and kind not in ARG_REDUCTIONS:
                result = f"{result}.to({TL[out_dt]})"
            target = inner if self.persistent else post
            self.store_or_keep(self.ops(target, known), n, TV(result, out_dt, frozenset({"x"})), known)
        if self.persistent:
            # the whole row is in registers: later stages reuse this stage's row values
            known.update({name: kv for name, kv in loop_known.items() if name not in known})
            return pre + inner + post
        loop = ["for roffset in range(0, rnumel, RBLOCK):"] + ["    " + ln for ln in inner]
        return pre + loop + post

    def _finish(self, kind, acc, dt, lines, index_lanes) -> str:
        """Reduce lanes ``acc`` across the row; returns the ``[XBLOCK, 1]`` result's name."""
        res = f"{acc}_row"
        if kind in ARG_REDUCTIONS:
            idx = index_lanes if index_lanes != "rindex" else "tl.broadcast_to(rindex.to(tl.int64), [XBLOCK, RBLOCK])"
            lines.append(f"_, {res} = tl.reduce(({acc}, {idx}), 1, {self.combine(kind)})")
            lines.append(f"{res} = {res}[:, None]")
        else:
            lines.append(f"{res} = tl.reduce({acc}, 1, {self.combine(kind)})[:, None]")
        return res


def _unravel(flat: str, variables, ranges) -> list:
    """``x0 = xindex % 16``, ``x1 = xindex // 16``: a flat index into the kernel's loop variables."""
    out, stride = [], 1
    items = list(zip(variables, ranges))
    for pos, (v, size) in enumerate(reversed(items)):
        outermost = pos == len(items) - 1
        expr = flat if stride == 1 else f"({flat} // ({_size(stride)}))"
        if not outermost:
            expr = f"{expr} % ({_size(size)})"
        out.append(f"{v.name} = {expr}")
        stride = size_value(Expr.of(size) * stride) if isinstance(size, Expr) else stride * max(size, 1)
    return out


def _size(n) -> str:
    """A size in the kernel: a literal, or an expression over its size arguments."""
    return str(n) if isinstance(n, int) else _R.render(n)


class TritonBackend:
    """Triton: every kernel of a graph in one Python module, launched by runtime/triton_launch.py."""
    name = "triton"
    # The wrapper passes tensors (Triton takes their data pointers); no row scratch: a
    # persistent row is in registers anyway, a looped one re-reads memory.
    # flex_attention's kernel is float32 only here ("flex_attention_narrow" left out: bfloat16/float16
    # stay the eager call): its tiles' tl.dot in a narrow dtype has not run on a GPU, only the interpreter.
    caps = BackendCaps(row_scratch=False, pass_pointers=False, templates=frozenset({"flex_attention"}))

    def generate(self, graph, plan) -> GeneratedKernels:
        """The prelude, one kernel per FusedKernel, and LAUNCH (grid metadata)."""
        buffers = graph.by_name
        parts, args, launch = ["# minicompile: Triton kernels for one graph", PRELUDE], {}, {}
        symbols = tuple(graph.symbols)
        first_of = {}
        for kernel in plan.kernels:
            tk = TritonKernel(kernel, buffers, graph.mutations, graph.sources, symbols)
            source = tk.render()
            args[kernel.name] = [a.name for a in tk.args] + tk.size_args
            first = first_of.setdefault(code_key(tk.code_lines, args[kernel.name]), kernel.name)
            if first != kernel.name:   # a repeated layer's kernel: Triton compiles it once (codegen/same_code.py)
                source = "\n".join(tk.header() + [f"{kernel.name} = {first}  # the same code as {first}, on this kernel's buffers"])
            parts += ["", source, ""]
            extent = lambda n: n if isinstance(n, int) else str(n)  # noqa: E731 - Python source over the sizes
            launch[kernel.name] = {"xnumel": extent(tk.xnumel), "rnumel": extent(tk.rnumel) if tk.reduction else None,
                                   "persistent": tk.persistent, "written": [a.name for a in tk.args if a.written]}
        for t in plan.templates:   # whole kernels of their own (codegen/triton_flex.py), on a fixed grid
            source, args[t.name], launch[t.name] = render_flex_triton(t.name, t.buffer)
            parts += ["", source, ""]
        parts.append("")
        parts.append("# kernel -> what the launcher needs: rows/elements, reduced extent, and the arguments it writes")
        parts.append("LAUNCH = {")
        parts += [f"    {name!r}: {meta!r}," for name, meta in launch.items()]
        parts.append("}")
        devices = {b.layout.device.type for b in buffers.values() if b.layout is not None}
        return GeneratedKernels("\n".join(parts) + "\n", args, "python", interpret="cuda" not in devices)

    def load(self, generated: GeneratedKernels):
        if not generated.kernel_args:
            return None
        return load_triton(generated.source, generated.kernel_args, generated.interpret)
