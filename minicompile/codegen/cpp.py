"""C++ code generation: every kernel of a graph in one translation unit.

Each FusedKernel becomes an ``extern "C"`` function over raw pointers. Outer loops run on
OpenMP threads; innermost loops are written so the compiler can vectorise them (unit
stride, ``omp simd`` where iterations are independent). Loop bodies are rendered by running
the IR's body functions against CppOps, which emits one typed temporary per value. The
helpers they call (bfloat16 rounding, mc_exp, the inline sin/cos) are in
runtime/include/minicompile_prelude.h, which the translation unit includes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator

import torch

from minicompile.codegen.cpp_channels import ChannelValues
from minicompile.codegen.cpp_columns import render_columns
from minicompile.codegen.common import ARG_REDUCTIONS, INDEX_FAULT, GeneratedKernels, KernelRenderer, reductions_of
from minicompile.codegen.cpp_loops import nest
from minicompile.codegen.cpp_ops import CTYPE, REDUCTIONS, CppRenderer, checked_index, literal, template
from minicompile.codegen.cpp_flex import render_flex
from minicompile.codegen.same_code import code_key, cpp_forwarder
from minicompile.codegen.cpp_pieces import table_loop
from minicompile.codegen.cpp_plan import KernelPlan, Planned, plan_kernel
from minicompile.codegen.cpp_sums import blocked_loop, blocked_names, partials
from minicompile.config import config
from minicompile.ir.expr import Expr, atoms_of
from minicompile.ir.flex import SCORE, SCORE_INDEX
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import Reduction, is_static
from minicompile.ir.ops import compute_dtype
from minicompile.runtime.cpp_build import PRELUDE_HEADER, load as load_cpp, start_load
from minicompile.scheduler.caps import BackendCaps
from minicompile.scheduler.fusion import Schedule
from minicompile.scheduler.kernel import flat_of

_R = CppRenderer()
TRIG_ROW = 4096  # elements per range check of the inline sin/cos in a flat loop


@dataclass
class CV:
    """A C++ value: an expression (usually a temporary's name) and its compute dtype."""
    expr: str
    dtype: torch.dtype

    def __str__(self):
        return self.expr


@dataclass
class CppOps:
    """Emits C++ statements for a loop body into ``lines``; values are CV. Where each value goes
    (before the loops, a per-channel array, before this loop, in it) and how a division or a
    sin/cos is spelled is the kernel's plan (cpp_plan.py): ``planned`` yields it per ops call."""
    storage: dict                         # buffer name -> pointer name
    locals: dict                          # buffer name -> (index Expr, CV) computed in-kernel
    lines: list = field(default_factory=list)
    counter: Iterator[int] = field(default_factory=itertools.count)  # the kernel's, shared by its handlers
    cse: dict = field(default_factory=dict)
    scratch: dict = field(default_factory=dict)  # buffer name -> "row array[flat inner index]"
    hoisted: list | None = None       # kernel-level statements: before the kernel's loops
    before_loop: list | None = None   # row-level statements: before this loop, once per outer point
    channel: ChannelValues | None = None   # channel-level values: arrays filled before the loops
    trig_args: list | None = None     # the inline sin/cos's arguments, checked against MC_TRIG_MAX
    # inline sin/cos: index in ``lines`` -> the statement with the library's, for the row's redo
    redo: dict = field(default_factory=dict)
    planned: Iterator = iter(())
    piece: tuple | None = None        # in a loop over a pointer table: (the piece's buffer, its index's substitution)

    def _tmp(self, ctype_dtype: torch.dtype, expr: str, step=None) -> CV:
        key = (expr, ctype_dtype)
        if key in self.cse:
            return self.cse[key]
        level = step.level if step is not None else "element"
        if level == "channel":
            self.cse[key] = value = CV(self.channel.add(step.var, f"tmp{next(self.counter)}", CTYPE[ctype_dtype], expr),
                                       ctype_dtype)
            return value
        name = f"tmp{next(self.counter)}"
        target = self.hoisted if level == "kernel" else self.before_loop if level == "row" else self.lines
        target.append(f"{CTYPE[ctype_dtype]} {name} = {expr};")
        value = CV(name, ctype_dtype)
        self.cse[key] = value
        return value

    def load(self, name, index, dtype):
        index = checked_index(self, index)
        step = next(self.planned)
        if name in self.locals:
            where, value = self.locals[name]
            assert where == index, f"local {name} read at {index}, written at {where}"
            return value
        if name in self.scratch:
            return self._tmp(compute_dtype(dtype), self.scratch[name])
        if self.piece is not None and name == self.piece[0]:   # read through the table (cpp_pieces.py)
            raw = f"piece_in[{_R.render(index.substitute(self.piece[1]))}]"
        else:
            raw = f"{self.storage.get(name, name)}[{_R.render(index)}]"
        if dtype == torch.bfloat16:
            raw = f"mc_bf16_to_f32({raw})"
        elif dtype == torch.float16:
            raw = f"static_cast<float>({raw})"
        if step.level == "channel":   # read where used: in its filling loop and the kernel's
            return CV(raw, compute_dtype(dtype))
        return self._tmp(compute_dtype(dtype), raw, step)

    def constant(self, value, dtype):
        next(self.planned)
        return CV(literal(value, compute_dtype(dtype)), compute_dtype(dtype))

    def index_expr(self, expr, dtype):
        expr = checked_index(self, expr)
        next(self.planned)
        return self._tmp(dtype, _cast(CV(_R.render(expr), torch.int64), dtype))  # indices are int64_t

    def to_dtype(self, x, dtype):
        step = next(self.planned)
        if step.level == "same":   # (a bfloat16 value rounded again, a cast to its own dtype)
            return x
        if dtype in (torch.bfloat16, torch.float16):
            rounding = "mc_round_bf16" if dtype == torch.bfloat16 else "mc_round_f16"
            return self._tmp(torch.float32, f"{rounding}({_cast(x, torch.float32)})", step)
        if x.dtype.is_floating_point and dtype in (torch.int32, torch.int64):
            return self._tmp(dtype, f"mc_f2i<{CTYPE[dtype]}>({x})", step)
        return self._tmp(dtype, f"static_cast<{CTYPE[dtype]}>({x})", step)

    def pointwise(self, op, *args, dtype):
        step = next(self.planned)
        operand = args[1].dtype if op == "where" else args[0].dtype
        if step.form == "reciprocal":
            # a per-row divisor (softmax's sum): multiply by its reciprocal, which the compiler
            # hoists out of the loop, as eager's softmax does; vector division is ~10x slower
            return self._tmp(compute_dtype(dtype), f"({args[0]} * (1 / {args[1]}))", step)
        if step.form == "inline trig":
            self.trig_args.append(args[0].expr)
            fresh = (f"mc_{op}_fast({args[0]})", torch.float32) not in self.cse
            value = self._tmp(torch.float32, f"mc_{op}_fast({args[0]})", step)
            if fresh:
                self.redo[len(self.lines) - 1] = f"float {value} = std::{op}({args[0]});"
            return value
        return self._tmp(compute_dtype(dtype), template(op, operand).format(*args), step)


def mod_ops(counter) -> CppOps:
    """The handler of flex_attention's score_mod and mask_mod bodies (codegen/cpp_flex.py): every
    value where it is used, in the kernel's loop over keys, which names the scaled score SCORE."""
    return CppOps(storage={}, locals={SCORE: (SCORE_INDEX, CV(SCORE, torch.float32))}, counter=counter,
                  planned=itertools.repeat(Planned("flex_attention mod", "element")))


# -- kernels ------------------------------------------------------------------------------

SIMD_CLAUSE = {"sum": "+", "prod": "*", "any": "||", "all": "&&"}  # omp reduction operators


def _vectorisable(kind: str) -> bool:
    """An ``omp simd``/``omp for`` reduction clause exists for this kind (argmax has none)."""
    return kind in SIMD_CLAUSE or kind in ("max", "min")


class CppKernel(KernelRenderer):
    """Renders one FusedKernel to a C++ function."""

    COMMENT = "//"
    REDUCTIONS = REDUCTIONS
    # A float32 sum of more than this many elements keeps a double total fed by float32 partials
    # of at most 32 additions each (cpp_sums.py): eager's accuracy, as eager sums in blocks.
    WIDE_SUMS_ABOVE = 32
    literal = staticmethod(literal)

    def __init__(self, kernel, buffers: dict, storage: dict, sources: dict, symbols=()):
        super().__init__(kernel, buffers, storage, sources)
        k = kernel
        self.arg_of = {a.name: a for a in self.args}
        self.symbols = symbols  # the graph's size symbols; those this kernel names become arguments
        self.static = is_static([k.outer_numel, k.inner_numel])
        self.work = k.outer_numel * (max(k.inner_numel, 1) if self.static else k.inner_numel)
        # one row, many threads: per-thread partial results combined at the end
        self.inner_parallel = (self.static and k.is_reduction and k.outer_numel == 1
                               and self.work >= config.parallel_threshold
                               and all(_vectorisable(n.data.reduction_type) for n in reductions_of(k.nodes)))
        self.read_only = {a.name for a in self.args if not a.written}
        # the plan the scheduler asked for (CppBackend.caps.plan), or made here
        self.plan: KernelPlan = k.values if isinstance(k.values, KernelPlan) else plan_kernel(self)
        self.calls = self.plan.calls   # the plan's calls of the body being spelled (a piece's: _cut_loops)
        self.piece = None              # see CppOps.piece
        self.hoisted: list | None = [] if self.plan.hoist else None   # kernel-level statements
        self.channel = ChannelValues(self.plan.channels) if self.plan.channels else None
        self.trig_args = [] if self.plan.trig else None   # the inline sin/cos's arguments (CppOps)
        self.redo: dict = {}   # see CppOps.redo
        self.scratch = {}  # buffer name -> "row array[flat inner index]", filled by point_body
        # Set by CppBackend for a member of a horizontal group (render_group): a static
        # function whose loop shares the group's parallel region (``omp for ... nowait``).
        self.in_group = False
        self.parallel = False  # whether the outer loop runs on threads (decided by _outer)

    def loop_ops(self, known: dict, lines: list, before_loop: list | None = None, **kwargs) -> CppOps:
        """The ops handler of a stage: ``lines`` its statements, ``before_loop`` (in a loop stage)
        those once per outer point before it; ``known`` the values kept in registers."""
        return CppOps(self.storage, known, lines, self.counter, scratch=self.scratch,
                      hoisted=self.hoisted, before_loop=before_loop, piece=self.piece, **kwargs)

    def evaluate(self, ops, node):
        """``node``'s value, spelled as planned."""
        ops.planned = iter(self.calls[node.name])
        value = super().evaluate(ops, node)
        assert next(ops.planned, None) is None, f"{node.name}: the plan and the body disagree"
        return value

    def render(self) -> str:
        self.body_lines = ["    " + ln for ln in self._outer()]
        named = {sym.name for sym in self.plan.symbols}
        self.size_args = [s for s in self.symbols if s in named]  # passed after the pointers
        self.param_code = [f"{'' if a.written else 'const '}{CTYPE[a.dtype]}* {a.name}" for a in self.args]
        self.param_code += [f"int64_t {s}" for s in self.size_args]
        self.param_code += [f"int64_t* {INDEX_FAULT}"] * self.k.checks_indices()
        return "\n".join(self.header() + self.signature() + ["{"] + self.body_lines + ["}"])

    def param_names(self) -> list:
        """The parameters in order, as the wrapper passes them: buffers, then sizes."""
        return [a.name for a in self.args] + self.size_args + [INDEX_FAULT] * self.k.checks_indices()

    def signature(self) -> list:
        comments = [a.describe() for a in self.args] + ["a size, known at call time"] * len(self.size_args)
        comments += ["out: an index out of bounds (kind, value, dim, size)"] * self.k.checks_indices()
        linkage = "static" if self.in_group else 'extern "C"'  # a group member is called by its group only
        last = len(self.param_code) - 1
        return ([f"{linkage} void {self.k.name}("]
                + [f"    {code}{',' if i < last else ''}  // {comment}"
                   for i, (code, comment) in enumerate(zip(self.param_code, comments))] + [")"])

    # -- loops ------------------------------------------------------------------------------
    def _outer(self) -> list:
        k = self.k
        if k.outer_numel == 0:
            return ["// empty output: nothing to compute"]
        if self.plan.column is not None:   # a reduction over rows, one result per column (cpp_columns.py)
            return render_columns(self, self.plan.column)
        dims = list(zip(k.outer_vars, k.outer_ranges))
        if not dims:
            body = self.point_body()
            return self._hoisted() + body
        # symbolic sizes: threads or not is decided at run time, from the actual amount of work
        parallel = (self.work >= config.parallel_threshold if self.static else True) and not self.inner_parallel
        self.parallel = parallel
        simd_inner = not k.is_reduction
        headers = []
        for d, (v, size) in enumerate(dims):
            hdr = []
            if d == 0 and parallel:
                collapse = 1
                if is_static([size]) and size < 64 and len(dims) > 1:
                    collapse = len(dims) - 1 if simd_inner else len(dims)
                simd = " simd" if simd_inner and len(dims) == 1 else ""  # a flat loop: threads and lanes
                hdr.append(self._threads_pragma(simd + (f" collapse({collapse})" if collapse > 1 else "")))
            elif d == len(dims) - 1 and simd_inner:
                hdr.append("#pragma omp simd")
            hdr.append(f"for (int64_t {v.name} = 0; {v.name} < {_size(size)}; ++{v.name})")
            headers.append(hdr)
        if self.plan.cut is not None:   # a concatenation read: one loop per piece
            tables: list = []
            loops = self._cut_loops(headers, [v for v, _ in dims].index(self.plan.cut), tables)
            return self._hoisted() + tables + loops
        body = self.point_body()
        if self.plan.inline_trig:
            return self._hoisted() + self._rows_with_trig_check(headers, dims, body, parallel)
        return self._hoisted() + nest(headers, body)

    def _hoisted(self) -> list:
        """The statements before the loops, once every body is spelled: kernel-level values, channel arrays."""
        return (self.hoisted or []) + (self.channel.block() if self.channel else [])

    def _cut_loops(self, headers: list, d: int, tables: list) -> list:
        """The nest with loop ``d`` cut at the plan's ranges, each range's body spelled from its own
        plan with the loop variable narrowed to it (cpp_pieces.py): the innermost loop is one loop
        per range, or per run of pieces over a table of their pointers (into ``tables``); an outer
        one, a copy of the nest per range."""
        var, out, k, inner = self.plan.cut, [], 0, d == len(headers) - 1
        runs = {first: (end, buffers) for first, end, buffers in self.plan.runs}
        while k < len(self.plan.pieces):
            piece, calls = self.plan.pieces[k]
            self.narrow, self.calls = {var: Expr.of(piece)}, calls
            if k in runs:
                out += table_loop(self, headers[d][:-1], k, *runs[k], tables)
                k = runs[k][0]
                continue
            loop = headers[d][:-1] + [f"for (int64_t {var.name} = {piece.start}; {var.name} < {piece.size}; ++{var.name})"]
            out += nest([loop] if inner else headers[:d] + [loop] + headers[d + 1:], self.point_body())
            k += 1
        self.narrow, self.calls = {}, self.plan.calls
        return nest(headers[:d], out) if inner else out

    def _threads_pragma(self, clauses: str) -> str:
        """The outer loop's pragma: its own parallel region, or (in a group) a share of the
        group's region with no barrier after it; symbolic sizes decide at run time."""
        if self.in_group:
            return f"#pragma omp for{clauses} schedule(static) nowait"
        at_run_time = "" if self.static else f" if({_size(self.work)} >= {config.parallel_threshold})"
        return f"#pragma omp parallel for{clauses}{at_run_time}"

    def _rows_with_trig_check(self, headers, dims, body, parallel) -> list:
        """The innermost loop with inline sin/cos: it ORs together "an argument was beyond
        MC_TRIG_MAX" and, when one was, runs the row again with the library's sin/cos (which
        rewrites every element of the row, so it needs the loop to be a pure map). A flat loop
        is cut into rows of TRIG_ROW elements for this."""
        v, size = dims[-1]
        if len(dims) == 1:
            start = f"{v.name}_row"
            pragma = [self._threads_pragma("")] if parallel else []
            headers = [pragma + [f"for (int64_t {start} = 0; {start} < {_size(size)}; {start} += {TRIG_ROW})"]]
            lo, hi = start, f"std::min<int64_t>({start} + {TRIG_ROW}, {_size(size)})"
        else:
            headers, lo, hi = headers[:-1], "0", _size(size)
        checks = [f"mc_big |= (std::fabs({a}) > MC_TRIG_MAX);" for a in dict.fromkeys(self.trig_args)]
        library = [self.redo.get(i, ln) for i, ln in enumerate(body)]
        loop = f"for (int64_t {v.name} = {lo}; {v.name} < {hi}; ++{v.name})"
        row = ["int mc_big = 0;", "#pragma omp simd reduction(|:mc_big)", loop, "{"]
        row += ["    " + ln for ln in body + checks]
        row += ["}", "if (mc_big)  // some |x| beyond MC_TRIG_MAX: the row again, with the library's sin/cos", loop, "{"]
        row += ["    " + ln for ln in library]
        row.append("}")
        return nest(headers, row)

    def point_body(self) -> list:
        """Statements for one outer point: the scratch rows, then the stages in order."""
        k = self.k
        lines = []
        flat = _R.render(flat_of(k.inner_vars, k.inner_ranges))
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
        return self.walk_stages(lines, {})

    def _output_row(self, n, taken: set) -> str | None:
        """Where scratch row ``n`` can live in an output row instead of its own array, or None.

        Softmax's exp row is then written straight into the output and scaled there: the
        output's cache lines are fetched while exp computes, not in the last loop
        (docs/benchmarks.md). The output must be the last node that reads
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
        ptr = self.pointer(o.name)
        if (o.name in k.local or o.name in k.scratch or ptr in taken or self.arg_of[ptr].read
                or CTYPE.get(o.dtype) != CTYPE[compute_dtype(n.dtype)] or k.stages[last].kind != "loop"):
            return None
        base = k.store_index(o) - flat_of(k.inner_vars, k.inner_ranges)
        if atoms_of(base) & set(k.inner_vars):
            return None
        taken.add(ptr)
        return f"{ptr} + ({_R.render(base)})"

    # -- the stage walk's hooks (codegen/common.py) --------------------------------------------
    def ops(self, lines: list, known: dict) -> CppOps:
        return self.loop_ops(known, lines, trig_args=self.trig_args, channel=self.channel, redo=self.redo)

    def emit_stage(self, ops, nodes, accs, known) -> None:
        """A stage's body: each reduction accumulates into its ``accs`` entry; each value is
        stored, or kept in ``known`` for the members that read it."""
        for n in nodes:
            value = self.evaluate(ops, n)
            if isinstance(n.data, Reduction):
                self._accumulate(ops, n, value, accs[n.name])
            else:
                self.store_or_keep(ops, n, value, known)

    def store_or_keep(self, ops, n, value, known):
        where = self.k.store_index(n).substitute(self.narrow) if self.narrow else self.k.store_index(n)
        if n.name in self.k.local:
            known[n.name] = (where, value)
        elif n.name in self.k.scratch:
            ops.lines.append(f"{self.scratch[n.name]} = {value};")
            known[n.name] = (where, value)  # readers in this same loop use the register
        else:
            ops.lines.append(f"{self.pointer(n.name)}[{_R.render(where)}] = {_store_cast(value, n.dtype)};")

    def loop(self, stage, known) -> list:
        """One loop over the inner ranges: accumulators before it, per-row results after it."""
        reds = reductions_of(stage.nodes)
        accs = {n.name: (f"acc{next(self.counter)}", self.acc_dtype(n)) for n in reds}
        pre, post = self._accumulators(reds, accs)
        inner_lines, before_loop = [], []
        loop_known = dict(known)
        ops = self.loop_ops(loop_known, inner_lines, before_loop)
        lanes = partials(self, reds, accs)   # a blocked float32 sum adds into a partial (cpp_sums.py)
        self.emit_stage(ops, stage.nodes, lanes, loop_known)
        post += self.reduction_results(reds, accs, known)
        pre += before_loop
        if self.inner_parallel:
            return pre + self._parallel_inner(reds, accs, inner_lines) + post
        if not self.k.inner_vars:
            return pre + inner_lines + post
        *dims, (v, size) = zip(self.k.inner_vars, self.k.inner_ranges)
        headers = [[f"for (int64_t {u.name} = 0; {u.name} < {_size(s)}; ++{u.name})"] for u, s in dims]
        simd = all(_vectorisable(n.data.reduction_type) for n in reds)
        pragma = [f"#pragma omp simd {_simd_clauses(reds, lanes)}".rstrip()] if simd else []
        block, inner = blocked_loop(v.name, _size(size), size, pragma, inner_lines, blocked_names(accs, lanes))
        return pre + nest(headers + ([block] if block else []), inner) + post

    # -- reductions -----------------------------------------------------------------------------
    def _accumulators(self, reds, accs) -> tuple[list, list]:
        """Declarations before the loop, and NaN fix-ups after it."""
        pre, post = [], []
        for n in reds:
            (acc, dt), kind = accs[n.name], n.data.reduction_type
            pre.append(f"{CTYPE[dt]} {acc} = {self.identity(kind, dt)};")
            if kind in ARG_REDUCTIONS:
                pre.append(f"int64_t {acc}_idx = 0;")
            if kind in ("max", "min") and dt.is_floating_point and not self.inner_parallel:
                pre.append(f"int {acc}_nan = 0;")
                post.append(f"if ({acc}_nan) {acc} = std::numeric_limits<{CTYPE[dt]}>::quiet_NaN();")
        return pre, post

    def _accumulate(self, ops, n, v, acc_dt):
        """Fold value ``v`` of reduction ``n`` into its accumulator, inside the loop."""
        k, kind, lines = self.k, n.data.reduction_type, ops.lines
        acc, dt = acc_dt
        acc = f"{acc}_part" if self.inner_parallel else acc
        if kind in ARG_REDUCTIONS:
            flat = _R.render(flat_of(k.inner_vars, k.inner_ranges))
            better = ">" if kind == "argmax" else "<"
            lines.append(f"{{ {CTYPE[dt]} v = {_cast(v, dt)}; if ({acc} == {acc} && (v {better} {acc} || v != v)) "
                         f"{{ {acc} = v; {acc}_idx = {flat}; }} }}")
        elif kind in ("max", "min") and not self.inner_parallel:
            # plain compare-select vectorises (omp max/min); a NaN is tracked on the side
            tmp = v if v.dtype == dt else ops._tmp(dt, _cast(v, dt))
            cmp = ">" if kind == "max" else "<"
            lines.append(f"{acc} = {acc} {cmp} {tmp} ? {acc} : {tmp};")
            if dt.is_floating_point:
                lines.append(f"{acc}_nan |= ({tmp} != {tmp});")
        else:
            lines.append(f"{acc} = {self.combine(kind).format(acc, _cast(v, dt))};")

    def reduction_results(self, reds, accs, known) -> list:
        """After the loop: each reduction's result becomes a per-row value (and a store)."""
        post = []
        for n in reds:
            (acc, dt), kind = accs[n.name], n.data.reduction_type
            if kind in ARG_REDUCTIONS:
                result = CV(f"{acc}_idx", torch.int64)
            elif dt != compute_dtype(n.dtype):
                result = CV(f"static_cast<{CTYPE[compute_dtype(n.dtype)]}>({acc})", compute_dtype(n.dtype))
            else:
                result = CV(acc, dt)
            where = self.k.store_index(n)
            if n.name in self.k.local:
                known[n.name] = (where, result)
            else:
                post.append(f"{self.pointer(n.name)}[{_R.render(where)}] = {_store_cast(result, n.dtype)};")
        return post

    def _parallel_inner(self, reds, accs, inner_lines) -> list:
        """One row, many threads: per-thread partial results combined at the end."""
        k = self.k
        out = ["#pragma omp parallel", "{"]
        for n in reds:
            acc, dt = accs[n.name]
            out.append(f"    {CTYPE[dt]} {acc}_part = {self.identity(n.data.reduction_type, dt)};")
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
            out.append(f"        {acc} = {self.combine(n.data.reduction_type).format(acc, acc + '_part')};")
        out.append("    }")
        out.append("}")
        return out


def _simd_clauses(reds, accs) -> str:
    clauses = []
    for n in reds:
        (acc, dt), kind = accs[n.name], n.data.reduction_type
        if kind in SIMD_CLAUSE:
            clauses.append(f"reduction({SIMD_CLAUSE[kind]}:{acc})")
        elif kind in ("max", "min"):
            clauses.append(f"reduction({kind}:{acc})")
            if dt.is_floating_point:
                clauses.append(f"reduction(|:{acc}_nan)")
    return " ".join(clauses)


def _size(s) -> str:
    """A loop bound or amount of work in C++: a number, or an expression over size arguments."""
    return _R.render(s) if isinstance(s, Expr) else str(s)


def _cast(value: CV, dtype: torch.dtype) -> str:
    """``value`` as a C++ value of compute type ``dtype``: itself when it is one already."""
    return str(value) if value.dtype == dtype else f"static_cast<{CTYPE[dtype]}>({value})"


def _store_cast(value: CV, dtype: torch.dtype) -> str:
    """``value`` as stored in a ``dtype`` buffer (bfloat16 is rounded from float32 bits)."""
    if dtype == torch.bfloat16:
        return f"mc_f32_to_bf16({_cast(value, torch.float32)})"
    if dtype == torch.float16:
        return f"static_cast<_Float16>({value})"
    return _cast(value, dtype)


def render_group(name: str, members: list) -> tuple[str, list]:
    """A horizontal group (scheduler/groups.py): one ``extern "C"`` function, one parallel region
    running its ``static`` members, none waiting for another (a member's loop is ``omp for ...
    nowait``, one below the threshold ``omp single nowait``). Its source and its arguments: every
    member's, each once, in first-use order."""
    args: dict = {}  # argument name -> (ctype, written by some member)
    for ck in members:
        for a in ck.args:
            _, written = args.get(a.name, (None, False))
            args[a.name] = (CTYPE[a.dtype], written or a.written)
    params = [f"    {'' if w else 'const '}{t}* {n}" for n, (t, w) in args.items()]
    work = sum(ck.work for ck in members)
    region = work >= config.parallel_threshold
    body = []
    for ck in members:
        call = f"{ck.k.name}({', '.join(a.name for a in ck.args)});"
        body += [call] if ck.parallel or not region else ["#pragma omp single nowait", call]
    lines = [f"// {name}: {len(members)} independent kernels, {work} elements, one call"
             + (", one parallel region, no barrier between kernels" if region else ""),
             f'extern "C" void {name}(', ",\n".join(params), ")", "{"]
    if region:
        lines += ["    #pragma omp parallel", "    {"] + ["        " + ln for ln in body] + ["    }"]
    else:
        lines += ["    " + ln for ln in body]
    return "\n".join(lines + ["}"]), list(args)


class CppBackend:
    """C++ on the CPU: every kernel of a graph in one translation unit, called through ctypes."""
    name = "cpp"
    # The wrapper passes ``t.data_ptr()``; a per-row value read by a later loop is kept in a
    # row-sized array.
    caps = BackendCaps(row_scratch=True, pass_pointers=True, split_loops=True, horizontal=True,
                       plan=lambda *kernel_and_graph: CppKernel(*kernel_and_graph).plan,
                       templates=frozenset({"flex_attention", "flex_attention_narrow", "checked_gather"}))

    def generate(self, graph: LoopGraph, plan: Schedule) -> GeneratedKernels:
        """The prelude's include, then one ``extern "C"`` function per kernel; a horizontal
        group's (the Schedule's) members (``static``) come right before the group's function. Each kernel or
        group is a unit the runtime may compile apart from the others (in parallel)."""
        symbols = tuple(graph.symbols)
        kernels = {k.name: CppKernel(k, graph.by_name, graph.mutations, graph.sources, symbols) for k in plan.kernels}
        for name in (name for g in plan.groups for name in g.kernels):
            kernels[name].in_group = True
        units, args, first_of = [], {}, {}
        for name, ck in kernels.items():
            if not ck.in_group:
                source = ck.render()
                args[name] = ck.param_names()
                first = first_of.setdefault(code_key(ck.param_code + ck.body_lines, ck.param_names()), ck)
                units.append(source if first is ck else cpp_forwarder(ck, first))   # a repeated layer's: built once
        for group in plan.groups:
            members = [kernels[name] for name in group.kernels]
            rendered = [ck.render() for ck in members]       # first: the group reads how each rendered
            source, args[group.name] = render_group(group.name, members)
            units.append("\n\n".join(rendered + [source]))
        for t in plan.templates:   # whole kernels of their own (codegen/cpp_flex.py)
            source, args[t.name] = render_flex(t.name, t.buffer, graph.sources, mod_ops)
            units.append(source)
        return GeneratedKernels("\n\n".join([f'#include "{PRELUDE_HEADER}"'] + units) + "\n", args, "cpp",
                                units=tuple(units))

    def load(self, generated: GeneratedKernels):
        if not generated.kernel_args:
            return None
        return load_cpp(generated.source, {n: len(a) for n, a in generated.kernel_args.items()}, generated.units)

    def start_load(self, generated: GeneratedKernels):
        """``load`` in the background (a future); None when there is nothing to build."""
        if generated.kernel_args:
            return start_load(generated.source, {n: len(a) for n, a in generated.kernel_args.items()}, generated.units)
