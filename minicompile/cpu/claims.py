"""The CPU's claims: which ops run as vendor-library calls there, on purpose, and why.

The decomposition table (decomp/) says what ops mean, on any device. The choices here are
the CPU's: they depend on the machine, on sizes and on knobs, and each keeps an op whole that
lowering then runs as an extern call. cpu/policy.py hands them to the trace (``CPU.claims``).

    CPU_CLAIMS          op -> claim(*args, **kwargs): the claimed result, or None to defer to
                        the device-neutral decomposition (thunder's executors claim ops the same way)
    gemm_decision       a float32 product as oneDNN's matmul or MKL's sgemm, measured or pinned
    narrow_gemm_decision  a bfloat16/float16 product as the library's kernel or in float32, likewise
    attention_decision  eager's fused flash attention or our math form, measured or pinned
    claim_convolution   NHWC input for oneDNN, inside inference traces only (cpu/conv_layout.py)
    stamp_extern_reasons           an ATen pass: ``node.meta["extern_reason"]``, which lowering prints

A claim checks the device of its tensors, so tracing a CUDA graph is untouched. Each measured
choice is timed once per machine, thread count and shape (cpu/timing.py) and printed in the ATen
graph's header; the knobs MINICOMPILE_CPU_GEMM, MINICOMPILE_CPU_NARROW_GEMM and
MINICOMPILE_CPU_ATTENTION pin them (MINICOMPILE_CPU_LIBRARIES=eager pins eager's libraries).
Epilogues fused into oneDNN's products as post-ops: cpu/epilogues.py.
What was measured where: docs/models.md.
"""
from __future__ import annotations

import functools

import torch

from minicompile.cpu.conv_layout import claim_convolution
from minicompile.config import config
from minicompile.runtime import cache
from minicompile.cpu.timing import Decision, choose, cpu_flags, cpu_name, pick, real_tensors, record, recorded_times

aten = torch.ops.aten


# -- matrix products: MKL's sgemm or oneDNN's matmul ---------------------------------------------

def use_onednn_linear(mat1, mat2) -> bool:
    """Run the float32 CPU product ``mat1 @ mat2`` as oneDNN's linear rather than ``aten.mm``.

    ``aten.mm`` (and eager's ``nn.Linear``) calls MKL's sgemm. Which library is faster depends
    on the machine (MKL takes a generic code path on non-Intel CPUs; docs/models.md has the
    numbers), so ``config.cpu_gemm`` "auto" measures both at the product's shape (its size hints,
    for a symbolic size) once per machine, thread count and shape (cpu/timing.library_choice);
    "mkl" and "onednn" pin the choice. A bias of the product is added inside oneDNN's call; an activation or a residual
    add after it may become its post-op (cpu/epilogues.py, measured too).
    """
    decision = gemm_decision(mat1, mat2)
    return decision is not None and decision.choice == "onednn"


def gemm_decision(mat1, mat2, measure: bool = True) -> Decision | None:
    """MKL's mm or oneDNN's linear for ``mat1 @ mat2``, and why; None where oneDNN cannot run it.
    A measured choice is recorded for the ATen graph's header. ``measure=False`` only looks the
    timing up (a choice this process made): the reason lowering prints."""
    mode, pinned = pinned_mode("cpu_gemm", "MINICOMPILE_CPU_GEMM", eager="mkl")
    if not onednn_can_run(mat1, mat2):
        return None
    if pinned:
        return Decision(mode, pinned)
    m, k, n = (size_hint(s) for s in (*mat1.shape, mat2.shape[1]))
    layouts = (matrix_layout(mat1), matrix_layout(mat2))
    key, candidates = _gemm_candidates(m, k, n, *layouts)
    what = f"mm {m}x{k}x{n} ({layouts[0]} @ {layouts[1]})"
    if not measure:
        times = recorded_times(key)
        return None if times is None else Decision(pick(times, "mkl", ONEDNN_MARGIN), times=times, note=_GEMM_RULE)
    measured = lambda choice: Decision(choice, times=recorded_times(key), note=_GEMM_RULE)  # noqa: E731
    with real_tensors():
        choice = choose(key, candidates, f"float32 product {m}x{k} ({layouts[0]}) @ {k}x{n} ({layouts[1]})",
                        prefer="mkl", margin=ONEDNN_MARGIN, otherwise="mkl", line=lambda c: measured(c).line(what))
    if choice is None:   # not measured yet: this trace is provisional (cpu/timing.measured_first)
        return Decision("mkl", note="not measured yet")
    return measured(choice)


def pinned_mode(knob: str, env: str, eager: str) -> tuple[str, str]:
    """(a library knob's value (config checked it), the setting that pins it, or "" for "auto"):
    ``eager``, eager's own library, when cpu_libraries is "eager"."""
    if config.cpu_libraries == "eager":
        return eager, "MINICOMPILE_CPU_LIBRARIES=eager"
    mode = getattr(config, knob)
    return mode, "" if mode == "auto" else f"{env}={mode}"


def onednn_can_run(mat1, mat2) -> bool:
    """CPU float32 matrices of known strides, none of them broadcast (a zero stride)."""
    if not (mat1.device.type == "cpu" and mat1.dtype == mat2.dtype == torch.float32
            and mat1.dim() == mat2.dim() == 2 and onednn_available()):
        return False
    if not _hinted(mat1, mat2):  # a data-dependent size, which may be 0: aten.mm takes any
        return False
    for t in (mat1, mat2):
        strides = t.stride()
        if not all(isinstance(s, int) for s in strides):
            return False
        if any(s == 0 and size_hint(n) > 1 for s, n in zip(strides, t.shape)) or any(size_hint(n) == 0 for n in t.shape):
            return False
    return True


def _hinted(*tensors) -> bool:
    """Every size has a value in the traced example: none is data-dependent (nonzero's row count
    has no hint)."""
    return all(isinstance(n, int) or n.node.has_hint() for t in tensors if t is not None for n in t.shape)


def size_hint(size) -> int:
    """A size's value in the example the graph was traced with (a symbol's hint), guard-free."""
    return size if isinstance(size, int) else size.node.hint


def matrix_layout(t) -> str:
    return "row" if t.stride(1) == 1 else "column" if t.stride(0) == 1 else "strided"


def _gemm_candidates(m: int, k: int, n: int, layout1: str, layout2: str) -> tuple[str, dict]:
    """(the cache key, the two calls to time); library_choice keeps the answer (in this process and
    on disk); the operands are only made when it measures."""
    def operand(rows, cols, layout):
        return torch.randn(cols, rows).t() if layout == "column" else torch.randn(rows, cols)
    operands = functools.cache(lambda: (operand(m, k, layout1), operand(k, n, layout2)))
    linear = torch.ops.mkldnn._linear_pointwise.default
    key = cache.digest("gemm", torch.__version__, cpu_name(), str(torch.get_num_threads()),
                       f"{m}x{k}x{n}", layout1, layout2, f"mkl unless {ONEDNN_MARGIN} faster")
    return key, {"mkl": lambda: torch.mm(*operands()),
                 "onednn": lambda: linear(operands()[0], operands()[1].t(), None, "none", [], "")}


# oneDNN's linear must be this much faster alone to be chosen: it allocates its result on every
# call (aten.mm writes into the wrapper's pooled buffer), and inside a graph those fresh
# allocations were page-faulted in again and again (Swin: 1,200 faults a call, all in its 8
# oneDNN products, once the process's heap had been churned; 0 in its 19 mm calls).
ONEDNN_MARGIN = 0.1
_GEMM_RULE = f"mkl kept unless onednn is {ONEDNN_MARGIN:.0%} faster"


@functools.lru_cache(maxsize=None)
def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _claim_addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if _narrow_in_float32(mat1, mat2, "addmm"):   # the bias added before the one rounding, as eager
        return _narrow(aten.addmm.default(_wide(self), _wide(mat1), _wide(mat2), beta=beta, alpha=alpha), mat1.dtype)
    if beta == 1 and alpha == 1 and self.dim() == 1 and self.shape[0] == mat2.shape[1] and self.dtype == mat1.dtype \
            and use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), self, "none", [], "")
    return None


def _claim_mm(mat1, mat2):
    narrow = _narrow_as_float32(aten.mm.default, mat1, mat2)
    if narrow is not None:
        return narrow
    if use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), None, "none", [], "")
    return None


# -- bfloat16/float16 products: the library's narrow kernel, or float32 on converted operands -------

def narrow_gemm_decision(a, b, op: str = "mm") -> Decision | None:
    """The library's bfloat16/float16 kernel for ``a @ b`` (mm or bmm), as eager, or the float32
    product of the operands converted (exactly: every narrow value is a float32 one), rounded once
    to the narrow dtype; None for other products. Both accumulate in float32, so they differ only
    in the order of the sum (convolutions, forward and backward, likewise). A CPU without instructions for the dtype (AVX2: no avx512_bf16 or
    amx_bf16) converts inside the library at 10-45x the float32 product's time (docs/training.md),
    so there the float32 form is chosen; a CPU with them keeps the library. Decided by the CPU's
    flags, not timed: the timing counts process CPU time, which a threaded float32 product
    inflates with its OpenMP threads' spinning (9.5 ms against 0.3 ms). Pinned by
    ``config.cpu_narrow_gemm``; recorded for the ATen graph's header."""
    if not (a.device.type == "cpu" and a.dtype == b.dtype and a.dtype in NARROW_FLAGS):
        return None
    mode, pinned = pinned_mode("cpu_narrow_gemm", "MINICOMPILE_CPU_NARROW_GEMM", eager="library")
    if pinned:
        return Decision(mode, pinned)
    dtype = str(a.dtype).split(".")[-1]
    flags = [f for f in NARROW_FLAGS[a.dtype] if f in cpu_flags()]
    decision = Decision("library" if flags else "float32",
                        note=f"this CPU has {', '.join(flags)}" if flags else f"this CPU has no {dtype} instructions")
    record(decision.line(f"{dtype} {op}"))
    return decision


NARROW_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


def _narrow_in_float32(a, b, op: str) -> bool:
    decision = narrow_gemm_decision(a, b, op)
    return decision is not None and decision.choice == "float32"


def _narrow_as_float32(op, a, b):
    if not _narrow_in_float32(a, b, "bmm" if op is aten.bmm.default else "mm"):
        return None
    return _narrow(op(_wide(a), _wide(b)), a.dtype)


def _claim_linear(input, weight, bias=None):
    """A bfloat16/float16 linear in float32, its bias added before the one rounding (eager's
    kernel rounds once; the decomposition's mm, then add, rounded 29% of elements differently)."""
    if not _narrow_in_float32(input, weight, "linear"):
        return None
    return _narrow(aten.linear.default(_wide(input), _wide(weight), _wide(bias)), input.dtype)


def _wide(t):
    return None if t is None else aten._to_copy.default(t, dtype=torch.float32)


def _narrow(t, dtype):
    return None if t is None else aten._to_copy.default(t, dtype=dtype)


def _claim_convolution(input, weight, bias, *conv):
    """A bfloat16/float16 convolution in float32 (narrow_gemm_decision), else the float32 claim."""
    if not _narrow_in_float32(input, weight, "convolution"):
        return claim_convolution(input, weight, bias, *conv)
    return _narrow(aten.convolution.default(_wide(input), _wide(weight), _wide(bias), *conv), input.dtype)


def _claim_convolution_backward(grad, input, weight, *conv):
    if grad.dtype != input.dtype or not _narrow_in_float32(input, weight, "convolution backward"):
        return None
    grads = aten.convolution_backward.default(_wide(grad), _wide(input), _wide(weight), *conv)
    return tuple(_narrow(g, input.dtype) for g in grads)


# -- fused CPU attention -----------------------------------------------------------------------

def use_fused_cpu_attention(query, key, value, attn_mask=None, is_causal=False, scale=None) -> bool:
    """Keep eager's fused CPU attention (flash) kernel for this call, or decompose it to math.

    The math form materialises every score: a bmm, one fused scale/mask/softmax kernel of ours,
    a second bmm. Eager's flash kernel streams blocks of scores through cache instead. Which
    wins depends on the shape and the machine (docs/models.md), so ``config.cpu_attention`` "auto"
    times both once per machine, thread count and shape (the math side as the library calls
    our form makes: two batched products around eager's softmax) and keeps flash unless math
    is faster by ``FLASH_MARGIN``; "math" and "flash" pin the choice. Where neither runs on
    operands laid out as the traced ones, the math form is chosen: it needs no library.
    """
    return attention_decision(query, key, value, attn_mask, is_causal, scale).choice == "flash"


def attention_decision(query, key, value, attn_mask=None, is_causal=False, scale=None,
                       measure: bool = True) -> Decision | None:
    """Eager's flash kernel or our math form for this attention, and why (as ``gemm_decision``;
    None where ``measure=False`` finds no timing)."""
    mode, pinned = pinned_mode("cpu_attention", "MINICOMPILE_CPU_ATTENTION", eager="flash")
    if pinned:
        return Decision(mode, pinned)
    if not _hinted(query, key, value, attn_mask):
        return Decision("flash", note="a data-dependent size: nothing to time, eager's kernel")
    key_, candidates, what = _attention_candidates(query, key, value, attn_mask, is_causal, scale)
    if not measure:
        times = recorded_times(key_)
        return None if times is None else Decision(pick(times, "flash", FLASH_MARGIN), times=times, note=_FLASH_RULE)
    def measured(choice):
        times = recorded_times(key_)
        return Decision(choice, times=times, note=_FLASH_RULE if times else "neither library call runs on this layout")
    with real_tensors():
        choice = choose(key_, candidates, what, prefer="flash", margin=FLASH_MARGIN, otherwise="math",
                        line=lambda c: measured(c).line(what))
    if choice is None:   # not measured yet: this trace is provisional (cpu/timing.measured_first)
        return Decision("flash", note="not measured yet")
    return measured(choice)


# The math side's timing leaves out what our math form adds to the two products and the softmax:
# its scale and masks (fused into the softmax kernel, but not free) and the copies that lay out a
# strided query, key or value for the products: compiled alone, that form can lose to flash where
# the library calls tie, and win inside a whole model, which this timing does not see (docs/models.md).
FLASH_MARGIN = 0.05
_FLASH_RULE = f"flash kept unless math is {FLASH_MARGIN:.0%} faster"


def _attention_candidates(query, key, value, attn_mask, is_causal, scale) -> tuple[str, dict, str]:
    """(the cache key, the two forms to time, what they compute)."""
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    shapes = ["x".join(str(size_hint(n)) for n in t.shape) + "/" + ",".join(str(size_hint(s)) for s in t.stride())
              for t in tensors]
    key_ = cache.digest("attention", torch.__version__, cpu_name(), str(torch.get_num_threads()), str(query.dtype),
                        *shapes, f"mask={attn_mask is not None}", f"causal={is_causal}",
                        f"flash unless math {FLASH_MARGIN} faster")

    made = functools.cache(lambda: [_random_as(t) for t in tensors])

    def flash():
        q, k, v, *mask = made()
        aten._scaled_dot_product_flash_attention_for_cpu.default(
            q, k, v, 0.0, is_causal, attn_mask=mask[0] if mask else None, scale=scale)

    def math_form():
        q, k, v, *_ = made()
        if k.shape[-3] != q.shape[-3]:  # grouped-query attention: the heads repeated, as ours does
            k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], -3) for t in (k, v))
        torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)), -1), v)

    what = f"attention {' '.join(shapes)}{' masked' if attn_mask is not None else ''}{' causal' if is_causal else ''}"
    return key_, {"math": math_form, "flash": flash}, what


def _random_as(t) -> torch.Tensor:
    """Random values laid out as ``t`` (its dtype, its strides at the size hints), as a view of the
    storage it reads: a stride may be 0 (HF's repeat_kv expands one key/value head over the query
    heads; masks are expanded), and such a tensor cannot be filled in place."""
    size, stride = [size_hint(n) for n in t.shape], [size_hint(s) for s in t.stride()]
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    storage = torch.rand(extent) < 0.9 if t.dtype == torch.bool else torch.randn(extent).to(t.dtype)
    return storage.as_strided(size, stride)


def _claim_flash_attention(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    # NotImplemented: make_fx keeps the op whole (an extern call); None: decompose it to math
    if dropout_p == 0.0 and use_fused_cpu_attention(query, key, value, attn_mask, is_causal, scale):
        return NotImplemented
    return None


CPU_CLAIMS = {
    aten.addmm.default: _claim_addmm,
    aten.mm.default: _claim_mm,
    aten.linear.default: _claim_linear,
    aten.bmm.default: lambda a, b: _narrow_as_float32(aten.bmm.default, a, b),
    aten._scaled_dot_product_flash_attention_for_cpu.default: _claim_flash_attention,
    aten.convolution.default: _claim_convolution,  # channels-last input (cpu/conv_layout.py)
    aten.convolution_backward.default: _claim_convolution_backward,
}


def stamp_extern_reasons(gm: torch.fx.GraphModule) -> int:
    """``node.meta["extern_reason"]`` on each op kept whole on purpose (oneDNN's linear, eager's flash
    attention): why, with the timings that decided it. Lowering runs a stamped node as an extern
    call and prints the reason. Returns how many it stamped."""
    stamped = 0
    for node in gm.graph.nodes:
        reason = _extern_reason(node) if node.op == "call_function" and "extern_reason" not in node.meta else None
        if reason is not None:
            node.meta["extern_reason"] = reason
            stamped += 1
    return stamped


def _extern_reason(node) -> str | None:
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    if node.target is aten._scaled_dot_product_flash_attention_for_cpu.default:
        mask = node.kwargs.get("attn_mask")
        mask = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else mask
        decision = attention_decision(*vals[:3], mask, *(vals[4:5] or [False]), node.kwargs.get("scale"),
                                      measure=False) if _all_tensors(vals[:3]) else None
        return ("eager's fused CPU attention streams the scores through cache: "
                + _why(decision, "measured faster than the math form for this shape on this machine",
                       "MINICOMPILE_CPU_ATTENTION=math decomposes it"))
    if onednn_available() and node.target is torch.ops.mkldnn._linear_pointwise.default:
        post = f" with {node.args[3]} as its post-op" if len(node.args) > 3 and node.args[3] != "none" else ""
        decision = (gemm_decision(vals[0], vals[1].t(), measure=False)
                    if _all_tensors(vals[:2]) and vals[0].dim() == vals[1].dim() == 2 else None)
        return (f"oneDNN's linear{post}: "
                + _why(decision, "measured faster than MKL's mm for this shape on this machine",
                       "MINICOMPILE_CPU_GEMM=mkl uses mm"))
    return None


def _all_tensors(vals) -> bool:
    return all(isinstance(v, torch.Tensor) for v in vals)


def _why(decision: Decision | None, measured: str, other: str) -> str:
    if decision is None:
        return f"the CPU policy's choice (no timing recorded in this process; {other})"
    if decision.pinned:
        return f"pinned by {decision.pinned}"
    if decision.times:
        return f"{measured} ({decision.timings()}; {other})"
    return f"{decision.note} ({other})"
