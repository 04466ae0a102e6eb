"""Column reductions on the CPU: sums over the rows of a row-major array, one result per column.

Backward is full of them: a Linear's bias gradient sums the output gradient over the batch,
a LayerNorm's weight gradient sums over every row. The kernel's outer variable (the column)
is then the contiguous one and the reduced variable jumps a whole row per step, so the usual
loop order (per column, an inner loop down the rows) reads one float per cache line per step
and does not vectorise: a 256 x 1024 bias gradient took 0.60 ms against eager's 0.04 ms.
Here the loops are interchanged, as eager's and Inductor's column reductions do: each thread
takes a block of COLUMN_BLOCK columns, keeps one accumulator per column in a small array,
walks the rows in order and adds each row's block into the array with a unit-stride
``omp simd`` loop; after the last row it stores the block. Every (column, row) point is
still visited once, so in-loop pointwise members stay correct, and each column still sums
its rows in order, as the loop it replaces did.

    column = column_var(kernel)                 # the outer Var to vectorise across, or None
    lines = render_columns(kernel, column)
"""
from __future__ import annotations

from minicompile.codegen.common import reductions_of
from minicompile.codegen.cpp_loops import nest
from minicompile.codegen.cpp_ops import CTYPE
from minicompile.codegen.cpp_sums import COLUMN_BLOCK_ROWS, blocked_names, partials
from minicompile.config import config
from minicompile.ir.nodes import Reduction

COLUMN_BLOCK = 64   # columns per accumulator block: 4 cache lines of float32 per row
COLUMN_KINDS = ("sum", "prod", "any", "all")   # reductions whose combine is one expression


def column_var(ck):
    """The kernel's innermost outer variable when ``ck`` (a CppKernel) renders a column
    reduction: one loop stage of plain reductions, no row scratch, static sizes, and every index
    that moves with both the column and the innermost reduced variable strides over whole rows
    while some read steps through adjacent elements with the column (a per-row value, such as
    LayerNorm's mean in its weight gradient, is loaded once per row). Outer variables before it
    (the batch of an NHWC spatial mean, squeeze-excite's) loop around the column blocks. None
    otherwise."""
    k = ck.k
    if not (ck.static and k.is_reduction and not ck.inner_parallel and k.stages[0].kind == "loop"
            and all(st.kind == "scalar" for st in k.stages[1:]) and not k.scratch and k.outer_vars and k.inner_vars):
        return None
    if any(n.data.reduction_type not in COLUMN_KINDS for n in reductions_of(k.nodes)):
        return None
    x, r = k.outer_vars[-1], k.inner_vars[-1]
    indices = [i for n in k.nodes for i in [read.index for read in k.reads(n)]
               + ([] if isinstance(n.data, Reduction) else [k.store_index(n)])]
    strides = [(i.coefficient(x), i.coefficient(r)) for i in indices]
    if any(sx is None or sr is None or (sx != 0 and abs(sr) == 1) for sx, sr in strides):
        return None   # (a per-row value, sx == 0, is loaded once per row: see render_columns)
    return x if any(sx == 1 and abs(sr) > 1 for sx, sr in strides) else None


def render_columns(ck, x) -> list:
    """The kernel body: blocks of columns on threads, rows in order, columns in SIMD lanes."""
    k = ck.k
    stage = k.stages[0]
    reds = reductions_of(stage.nodes)
    block, n_cols = f"{x.name}_block", int(k.outer_ranges[-1])
    width = min(COLUMN_BLOCK, n_cols)
    end = f"{block} + {width}" if n_cols % width == 0 else f"std::min<int64_t>({block} + {width}, {n_cols})"
    columns = ["#pragma omp simd", f"for (int64_t {x.name} = {block}; {x.name} < {end}; ++{x.name})"]
    accs = {n.name: (f"acc{next(ck.counter)}", ck.acc_dtype(n)) for n in reds}
    lane = f"[{x.name} - {block}]"
    lanes = {name: (f"{acc}{lane}", dt) for name, (acc, dt) in accs.items()}
    adds = partials(ck, reds, accs, lane)   # a blocked float32 sum adds into a partial (cpp_sums.py)
    body, per_row, known = [], [], {}
    ops = ck.loop_ops(known, body, per_row)
    ck.emit_stage(ops, stage.nodes, adds, known)
    init = [f"{lanes[n.name][0]} = {ck.identity(n.data.reduction_type, lanes[n.name][1])};" for n in reds]
    rows = [[f"for (int64_t {v.name} = 0; {v.name} < {size}; ++{v.name})"] for v, size in zip(k.inner_vars, k.inner_ranges)]
    out = [f"{CTYPE[dt]} {acc}[{width}];" for acc, dt in accs.values()]
    pairs = blocked_names(lanes, adds)
    row_loop = per_row + nest([columns], body)
    if pairs:   # the innermost row loop in blocks of COLUMN_BLOCK_ROWS, each a float32 partial
        (v, size), step = (k.inner_vars[-1], k.inner_ranges[-1]), COLUMN_BLOCK_ROWS
        out += [f"float {p.split('[')[0]}[{width}];" for _, p in pairs]
        rows[-1] = [f"for (int64_t {v.name}_blk = 0; {v.name}_blk < {size}; {v.name}_blk += {step})"]
        stop = f"std::min<int64_t>({v.name}_blk + {step}, {size})"
        row_loop = (nest([columns], [f"{p} = 0.0f;" for _, p in pairs])
                    + nest([[f"for (int64_t {v.name} = {v.name}_blk; {v.name} < {stop}; ++{v.name})"]], row_loop)
                    + nest([columns], [f"{t} += {p};" for t, p in pairs]))
    out += nest([columns], init) + nest(rows, row_loop)
    known = {}
    post = ck.reduction_results(reds, lanes, known)
    for st in k.stages[1:]:   # per column, after its reduction (a mean's division)
        ck.scalar_stage(st, post, known)
    out += nest([columns], post)
    others = [[f"for (int64_t {v.name} = 0; {v.name} < {size}; ++{v.name})"]
              for v, size in zip(k.outer_vars[:-1], k.outer_ranges[:-1])]
    loops = others + [[f"for (int64_t {block} = 0; {block} < {n_cols}; {block} += {width})"]]
    if ck.work >= config.parallel_threshold and k.outer_numel > width:
        loops[0].insert(0, "#pragma omp parallel for" + (f" collapse({len(loops)})" if others else ""))
    return (ck.hoisted or []) + nest(loops, out)
