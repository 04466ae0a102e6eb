"""Triton for a FlexAttention buffer (ir/flex.py): the fused attention kernel, from the same mod bodies.

One program per (BLOCK_M query rows, batch x query head). It walks the key blocks its query block
lists in the block mask (partial blocks with the mask body, full ones without; where a program's
rows would straddle two query blocks, every key with the mask body, eager's own rule), in BLOCK_N
tiles: ``tl.dot`` for both products and the online softmax between them. The score_mod and mask_mod
bodies are spelled by ModOps below with the Triton templates of every other kernel
(codegen/triton_ops.py): ``b`` and ``h`` are the program's scalars, ``q_idx`` a [BLOCK_M, 1]
column and ``kv_idx`` a [1, BLOCK_N] row, so each value broadcasts to the tile.

Checked under TRITON_INTERPRET (CPU tensors, ``MINICOMPILE_CPU_BACKEND=triton``); lowering keeps
CUDA graphs on the extern call until the kernel has run on a GPU (lowering/flex.py).
"""
from __future__ import annotations

import itertools

import torch

from minicompile.codegen.triton_ops import TL, TritonRenderer, literal, template
from minicompile.ir.flex import SCORE, FlexAttention
from minicompile.ir.ops import compute_dtype

_R = TritonRenderer()
BLOCK_M = BLOCK_N = 16   # tl.dot's smallest tile


class ModOps:
    """Spells a mod body in Triton: one ``tmpN = ...`` statement per value; loads of captured
    tensors are masked by ``valid`` (the tile's rows and keys in range)."""

    def __init__(self, counter):
        self.lines, self.counter = [], counter
        self.dtypes = {SCORE: torch.float32}   # value -> its compute dtype (templates differ for ints)

    def _tmp(self, expr: str, dtype: torch.dtype) -> str:
        name = f"tmp{next(self.counter)}"
        self.lines.append(f"{name} = {expr}")
        self.dtypes[name] = dtype
        return name

    def load(self, name, index, dtype):
        if name == SCORE:
            return SCORE
        value = f"tl.load({name} + ({_R.render(index)}) + tile, mask=valid, other=0)"   # tile: broadcast
        wide = compute_dtype(dtype)
        return self._tmp(value if wide == dtype else f"{value}.to({TL[wide]})", wide)

    def constant(self, value, dtype):
        wide = compute_dtype(dtype)
        return self._tmp(f"tl.full([], {literal(value, wide)}, {TL[wide]})", wide)

    def index_expr(self, expr, dtype):
        return self._tmp(f"({_R.render(expr)}).to({TL[dtype]})", dtype)

    def to_dtype(self, x, dtype):
        return self._tmp(f"{x}.to({TL[compute_dtype(dtype)]})", compute_dtype(dtype))

    def pointwise(self, op, *args, dtype):
        operand = self.dtypes.get(str(args[1] if op == "where" else args[0]), dtype)
        return self._tmp(template(op, operand).format(*args), compute_dtype(dtype))


def _p2(n: int) -> int:
    return max(16, 1 << (int(n) - 1).bit_length())


def _offset(view, terms) -> str:
    parts = [str(view.offset)] if view.offset else []
    parts += [f"({t}) * {st}" for t, st in zip(terms, view.stride) if t is not None and st != 0]
    return " + ".join(parts) or "0"


def render_flex_triton(name: str, buf: FlexAttention) -> tuple[str, list, dict]:
    """(the kernel's source, its pointer arguments in order, its launch grid and written arguments)."""
    q, k, v = buf.query, buf.key, buf.value
    B, HQ, LQ, D = q.size
    BK, HK, LK, _ = k.size
    DV = v.size[3]
    reads = list(dict.fromkeys(view.buffer.name for view in buf.views()))
    writes = [buf.name] + [s.name for s in buf.stats]
    counter = itertools.count()
    score_ops, mask_ops = ModOps(counter), ModOps(counter)
    score = buf.score(score_ops)
    mask = buf.mask(mask_ops) if buf.mask is not None else "True"
    kb = "b" if BK > 1 else None
    lse, mx = buf.stats
    def tile_lines(end: str, masked: bool) -> list:
        """The BLOCK_N keys from ``start`` (those below ``end``): scores, mods (and mask), softmax, product."""
        keep = f"valid & ({mask})" if masked else "valid"
        return [
            f"kv_idx = start + tl.arange(0, {BLOCK_N})[None, :]",
            f"kv_col = start + tl.arange(0, {BLOCK_N})[:, None]",
            f"valid = (q_idx < {LQ}) & (kv_idx < {end})",
            f"kt = tl.load({k.buffer.name} + {_offset(k, [kb, 'hk', 'kv_idx', 'dk'])}, mask=(kv_idx < {end}) & (dk < {D}), other=0.0)",
            f"vt = tl.load({v.buffer.name} + {_offset(v, [kb, 'hk', 'kv_col', 'dv'])}, mask=(kv_col < {end}) & (dv < {DV}), other=0.0)",
            f"{SCORE} = tl.dot(qt, kt, input_precision='ieee') * {float(buf.scale)!r}",
            *score_ops.lines, *(mask_ops.lines if masked else []),
            f"s = tl.where({keep}, {score}, float('-inf'))",
            "m_new = tl.maximum(m, tl.reduce(s, 1, mc_maximum))",
            "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)   # rows with every key so far masked",
            "p = tl.exp(s - m_safe[:, None])",
            "corr = tl.exp(m - m_safe)",
            "l = l * corr + tl.reduce(p, 1, mc_add)",
            "acc = acc * corr[:, None] + tl.dot(p, vt, input_precision='ieee')",
            "m = m_new",
        ]
    body = [
        "pid_m = tl.program_id(0)",
        "pid_bh = tl.program_id(1)",
        f"b = pid_bh // {HQ}",
        f"h = pid_bh % {HQ}",
        f"hk = h // {HQ // HK}",
        f"q_idx = pid_m * {BLOCK_M} + tl.arange(0, {BLOCK_M})[:, None]",
        f"dq = tl.arange(0, {_p2(D)})[None, :]",
        f"dk = tl.arange(0, {_p2(D)})[:, None]",
        f"dv = tl.arange(0, {_p2(DV)})[None, :]",
        f"qt = tl.load({q.buffer.name} + {_offset(q, ['b', 'h', 'q_idx', 'dq'])}, mask=(q_idx < {LQ}) & (dq < {D}), other=0.0)",
        f"m = tl.full([{BLOCK_M}], float('-inf'), tl.float32)",
        f"l = tl.full([{BLOCK_M}], 0.0, tl.float32)",
        f"acc = tl.full([{BLOCK_M}, {_p2(DV)}], 0.0, tl.float32)",
        f"tile = tl.full([{BLOCK_M}, {BLOCK_N}], 0, tl.int32)",
    ] + _key_loops(buf, tile_lines) + [
        "rows = q_idx < " + str(LQ),
        "inv = tl.where(l > 0, 1.0 / tl.where(l > 0, l, 1.0), 0.0)",
        f"tl.store({buf.name} + {_offset_layout(buf, ['b', 'h', 'q_idx', 'dv'])}, acc * inv[:, None], mask=rows & (dv < {DV}))",
        f"q_row = pid_m * {BLOCK_M} + tl.arange(0, {BLOCK_M})",
        "lse2 = tl.where(l > 0, (m + tl.log(tl.where(l > 0, l, 1.0))) * 1.4426950408889634, float('-inf'))",
        f"tl.store({lse.name} + {_offset_layout(lse, ['b', 'h', 'q_row'])}, lse2, mask=q_row < {LQ})",
        f"tl.store({mx.name} + {_offset_layout(mx, ['b', 'h', 'q_row'])}, m * 1.4426950408889634, mask=q_row < {LQ})",
    ]
    lines = [f"# {name}: flex_attention fused (score_mod, mask_mod, online softmax)", "@triton.jit",
             f"def {name}({', '.join(reads + writes)}):"] + ["    " + ln for ln in body]
    launch = {"grid": [-(-LQ // BLOCK_M), B * HQ], "written": writes}
    return "\n".join(lines), reads + writes, launch


def _offset_layout(buf, terms) -> str:
    return " + ".join(f"({t}) * {st}" for t, st in zip(terms, buf.layout.stride) if st != 0) or "0"


def _key_loops(buf, tile) -> list:
    """The walk over keys: the block mask's partial blocks (mask body) then full blocks (none),
    skipping the rest, where a program's rows lie in one query block; else every key, masked."""
    LK = buf.key.size[2]
    if buf.q_block % BLOCK_M:
        return [f"for start in range(0, {LK}, {BLOCK_N}):", *("    " + ln for ln in tile(f"{LK}", True))]
    lines = [f"qblock = (pid_m * {BLOCK_M}) // {buf.q_block}"]
    for (counts, indices), masked in [(buf.partial, True)] + ([(buf.full, False)] if buf.full else []):
        mb = "b" if counts.size[0] > 1 else None
        mh = "h" if counts.size[1] > 1 else None
        lines += [f"for i in range(0, tl.load({counts.buffer.name} + {_offset(counts, [mb, mh, 'qblock'])})):",
                  f"    k0 = tl.load({indices.buffer.name} + {_offset(indices, [mb, mh, 'qblock', 'i'])}).to(tl.int64) * {buf.kv_block}",
                  f"    kend = tl.minimum(k0 + {buf.kv_block}, {LK})",
                  f"    for start in range(k0, kend, {BLOCK_N}):",
                  *("        " + ln for ln in tile("kend", masked))]
    return lines
