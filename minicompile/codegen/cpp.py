"""C++ code generation: every kernel of a graph in one translation unit.

Each FusedKernel becomes an ``extern "C"`` function over raw pointers. Outer loops run on
OpenMP threads; innermost loops are written so the compiler can vectorise them (unit
stride, ``omp simd`` where iterations are independent). Loop bodies are rendered by running
the IR's body functions against CppOps, which emits one typed temporary per value.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch

from minicompile.codegen.cpp_ops import CTYPE, CppRenderer, literal, template
from minicompile.codegen.cpp_prelude import PRELUDE
from minicompile.config import config
from minicompile.ir.expr import Expr, Indirect, atoms_of
from minicompile.ir.nodes import Reduction
from minicompile.ir.ops import compute_dtype
from minicompile.scheduler.kernel import flat_of

_R = CppRenderer()
TRIG_ROW = 4096  # elements per range check of the inline sin/cos in a flat loop
_FAST_TRIG = re.compile(r"\bmc_(sin|cos)_fast\(")


@dataclass
class CV:
    """A C++ value: an expression (usually a temporary's name) and its compute dtype."""
    expr: str
    dtype: torch.dtype

    def __str__(self):
        return self.expr


@dataclass
class CppOps:
    """Emits C++ statements for a loop body into ``lines``; values are CV."""
    buffers: dict                         # name -> Buffer
    storage: dict                         # buffer name -> pointer name
    locals: dict                          # buffer name -> (index Expr, CV) computed in-kernel
    lines: list = field(default_factory=list)
    counter: list = field(default_factory=lambda: [0])
    cse: dict = field(default_factory=dict)
    scratch: dict = field(default_factory=dict)  # buffer name -> "row array[flat inner index]"
    invariant: set = field(default_factory=set)  # values computed outside the current loop
    constants: set = field(default_factory=set)  # values known when the kernel is generated
    # None: sin/cos through the library. A list: inline mc_sin_fast/mc_cos_fast, and their
    # arguments are collected here so the loop can check them against MC_TRIG_MAX
    trig_args: list | None = None
    # Loop-invariant code motion (see CppKernel.hoisted): statements computed once before the
    # kernel's loops go to ``hoisted``; ``read_only`` are the pointers a hoisted load may read;
    # ``outside`` the values so computed. None: compute everything where it is used.
    hoisted: list | None = None
    read_only: set = field(default_factory=set)
    outside: set = field(default_factory=set)

    def _tmp(self, ctype_dtype: torch.dtype, expr: str, hoist: bool = False) -> CV:
        key = (expr, ctype_dtype)
        if key in self.cse:
            return self.cse[key]
        name = f"tmp{self.counter[0]}"
        self.counter[0] += 1
        (self.hoisted if hoist else self.lines).append(f"{CTYPE[ctype_dtype]} {name} = {expr};")
        value = CV(name, ctype_dtype)
        self.cse[key] = value
        if hoist:
            self.outside.add(name)
        return value

    def _hoistable(self, *args) -> bool:
        """Computed from hoisted values and literals only, with at least one hoisted value."""
        return (self.hoisted is not None and any(a.expr in self.outside for a in args)
                and all(a.expr in self.outside or a.expr in self.constants for a in args))

    def load(self, name, index, dtype):
        if name in self.locals:
            where, value = self.locals[name]
            assert where == index, f"local {name} read at {index}, written at {where}"
            return value
        if name in self.scratch:
            return self._tmp(compute_dtype(dtype), self.scratch[name])
        ptr = self.storage.get(name, name)
        raw = f"{ptr}[{_R.render(index)}]"
        if dtype == torch.bfloat16:
            raw = f"mc_bf16_to_f32({raw})"
        elif dtype == torch.float16:
            raw = f"static_cast<float>({raw})"
        hoist = self.hoisted is not None and ptr in self.read_only and not atoms_of(index)
        return self._tmp(compute_dtype(dtype), raw, hoist)

    def constant(self, value, dtype):
        value = CV(literal(value, compute_dtype(dtype)), compute_dtype(dtype))
        self.invariant.add(value.expr)
        self.constants.add(value.expr)
        return value

    def _same_every_iteration(self, result: CV, *args) -> CV:
        """A value computed only from loop invariants is one too (the divisor of a masked softmax)."""
        if all(a.expr in self.invariant for a in args):
            self.invariant.add(result.expr)
            if all(a.expr in self.constants for a in args):
                self.constants.add(result.expr)
        return result

    def index_expr(self, expr, dtype):
        return self._tmp(dtype, f"static_cast<{CTYPE[dtype]}>({_R.render(expr)})")

    def to_dtype(self, x, dtype):
        hoist = self._hoistable(x)
        if dtype == torch.bfloat16:
            return self._tmp(torch.float32, f"mc_round_bf16(static_cast<float>({x}))", hoist)
        if dtype == torch.float16:
            return self._tmp(torch.float32, f"mc_round_f16(static_cast<float>({x}))", hoist)
        if x.dtype == dtype:
            return x
        if x.dtype.is_floating_point and dtype in (torch.int32, torch.int64):
            return self._same_every_iteration(self._tmp(dtype, f"mc_f2i<{CTYPE[dtype]}>({x})", hoist), x)
        return self._same_every_iteration(self._tmp(dtype, f"static_cast<{CTYPE[dtype]}>({x})", hoist), x)

    def pointwise(self, op, *args, dtype):
        operand = args[1].dtype if op == "where" else args[0].dtype
        if self._hoistable(*args):  # (sin/cos through the library: the row redo would not reach it)
            expr = template(op, operand).format(*args)
            return self._same_every_iteration(self._tmp(compute_dtype(dtype), expr, hoist=True), *args)
        # (not for a compile-time constant: x * (1/3) is not x / 3, and eager divides there)
        if (op == "truediv" and args[1].expr in self.invariant and args[1].expr not in self.constants
                and compute_dtype(dtype).is_floating_point):
            # a per-row divisor (softmax's sum): multiply by its reciprocal, which the compiler
            # hoists out of the loop, as eager's softmax does; vector division is ~10x slower
            return self._tmp(compute_dtype(dtype), f"({args[0]} * (1 / {args[1]}))")
        if op in ("sin", "cos") and self.trig_args is not None and compute_dtype(dtype) == torch.float32:
            self.trig_args.append(args[0].expr)
            return self._same_every_iteration(self._tmp(torch.float32, f"mc_{op}_fast({args[0]})"), *args)
        return self._same_every_iteration(self._tmp(compute_dtype(dtype), template(op, operand).format(*args)), *args)

    def indirect(self, x, size):
        v = self._tmp(torch.int64, f"{x} < 0 ? {x} + {size} : {x}")
        return Expr.of(Indirect(v.expr, size))


# -- reductions ---------------------------------------------------------------------------

SIMD_CLAUSE = {"sum": "+", "prod": "*", "any": "||", "all": "&&"}


def _acc_dtype(node) -> torch.dtype:
    dt = compute_dtype(node.dtype)
    if node.data.reduction_type in ("sum", "prod") and dt == torch.float32 and _numel(node.data.reduction_ranges) > 8192:
        return torch.float64  # long float32 sums keep eager's accuracy only in double
    if node.data.reduction_type in ("argmax", "argmin"):
        return compute_dtype(node.data.src_dtype)
    return dt


def _init(kind, dtype):
    if kind == "sum" or kind == "any":
        return literal(0, dtype)
    if kind in ("prod", "all"):
        return literal(1, dtype)
    big = float("inf") if dtype.is_floating_point else None
    if kind in ("max", "argmax"):
        return literal(-big, dtype) if big else f"std::numeric_limits<{CTYPE[dtype]}>::lowest()"
    return literal(big, dtype) if big else f"std::numeric_limits<{CTYPE[dtype]}>::max()"


def _combine(kind, acc, v):
    return {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}", "max": f"mc_max({acc}, {v})",
            "min": f"mc_min({acc}, {v})", "any": f"{acc} || {v}", "all": f"{acc} && {v}"}[kind]


def _numel(ranges) -> int:
    n = 1
    for r in ranges:
        n *= int(r)
    return n


class CppKernel:
    """Renders one FusedKernel to a C++ function."""

    def __init__(self, kernel, buffers: dict, storage: dict, sources: dict):
        self.k = kernel
        self.buffers = buffers
        self.storage = storage
        self.sources = sources
        self.counter = [0]
        # Loop-invariant code motion: a load at a fixed index of a buffer this kernel does not
        # write (a 0-d tensor: Adam's step, a scale) and everything computed from such loads and
        # literals runs once, before the loops, not per element: g++ cannot hoist it (any store
        # may alias the load), and AdamW's bias corrections (two pow, a sqrt, divisions) per
        # element made its update 10x slower than the memory traffic. Off for a kernel with an
        # empty loop, where such a load may be of an empty buffer.
        self.hoisted: list | None = [] if 0 not in (*kernel.outer_ranges, *kernel.inner_ranges) else None
        self.outside: set = set()

    @functools.cached_property
    def _memory(self) -> dict:
        """pointer name -> [dtype, read, written] for every buffer the kernel touches in memory."""
        k, seen = self.k, {}
        for n in k.nodes:
            for r in k.reads(n):
                if r.name not in k.local and r.name not in k.scratch:
                    seen.setdefault(self.storage.get(r.name, r.name), [self.buffers[r.name].dtype, False, False])[1] = True
            if n.name not in k.local and n.name not in k.scratch:
                seen.setdefault(self.storage.get(n.name, n.name), [n.dtype, False, False])[2] = True
        return seen

    def args(self):
        """(pointer name, dtype, written) for every buffer the kernel touches in memory."""
        return [(p, dt, w) for p, (dt, _, w) in self._memory.items()]

    def _ops(self, locals_, lines, **kwargs) -> CppOps:
        read_only = {p for p, (_, _, written) in self._memory.items() if not written}
        return CppOps(self.buffers, self.storage, locals_, lines, self.counter, scratch=self.scratch,
                      hoisted=self.hoisted, read_only=read_only, outside=self.outside, **kwargs)

    def render(self) -> str:
        k = self.k
        params = ", ".join(f"{'' if w else 'const '}{CTYPE[dt]}* {p}" for p, dt, w in self.args())
        origins = []
        for n in k.nodes:
            origins += n.origins
        lines = [f"// {k.name}: fuses FX nodes {', '.join(dict.fromkeys(origins))}"]
        for o in dict.fromkeys(origins):
            if o in self.sources:
                lines.append(f"//   {o}: {self.sources[o]}")
        lines.append(f'extern "C" void {k.name}({params})')
        lines.append("{")
        body = self._outer()
        lines += ["    " + ln for ln in body]
        lines.append("}")
        return "\n".join(lines)

    # -- loops ------------------------------------------------------------------------------
    def _outer(self) -> list:
        k = self.k
        if k.outer_numel == 0:
            return ["// empty output: nothing to compute"]
        work = k.outer_numel * max(k.inner_numel, 1)
        inner_parallel = (k.is_reduction and k.outer_numel == 1 and work >= config.parallel_threshold
                          and all(n.data.reduction_type in SIMD_CLAUSE or n.data.reduction_type in ("max", "min")
                                  for n in k.nodes if isinstance(n.data, Reduction)))
        # inline sin/cos need a redo of the row when an argument is out of their range, which is
        # only sound when the loop has no accumulators and writes no buffer it reads
        dims = list(zip(k.outer_vars, k.outer_ranges))
        in_place = any(r and w for _, r, w in self._memory.values())
        trig_args = [] if dims and not k.is_reduction and not in_place else None
        body = self._point_body(inner_parallel, trig_args)
        hoisted = self.hoisted or []
        if not dims:
            return hoisted + body
        parallel = work >= config.parallel_threshold and not inner_parallel
        simd_inner = not k.is_reduction
        headers = []
        for d, (v, size) in enumerate(dims):
            hdr = []
            if d == 0 and parallel:
                collapse = 1
                if size < 64 and len(dims) > 1:
                    collapse = len(dims) - 1 if simd_inner else len(dims)
                simd = " simd" if simd_inner and len(dims) == 1 else ""  # a flat loop: threads and lanes
                hdr.append("#pragma omp parallel for" + simd + (f" collapse({collapse})" if collapse > 1 else ""))
            elif d == len(dims) - 1 and simd_inner:
                hdr.append("#pragma omp simd")
            hdr.append(f"for (int64_t {v.name} = 0; {v.name} < {size}; ++{v.name})")
            headers.append(hdr)
        if trig_args:
            return hoisted + self._rows_with_trig_check(headers, dims, body, parallel, trig_args)
        return hoisted + _nest(headers, body)

    def _rows_with_trig_check(self, headers, dims, body, parallel, trig_args) -> list:
        """The innermost loop with inline sin/cos: it ORs together "an argument was beyond
        MC_TRIG_MAX" and, when one was, runs the row again with the library's sin/cos (which
        rewrites every element of the row, so it needs the loop to be a pure map). A flat loop
        is cut into rows of TRIG_ROW elements for this."""
        v, size = dims[-1]
        if len(dims) == 1:
            start = f"{v.name}_row"
            pragma = ["#pragma omp parallel for"] if parallel else []
            headers = [pragma + [f"for (int64_t {start} = 0; {start} < {size}; {start} += {TRIG_ROW})"]]
            lo, hi = start, f"std::min<int64_t>({start} + {TRIG_ROW}, {size})"
        else:
            headers, lo, hi = headers[:-1], "0", str(size)
        checks = [f"mc_big |= (std::fabs({a}) > MC_TRIG_MAX);" for a in dict.fromkeys(trig_args)]
        library = [_FAST_TRIG.sub(r"std::\1(", ln) for ln in body]
        loop = f"for (int64_t {v.name} = {lo}; {v.name} < {hi}; ++{v.name})"
        row = ["int mc_big = 0;", "#pragma omp simd reduction(|:mc_big)", loop, "{"]
        row += ["    " + ln for ln in body + checks]
        row += ["}", "if (mc_big)  // some |x| beyond MC_TRIG_MAX: the row again, with the library's sin/cos", loop, "{"]
        row += ["    " + ln for ln in library]
        row.append("}")
        return _nest(headers, row)

    def _point_body(self, inner_parallel: bool, trig_args: list | None) -> list:
        """Statements for one outer point: the stages in order. ``trig_args``: see CppOps."""
        k = self.k
        lines, locals_ = [], {}
        flat = _R.render(flat_of(k.inner_vars, k.inner_ranges))
        self.scratch = {}
        taken = set()
        for n in k.nodes:
            if n.name in k.scratch:  # a row computed in one loop and read by a later one
                dt = compute_dtype(n.dtype)
                row = self._output_row(n, taken)
                if row:
                    lines.append(f"{CTYPE[dt]}* {n.name}_row = {row};  // the output row, written over in place")
                else:
                    lines.append(f"{CTYPE[dt]} {n.name}_row[{k.inner_numel}];")
                self.scratch[n.name] = f"{n.name}_row[{flat}]"
        for stage in k.stages:
            if stage.kind == "scalar":
                ops = self._ops(locals_, lines, trig_args=trig_args)
                for n in stage.nodes:
                    index, _ = k.node_index(n)
                    value = n.data.body(ops, index)
                    self._store_or_keep(ops, n, value, locals_)
            else:
                lines += self._loop(stage, locals_, inner_parallel)
        return lines

    def _output_row(self, n, taken: set) -> str | None:
        """Where scratch row ``n`` can live in an output row instead of its own array, or None.

        Softmax's exp row is then written straight into the output and scaled there: the
        output's cache lines are fetched while exp computes, not in the last loop, which
        took 4096x1024 from 1.47 to 1.09 ms. The output must be the last node that reads
        ``n`` (in the last loop reading it), so every read of an element, CSE'd into one
        load at the top of the loop body, comes before the store over it; of the same compute
        type; stored contiguously along the row; and not read by this kernel at all."""
        k = self.k
        stage_of = {m.name: i for i, st in enumerate(k.stages) for m in st.nodes}
        readers = {m.name for m in k.nodes if any(r.name == n.name for r in k.reads(m))}
        if not readers:
            return None
        last = max(stage_of[name] for name in readers)
        o = [m for m in k.stages[last].nodes if m.name in readers][-1]
        ptr = self.storage.get(o.name, o.name)
        if (o.name in k.local or o.name in k.scratch or ptr in taken or self._memory[ptr][1]
                or CTYPE.get(o.dtype) != CTYPE[compute_dtype(n.dtype)] or k.stages[last].kind != "loop"):
            return None
        base = k.store_index(o) - flat_of(k.inner_vars, k.inner_ranges)
        if atoms_of(base) & set(k.inner_vars):
            return None
        taken.add(ptr)
        return f"{ptr} + ({_R.render(base)})"

    def _store_or_keep(self, ops, n, value, locals_):
        where = self.k.store_index(n)
        if n.name in self.k.local:
            locals_[n.name] = (where, value)
        elif n.name in self.k.scratch:
            ops.lines.append(f"{self.scratch[n.name]} = {value};")
            locals_[n.name] = (where, value)  # readers in this same loop use the register
        else:
            ptr = self.storage.get(n.name, n.name)
            ops.lines.append(f"{ptr}[{_R.render(where)}] = {_store_cast(value, n.dtype)};")

    def _loop(self, stage, locals_, inner_parallel) -> list:
        k = self.k
        reds = [n for n in stage.nodes if isinstance(n.data, Reduction)]
        pre, post, accs = [], [], {}
        for n in reds:
            kind, dt = n.data.reduction_type, _acc_dtype(n)
            acc = f"acc{self.counter[0]}"
            self.counter[0] += 1
            accs[n.name] = (acc, dt)
            pre.append(f"{CTYPE[dt]} {acc} = {_init(kind, dt)};")
            if kind in ("argmax", "argmin"):
                pre.append(f"int64_t {acc}_idx = 0;")
            if kind in ("max", "min") and dt.is_floating_point and not inner_parallel:
                pre.append(f"int {acc}_nan = 0;")
                post.append(f"if ({acc}_nan) {acc} = std::numeric_limits<{CTYPE[dt]}>::quiet_NaN();")
        inner_lines = []
        loop_locals = dict(locals_)
        ops = self._ops(loop_locals, inner_lines, invariant={v.expr for _, v in locals_.values()})
        for n in stage.nodes:
            index, rindex = k.node_index(n)
            if isinstance(n.data, Reduction):
                v = n.data.body(ops, index, rindex)
                acc, dt = accs[n.name]
                acc = f"{acc}_part" if inner_parallel else acc
                kind = n.data.reduction_type
                v = f"static_cast<{CTYPE[dt]}>({v})"
                if kind in ("argmax", "argmin"):
                    flat = _R.render(flat_of(k.inner_vars, k.inner_ranges))
                    better = ">" if kind == "argmax" else "<"
                    inner_lines.append(f"{{ {CTYPE[dt]} v = {v}; if ({acc} == {acc} && (v {better} {acc} || v != v)) "
                                       f"{{ {acc} = v; {acc}_idx = {flat}; }} }}")
                elif kind in ("max", "min") and not inner_parallel:
                    # plain compare-select vectorises (omp max/min); a NaN is tracked on the side
                    tmp = ops._tmp(dt, v)
                    cmp = ">" if kind == "max" else "<"
                    inner_lines.append(f"{acc} = {acc} {cmp} {tmp} ? {acc} : {tmp};")
                    if dt.is_floating_point:
                        inner_lines.append(f"{acc}_nan |= ({tmp} != {tmp});")
                else:
                    inner_lines.append(f"{acc} = {_combine(kind, acc, v)};")
            else:
                value = n.data.body(ops, index)
                self._store_or_keep(ops, n, value, loop_locals)
        # after the loop: reduction results become per-row values (and stores)
        for n in reds:
            acc, dt = accs[n.name]
            result = CV(f"{acc}_idx" if n.data.reduction_type in ("argmax", "argmin") else acc,
                        torch.int64 if n.data.reduction_type in ("argmax", "argmin") else dt)
            if dt != compute_dtype(n.dtype) and n.data.reduction_type not in ("argmax", "argmin"):
                result = CV(f"static_cast<{CTYPE[compute_dtype(n.dtype)]}>({acc})", compute_dtype(n.dtype))
            where = k.store_index(n)
            if n.name in k.local:
                locals_[n.name] = (where, result)
            else:
                ptr = self.storage.get(n.name, n.name)
                post.append(f"{ptr}[{_R.render(where)}] = {_store_cast(result, n.dtype)};")
        simd = all(n.data.reduction_type in SIMD_CLAUSE or n.data.reduction_type in ("max", "min") for n in reds)
        clauses = []
        for n in reds:
            acc, dt = accs[n.name]
            kind = n.data.reduction_type
            if kind in SIMD_CLAUSE:
                clauses.append(f"reduction({SIMD_CLAUSE[kind]}:{acc})")
            elif kind in ("max", "min"):
                clauses.append(f"reduction({kind}:{acc})")
                if dt.is_floating_point:
                    clauses.append(f"reduction(|:{acc}_nan)")
        clause = " ".join(clauses)
        if inner_parallel:
            return pre + self._parallel_inner(reds, accs, inner_lines) + post
        headers = []
        dims = list(zip(k.inner_vars, k.inner_ranges))
        for d, (v, size) in enumerate(dims):
            hdr = [f"#pragma omp simd {clause}".rstrip()] if d == len(dims) - 1 and simd else []
            hdr.append(f"for (int64_t {v.name} = 0; {v.name} < {size}; ++{v.name})")
            headers.append(hdr)
        return pre + _nest(headers, inner_lines) + post

    def _parallel_inner(self, reds, accs, inner_lines) -> list:
        """One row, many threads: per-thread partial results combined at the end."""
        k = self.k
        out = ["#pragma omp parallel", "{"]
        for n in reds:
            acc, dt = accs[n.name]
            out.append(f"    {CTYPE[dt]} {acc}_part = {_init(n.data.reduction_type, dt)};")
        flat_var = "rflat"
        out.append("    #pragma omp for nowait")
        out.append(f"    for (int64_t {flat_var} = 0; {flat_var} < {k.inner_numel}; ++{flat_var})")
        out.append("    {")
        rest = k.inner_numel
        for v, size in zip(k.inner_vars, k.inner_ranges):
            rest //= size
            out.append(f"        const int64_t {v.name} = ({flat_var} / {rest}) % {size};")
        out += ["        " + ln for ln in inner_lines]
        out.append("    }")
        out.append("    #pragma omp critical")
        out.append("    {")
        for n in reds:
            acc, _ = accs[n.name]
            out.append(f"        {acc} = {_combine(n.data.reduction_type, acc, acc + '_part')};")
        out.append("    }")
        out.append("}")
        return out


def _store_cast(value: CV, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"mc_f32_to_bf16(static_cast<float>({value}))"
    if dtype == torch.float16:
        return f"static_cast<_Float16>({value})"
    if value.dtype == dtype:
        return str(value)
    return f"static_cast<{CTYPE[dtype]}>({value})"


def _nest(headers: list, body: list) -> list:
    """Nested loops: ``headers[d]`` holds loop d's pragma and for-line."""
    out = []
    for d, hdr in enumerate(headers):
        out += ["    " * d + h for h in hdr] + ["    " * d + "{"]
    out += ["    " * len(headers) + b for b in body]
    for d in reversed(range(len(headers))):
        out.append("    " * d + "}")
    return out


def generate_cpp(schedule, buffers: dict, storage: dict, sources: dict) -> str:
    """The whole translation unit: prelude plus one function per kernel."""
    parts = [PRELUDE.strip(), ""]
    for kernel in schedule.kernels:
        parts.append(CppKernel(kernel, buffers, storage, sources).render())
        parts.append("")
    return "\n".join(parts)
