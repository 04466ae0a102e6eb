"""Blocked float32 sums on the CPU: eager's accuracy at float32 speed.

Adding one float32 at a time, a sum's rounding error grows with the length of the chain of
additions into one accumulator: a channels-last BatchNorm gradient summed 8192 rows into one
float per channel was 37x farther from a float64 sum than eager's (which sums in short
blocks, ATen's cascade sum), and a row of 8 x 1024 in SIMD lanes 4x farther. Accumulating in
double is as accurate but converts every element: a plain column sum took twice as long. So a
float32 sum longer than ``CppKernel.WIDE_SUMS_ABOVE`` keeps a double total (``acc_dtype``)
and adds into it, once per block, a float32 partial of at most ROW_BLOCK elements of the
innermost reduced loop or COLUMN_BLOCK_ROWS rows of a column reduction (cpp_columns.py): no
chain of more than 32 float32 additions, whether or not the compiler vectorises the loop (it
does not where another operand is gathered across a channels-last layout; with 512-element
blocks such a sum of a smooth ramp was 19x farther from float64 than eager's, at 32 1.4x).

    lanes = partials(ck, reds, accs)         # name -> (what the loop adds into, its dtype)
    header, lines = blocked_loop(var, bound, size, pragma, body, blocked_names(accs, lanes))
"""
from __future__ import annotations

import torch

from minicompile.ir.ops import compute_dtype

ROW_BLOCK = 32           # elements of an innermost reduced loop per float32 partial
COLUMN_BLOCK_ROWS = 32   # rows of a column reduction per float32 partial


def is_blocked(n, acc_dtype, inner_parallel: bool) -> bool:
    """A float32 sum with a double total (the one-row-many-threads form keeps double lanes)."""
    return (n.data.reduction_type == "sum" and acc_dtype == torch.float64
            and compute_dtype(n.dtype) == torch.float32 and not inner_parallel)


def partials(ck, reds, accs: dict, suffix: str = "") -> dict:
    """Reduction name -> (the accumulator its loop adds into, dtype): ``{acc}_blk`` (float32)
    for a blocked sum, the total itself otherwise. ``suffix`` indexes a column's lane."""
    out = {}
    for n in reds:
        acc, dt = accs[n.name]
        out[n.name] = ((f"{acc}_blk{suffix}", torch.float32) if is_blocked(n, dt, ck.inner_parallel)
                       else (f"{acc}{suffix}", dt))
    return out


def blocked_names(accs: dict, lanes: dict) -> list:
    """(total, partial) accumulator names of the blocked sums."""
    return [(accs[name][0], lane) for name, (lane, _) in lanes.items() if lane != accs[name][0]]


def blocked_loop(var: str, bound: str, size, pragma: list, body: list, pairs: list) -> tuple[list, list]:
    """The innermost reduced loop (``var`` < ``bound``; ``size`` its length, an int when static)
    cut into ROW_BLOCK blocks when some sum is blocked: (the block loop's header lines, or [],
    the lines inside it). ``pairs``: (total, partial) accumulator names."""
    def loop(start, end):
        return pragma + [f"for (int64_t {var} = {start}; {var} < {end}; ++{var})", "{"] + ["    " + b for b in body] + ["}"]
    if not pairs:
        return [], loop(0, bound)
    static = isinstance(size, int)
    start = "0" if static and size <= ROW_BLOCK else f"{var}_blk"
    end = bound if start == "0" else f"{start} + {ROW_BLOCK}" if static and size % ROW_BLOCK == 0 \
        else f"std::min<int64_t>({start} + {ROW_BLOCK}, {bound})"
    lines = [f"float {p} = 0.0f;" for _, p in pairs] + loop(start, end) + [f"{t} += {p};" for t, p in pairs]
    header = [] if start == "0" else [f"for (int64_t {start} = 0; {start} < {bound}; {start} += {ROW_BLOCK})"]
    return header, lines
