"""C++ for a FlexAttention buffer (ir/flex.py): one fused attention kernel with an online softmax.

Threads take (batch, query head, tile of RT query rows). A tile walks the key blocks its
query block lists in the block mask, partial blocks then full ones, skipping the rest:

    scores  s[r][j] = q[r] . k[j]        the key block transposed once per tile, so the
                                         product is a broadcast FMA over a row of keys
    mods    s[r][j] = mask ? score_mod(s[r][j] * scale) : -inf   (no mask in full blocks)
    softmax m' = max(m, max_j s); corr = exp(m - m'); l = l * corr + sum_j exp(s - m');
            acc = acc * corr + sum_j exp(s - m') v[j]

and writes ``acc / l`` (0 for a row with every key masked, as eager's safe softmax), the
logsumexp and the row maximum, both in base 2 as the higher-order op returns them. The score_mod
and mask_mod expressions are the IR bodies lowering made of the user's graphs, spelled by the
same ops handler as every other kernel (codegen/cpp.py's CppOps); the kernel supplies
``b, h, q_idx, kv_idx`` as its loop variables and the scaled score as ``mc_score``. bfloat16 and
float16 q/k/v are widened to float32 as they are loaded, everything runs in float32 (as eager's math),
and the output is rounded once to the input's dtype; the statistics stay float32.
"""
from __future__ import annotations

import itertools
import math

import torch

from minicompile.codegen.common import comment_text
from minicompile.codegen.cpp_ops import CTYPE
from minicompile.config import config
from minicompile.ir.flex import SCORE, FlexAttention
from minicompile.ir.nodes import StorageView

ROW_TILE = 32   # query rows a thread takes at once (a divisor of the block mask's query block)
MICRO_ROWS, MICRO_COLS = 4, 16   # a register tile of the two products: 8 AVX2 vectors of sums (rows padded to 4)
KEY_TILE = 128  # keys scored at once: a block mask's key block (a default mask's is one block of 2**30) in tiles


def _padded(n: int) -> int:
    return -(-n // MICRO_COLS) * MICRO_COLS


def key_tile(kv_block: int) -> int:
    return min(kv_block, KEY_TILE)


def render_flex(name: str, buf: FlexAttention, sources: dict, mod_ops) -> tuple[str, list]:
    """(the kernel's C++ function, its pointer arguments in order). ``mod_ops(counter)``: the ops
    handler the mod bodies are spelled with (codegen/cpp.py's, which has this module's SCORE)."""
    q, k, v = buf.query, buf.key, buf.value
    B, HQ, LQ, D = q.size
    BK, HK, LK, _ = k.size
    DV = v.size[3]
    rt = math.gcd(buf.q_block, ROW_TILE)
    reads = list(dict.fromkeys(view.buffer.name for view in buf.views()))
    writes = [buf.name] + [s.name for s in buf.stats]
    kinds = {view.buffer.name: view.dtype for view in buf.views()}
    params = [f"const {CTYPE[kinds[n]]}* {n}" for n in reads] + [f"{CTYPE[buf.dtype]}* {buf.name}"]
    params += [f"float* {s.name}" for s in buf.stats]
    counter = itertools.count()
    score_lines, score = _body_lines(buf.score, mod_ops(counter))
    mask_lines, mask = _body_lines(buf.mask, mod_ops(counter)) if buf.mask is not None else ([], "true")
    kb = "b" if BK > 1 else None
    work = B * HQ * LQ * LK * (D + DV)
    parallel = (f"#pragma omp parallel for collapse(3) if({work} >= {config.parallel_threshold})"
                if B * HQ * -(-LQ // rt) > 1 else "")
    passes = [(buf.partial, True)] + ([(buf.full, False)] if buf.full else [])
    lse, mx = buf.stats
    out_at = _at(buf, ["b", "h", "q_idx", None])
    lines = _header(name, buf, sources) + [f'extern "C" void {name}(']
    lines += [f"    {p}{',' if i < len(params) - 1 else ''}" for i, p in enumerate(params)]
    lines += [")", "{",
              f"    constexpr int64_t RT = {rt}, KB = {key_tile(buf.kv_block)}, KVBLOCK = {buf.kv_block}, D = {D}, DV = {DV}, G = {HQ // HK};",
              f"    constexpr int64_t KBP = {_padded(key_tile(buf.kv_block))}, DVP = {_padded(DV)}, MR = {MICRO_ROWS}, NC = {MICRO_COLS};",
              "    constexpr int64_t RTP = (RT + MR - 1) / MR * MR;  // row tiles padded to whole register tiles",
              f"    constexpr float SCALE = {_float(buf.scale)}, INV_LN2 = 1.4426950408889634f;"]
    if parallel:
        lines.append("    " + parallel)
    lines += [f"    for (int64_t b = 0; b < {B}; ++b)",
              f"    for (int64_t h = 0; h < {HQ}; ++h)",
              f"    for (int64_t q0 = 0; q0 < {LQ}; q0 += RT)",
              "    {",
              f"        const int64_t rows = std::min<int64_t>(RT, {LQ} - q0), qblock = q0 / {buf.q_block}, hk = h / G;",
              "        (void)hk;",
              "        // scratch: scores, the query rows, a key block transposed and a value block (both zero-padded)",
              "        alignas(64) float s[RTP][KBP], qs[RTP][D], kt[D][KBP], vb[KBP][DVP], acc[RTP][DVP];",
              "        float m[RTP], l[RTP];",
              "        for (int64_t r = 0; r < RTP; ++r)",
              "        {",
              "            m[r] = -INFINITY; l[r] = 0.0f;",
              "            for (int64_t d = 0; d < DVP; ++d) acc[r][d] = 0.0f;",
              f"            for (int64_t d = 0; d < D; ++d) qs[r][d] = r < rows ? {_load(q, ['b', 'h', 'q0 + r', 'd'])} : 0.0f;",
              "        }",
              "        for (int64_t j = 0; j < KBP; ++j) { for (int64_t d = 0; d < D; ++d) kt[d][j] = 0.0f; for (int64_t d = 0; d < DVP; ++d) vb[j][d] = 0.0f; }"]
    for (counts, indices), masked in passes:
        lines += ["        " + ln for ln in _block_pass(buf, counts, indices, masked, score_lines, score,
                                                         mask_lines, mask, kb)]
    lines += ["        for (int64_t r = 0; r < rows; ++r)",
              "        {",
              "            const int64_t q_idx = q0 + r;",
              "            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;",
              "            #pragma omp simd",
              f"            for (int64_t d = 0; d < DV; ++d) {buf.name}[{out_at} + d * {buf.layout.stride[3]}] = {_store('acc[r][d] * inv', buf.dtype)};",
              f"            {lse.name}[{_at(lse, ['b', 'h', 'q_idx'])}] = l[r] > 0.0f ? (m[r] + std::log(l[r])) * INV_LN2 : -INFINITY;",
              f"            {mx.name}[{_at(mx, ['b', 'h', 'q_idx'])}] = m[r] * INV_LN2;",
              "        }",
              "    }",
              "}"]
    return "\n".join(lines), reads + writes


def _block_pass(buf, counts: StorageView, indices: StorageView, masked: bool, score_lines, score, mask_lines,
                mask, kb) -> list:
    """The walk over one kind of key block (partial: with the mask; full: without)."""
    mb = "b" if counts.size[0] > 1 else None
    mh = "h" if counts.size[1] > 1 else None
    value = f"({mask}) ? {score} : -INFINITY" if masked else f"{score}"
    mods = score_lines + (mask_lines if masked else [])
    return [
        f"// {'partial blocks: the mask applies' if masked else 'full blocks: every position kept'}",
        f"for (int64_t i = 0; i < {counts.buffer.name}[{_at(counts, [mb, mh, 'qblock'])}]; ++i)",
        "{",
        f"    const int64_t k0 = static_cast<int64_t>({indices.buffer.name}[{_at(indices, [mb, mh, 'qblock', 'i'])}]) * KVBLOCK;",
        f"    const int64_t kend = std::min<int64_t>(k0 + KVBLOCK, {buf.key.size[2]});",
        "    for (int64_t kc = std::max<int64_t>(k0, 0); kc < kend; kc += KB)   // the block in tiles of KB keys",
        "    {",
    ] + ["    " + ln for ln in _key_tile(buf, value, mods, kb)] + [
        "    }",
        "}",
    ]


def _key_tile(buf, value: str, mods: list, kb) -> list:
    """One tile of at most KB keys: scores, mods and mask (``mods`` computing ``value``), the online
    softmax, the value product. ``kb``: the key's batch index (None where key and value broadcast)."""
    k, v = buf.key, buf.value
    return [
        "    const int64_t cols = std::min<int64_t>(KB, kend - kc);",
        "    for (int64_t j = 0; j < cols; ++j)",
        "    {",
        f"        for (int64_t d = 0; d < D; ++d) kt[d][j] = {_load(k, [kb, 'hk', 'kc + j', 'd'])};",
        f"        for (int64_t d = 0; d < DV; ++d) vb[j][d] = {_load(v, [kb, 'hk', 'kc + j', 'd'])};",
        "    }",
        "    for (int64_t j = cols; j < KBP; ++j) { for (int64_t d = 0; d < D; ++d) kt[d][j] = 0.0f; for (int64_t d = 0; d < DV; ++d) vb[j][d] = 0.0f; }",
        "    // s = q k^T: MR rows x NC keys held in registers over the head dimension",
        "    for (int64_t r0 = 0; r0 < rows; r0 += MR)",
        "    for (int64_t j0 = 0; j0 < cols; j0 += NC)",
        "    {",
        "        float c[MR][NC] = {};",
        "        for (int64_t d = 0; d < D; ++d)",
        "        {",
        "            const float* kd = kt[d] + j0;",
        "            #pragma GCC unroll 8",
        "            for (int64_t i = 0; i < MR; ++i)",
        "            {",
        "                const float qv = qs[r0 + i][d];",
        "                #pragma omp simd",
        "                for (int64_t jj = 0; jj < NC; ++jj) c[i][jj] = MC_FMA(qv, kd[jj], c[i][jj]);",
        "            }",
        "        }",
        "        for (int64_t i = 0; i < MR; ++i)",
        "            for (int64_t jj = 0; jj < NC; ++jj) s[r0 + i][j0 + jj] = c[i][jj];",
        "    }",
        "    for (int64_t r = 0; r < rows; ++r)",
        "    {",
        "        float* sr = s[r];",
        "        const int64_t q_idx = q0 + r;",
        "        (void)q_idx;",
        "        #pragma omp simd",
        "        for (int64_t j = 0; j < cols; ++j)",
        "        {",
        "            const int64_t kv_idx = kc + j;",
        "            (void)kv_idx;",
        f"            const float {SCORE} = sr[j] * SCALE;",
        *("            " + ln for ln in mods),
        f"            sr[j] = {value};",
        "        }",
        "        float bmax = -INFINITY;",
        "        #pragma omp simd reduction(max:bmax)",
        "        for (int64_t j = 0; j < cols; ++j) bmax = std::max(bmax, sr[j]);",
        "        const float mnew = std::max(m[r], bmax);",
        "        if (mnew == -INFINITY) { for (int64_t j = 0; j < KBP; ++j) sr[j] = 0.0f; continue; }  // every key so far masked",
        "        const float corr = mc_exp(m[r] - mnew);",
        "        float sum = 0.0f;",
        "        #pragma omp simd reduction(+:sum)",
        "        for (int64_t j = 0; j < cols; ++j) { const float p = mc_exp(sr[j] - mnew); sr[j] = p; sum += p; }",
        "        for (int64_t j = cols; j < KBP; ++j) sr[j] = 0.0f;",
        "        l[r] = l[r] * corr + sum;",
        "        m[r] = mnew;",
        "        #pragma omp simd",
        "        for (int64_t d = 0; d < DVP; ++d) acc[r][d] *= corr;",
        "    }",
    ] + _value_product()


def _value_product() -> list:
    return [
        "    // acc += p v: MR rows x NC of the value dimension held in registers over the keys",
        "    for (int64_t r0 = 0; r0 < rows; r0 += MR)",
        "    for (int64_t d0 = 0; d0 < DVP; d0 += NC)",
        "    {",
        "        float c[MR][NC];",
        "        for (int64_t i = 0; i < MR; ++i)",
        "            for (int64_t dd = 0; dd < NC; ++dd) c[i][dd] = acc[r0 + i][d0 + dd];",
        "        for (int64_t j = 0; j < cols; ++j)",
        "        {",
        "            const float* vj = vb[j] + d0;",
        "            #pragma GCC unroll 8",
        "            for (int64_t i = 0; i < MR; ++i)",
        "            {",
        "                const float p = s[r0 + i][j];",
        "                #pragma omp simd",
        "                for (int64_t dd = 0; dd < NC; ++dd) c[i][dd] = MC_FMA(p, vj[dd], c[i][dd]);",
        "            }",
        "        }",
        "        for (int64_t i = 0; i < MR; ++i)",
        "            for (int64_t dd = 0; dd < NC; ++dd) acc[r0 + i][d0 + dd] = c[i][dd];",
        "    }",
    ]


def _body_lines(body, ops) -> tuple[list, str]:
    """A mod body spelled in C++: its statements and the name of its value."""
    value = body(ops)
    return ops.lines, str(value)


def _load(view: StorageView, terms) -> str:
    """``view`` at ``terms`` as a float: bfloat16 and float16 widened exactly (eager's math upcasts q, k
    and v to float32 too), so the products, the softmax and the output accumulate in float32."""
    raw = f"{view.buffer.name}[{_at(view, terms)}]"
    if view.dtype == torch.bfloat16:
        return f"mc_bf16_to_f32({raw})"
    return f"static_cast<float>({raw})" if view.dtype == torch.float16 else raw


def _store(value: str, dtype) -> str:
    """A float ``value`` stored as ``dtype``: rounded once, to nearest even."""
    if dtype == torch.bfloat16:
        return f"mc_f32_to_bf16({value})"
    return f"static_cast<_Float16>({value})" if dtype == torch.float16 else value


def _at(view, terms) -> str:
    """The element offset of ``view`` at index ``terms`` (C++ expressions; None for index 0)."""
    parts = [str(view.offset)] if getattr(view, "offset", 0) else []
    stride = view.stride if isinstance(view, StorageView) else view.layout.stride
    for t, st in zip(terms, stride):
        if t is not None and st != 0:
            parts.append(f"({t})" if st == 1 else f"({t}) * {st}")
    return " + ".join(parts) or "0"


def _float(x: float) -> str:
    return repr(float(x)) + "f" if math.isfinite(x) else ("INFINITY" if x > 0 else "-INFINITY")


def _header(name: str, buf: FlexAttention, sources: dict) -> list:
    lines = [f"// {name}: flex_attention fused (score_mod, mask_mod, online softmax) <- FX "
             f"{comment_text(', '.join(buf.origins))}"]
    for origin in buf.origins:
        if sources.get(origin):
            lines.append(f"//   {comment_text(sources[origin])}")
    return lines
