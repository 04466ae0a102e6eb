"""The CPU backend's ATen policy: which ops run as vendor-library calls there, on purpose.

The decomposition table (decomp/) says what ops mean, on any device. The choices here are
the CPU's, measured on the 2-core AVX-512 machine: they depend on the device, on sizes and
on knobs, and each keeps an op whole that lowering then runs as an extern call.

    CPU_CLAIMS          op -> claim(*args, **kwargs): the claimed result, or None to defer to
                        the device-neutral decomposition (thunder's executors claim ops the same way)
    use_onednn_linear   a float32 product as oneDNN's matmul or MKL's sgemm, the faster here
    claim_convolution   NHWC input for oneDNN, inside inference traces only (cpu/conv_layout.py)
    fold_gelu_into_onednn_linear   an ATen pass (aot/passes.py): GELU as oneDNN's post-op
    EXTERN_ON_PURPOSE   op -> reason(args): why lowering leaves it to the vendor library

A claim checks the device of its tensors, so tracing a CUDA graph is untouched.
"""
from __future__ import annotations

import functools
import math

import torch

from minicompile.cpu.conv_layout import claim_convolution
from minicompile.config import config
from minicompile.runtime import cache
from minicompile.cpu.timing import cpu_name, library_choice, real_tensors

aten = torch.ops.aten


# -- matrix products: MKL's sgemm or oneDNN's matmul ---------------------------------------------

def use_onednn_linear(mat1, mat2) -> bool:
    """Run the float32 CPU product ``mat1 @ mat2`` as oneDNN's linear rather than ``aten.mm``.

    ``aten.mm`` (and eager's ``nn.Linear``) calls MKL's sgemm. Which library is faster depends
    on the machine: on the 2-core AMD EPYC here oneDNN's matmul took 0.46-0.54x MKL's time on
    every shape measured, 128x192x576 to 2048x1024x4096, row- or column-major operands, one or
    two threads (MKL takes a generic code path on non-Intel CPUs). On other machines MKL can
    win (an earlier Intel one: by 6-14% from 512 rows up). So ``config.cpu_gemm`` "auto"
    measures both at the product's shape (its size hints, for a symbolic size) once per
    machine, thread count and shape (cpu/timing.library_choice); "mkl" and "onednn" pin
    the choice. A bias of the product is added inside oneDNN's call, and an exact GELU after it
    becomes its post-op (``fold_gelu_into_onednn_linear``).
    """
    mode = _pinned("cpu_gemm", eager="mkl")
    if mode == "mkl" or not _onednn_can_run(mat1, mat2):
        return False
    if mode == "onednn":
        return True
    return _measured_gemm(*(_hint(s) for s in (*mat1.shape, mat2.shape[1])),
                          _layout(mat1), _layout(mat2)) == "onednn"


def _pinned(knob: str, eager: str) -> str:
    """A library knob's value (config checked it); ``eager``, eager's own library, when
    cpu_libraries is "eager"."""
    return eager if config.cpu_libraries == "eager" else getattr(config, knob)


def _onednn_can_run(mat1, mat2) -> bool:
    """CPU float32 matrices of known strides, none of them broadcast (a zero stride)."""
    if not (mat1.device.type == "cpu" and mat1.dtype == mat2.dtype == torch.float32
            and mat1.dim() == mat2.dim() == 2 and _onednn_available()):
        return False
    if not _hinted(mat1, mat2):  # a data-dependent size, which may be 0: aten.mm takes any
        return False
    for t in (mat1, mat2):
        strides = t.stride()
        if not all(isinstance(s, int) for s in strides):
            return False
        if any(s == 0 and _hint(n) > 1 for s, n in zip(strides, t.shape)) or any(_hint(n) == 0 for n in t.shape):
            return False
    return True


def _hinted(*tensors) -> bool:
    """Every size has a value in the traced example: none is data-dependent (nonzero's row count
    has no hint)."""
    return all(isinstance(n, int) or n.node.has_hint() for t in tensors if t is not None for n in t.shape)


def _hint(size) -> int:
    """A size's value in the example the graph was traced with (a symbol's hint), guard-free."""
    return size if isinstance(size, int) else size.node.hint


def _layout(t) -> str:
    return "row" if t.stride(1) == 1 else "column" if t.stride(0) == 1 else "strided"


def _measured_gemm(m: int, k: int, n: int, layout1: str, layout2: str) -> str:
    """library_choice keeps the answer (in this process and on disk); the operands are only
    made when it measures."""
    def operand(rows, cols, layout):
        return torch.randn(cols, rows).t() if layout == "column" else torch.randn(rows, cols)
    operands = functools.cache(lambda: (operand(m, k, layout1), operand(k, n, layout2)))
    linear = torch.ops.mkldnn._linear_pointwise.default
    key = cache.digest("gemm", torch.__version__, cpu_name(), str(torch.get_num_threads()),
                       f"{m}x{k}x{n}", layout1, layout2, f"mkl unless {ONEDNN_MARGIN} faster")
    with real_tensors():
        return library_choice(key, {"mkl": lambda: torch.mm(*operands()),
                                    "onednn": lambda: linear(operands()[0], operands()[1].t(), None, "none", [], "")},
                              f"float32 product {m}x{k} ({layout1}) @ {k}x{n} ({layout2})",
                              prefer="mkl", margin=ONEDNN_MARGIN, otherwise="mkl")


# oneDNN's linear must be this much faster alone to be chosen: it allocates its result on every
# call (aten.mm writes into the wrapper's pooled buffer), and inside a graph those fresh
# allocations were page-faulted in again and again (Swin: 1,200 faults a call, all in its 8
# oneDNN products, once the process's heap had been churned; 0 in its 19 mm calls).
ONEDNN_MARGIN = 0.1


@functools.lru_cache(maxsize=None)
def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _claim_addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if beta == 1 and alpha == 1 and self.dim() == 1 and self.shape[0] == mat2.shape[1] and self.dtype == mat1.dtype \
            and use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), self, "none", [], "")
    return None


def _claim_mm(mat1, mat2):
    if use_onednn_linear(mat1, mat2):
        return torch.ops.mkldnn._linear_pointwise.default(mat1, aten.t.default(mat2), None, "none", [], "")
    return None


def fold_gelu_into_onednn_linear(gm: torch.fx.GraphModule) -> int:
    """Replace ``gelu(linear(x, W, b))`` by one oneDNN linear with GELU as its post-op.

    Runs on the traced ATen graph, where ``_claim_addmm`` left a
    ``mkldnn._linear_pointwise(x, W, b, "none")`` and ``decomp/activations.py`` wrote the exact
    GELU as ``0.5 * y * (erf(y / sqrt(2)) + 1)``. When the linear's value feeds nothing else,
    oneDNN applies GELU while the product is still in registers: the MLP's separate GELU
    kernel (0.43-0.48 ms of ~14 ms) and its 4 MiB intermediate are gone. Returns the number
    of folds.
    """
    linear = torch.ops.mkldnn._linear_pointwise.default if _onednn_available() else None
    folds = 0
    for node in list(gm.graph.nodes):
        if linear is None or node.target is not linear or tuple(node.args[3:]) != ("none", [], ""):
            continue
        match = _exact_gelu_of(node)
        if match is None:
            continue
        out, dead = match
        with gm.graph.inserting_before(out):
            fused = gm.graph.call_function(linear, (*node.args[:3], "gelu", [], "none"))
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        for n in [out, *dead, node]:
            gm.graph.erase_node(n)
        folds += 1
    if folds:
        gm.recompile()
    return folds


def _exact_gelu_of(y):
    """(the GELU's result node, its other nodes) if y's only users compute GELU(y), else None."""
    def scalar_mul(n, c):
        return (n.target is aten.mul.Scalar and n.args[0] is y and isinstance(n.args[1], float)
                and abs(n.args[1] - c) < 1e-12)

    users = list(y.users)
    half = [u for u in users if scalar_mul(u, 0.5)]
    scaled = [u for u in users if scalar_mul(u, 1.0 / math.sqrt(2.0))]
    if len(users) != 2 or len(half) != 1 or len(scaled) != 1:
        return None
    half, scaled = half[0], scaled[0]
    erf = _only_user(scaled)
    one = _only_user(erf) if erf is not None and erf.target is aten.erf.default else None
    if one is None or one.target is not aten.add.Scalar or one.args[1] != 1.0:
        return None
    out = _only_user(one)
    if out is None or out.target is not aten.mul.Tensor or set(out.args) != {half, one} or _only_user(half) is not out:
        return None
    return out, [one, erf, scaled, half]


def _only_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None


# -- fused CPU attention -----------------------------------------------------------------------

def use_fused_cpu_attention(query, key, value, attn_mask=None, is_causal=False, scale=None) -> bool:
    """Keep eager's fused CPU attention (flash) kernel for this call, or decompose it to math.

    The math form materialises every score: a bmm, one fused scale/mask/softmax kernel of ours,
    a second bmm. Eager's flash kernel streams blocks of scores through cache instead. Which
    wins depends on the shape and the machine: on the 2-core AMD EPYC here flash won at every
    attention measured alone (Swin's 32x3x49x49 windows: 351 us against 487 us for our math form;
    ViT's 2x3x197x197: 584 against 698; GPT-2's causal 4x4x128x128: 654 against 778), where an
    earlier machine ran 49-wide windows faster as math; inside the whole ViT, though, math ran
    2-3% faster. So ``config.cpu_attention`` "auto"
    times both once per machine, thread count and shape (the math side as the library calls
    our form makes: two batched products around eager's softmax) and keeps flash unless math
    is faster by ``FLASH_MARGIN``; "math" and "flash" pin the choice. Where neither runs on
    operands laid out as the traced ones, the math form is chosen: it needs no library.
    """
    mode = _pinned("cpu_attention", eager="flash")
    if mode != "auto":
        return mode == "flash"
    if not _hinted(query, key, value, attn_mask):  # a data-dependent size: nothing to time, eager's kernel
        return True
    return _measured_attention(query, key, value, attn_mask, is_causal, scale) == "flash"


# The math side's timing leaves out what our math form adds to the two products and the softmax:
# its scale and masks (fused into the softmax kernel, but not free) and the copies that lay out a
# strided query, key or value for the products. Compiled alone, that form lost to flash by 7-20% on
# this machine at shapes where the library calls tied (ViT's: 0.600 / 0.590 ms); inside the whole
# ViT it won by 2-3%, which this timing does not see (docs/models.md).
FLASH_MARGIN = 0.05


def _measured_attention(query, key, value, attn_mask, is_causal, scale) -> str:
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    shapes = ["x".join(str(_hint(n)) for n in t.shape) + "/" + ",".join(str(_hint(s)) for s in t.stride())
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
    with real_tensors():
        return library_choice(key_, {"math": math_form, "flash": flash}, what, prefer="flash", margin=FLASH_MARGIN,
                              otherwise="math")


def _random_as(t) -> torch.Tensor:
    """Random values laid out as ``t`` (its dtype, its strides at the size hints), as a view of the
    storage it reads: a stride may be 0 (HF's repeat_kv expands one key/value head over the query
    heads; masks are expanded), and such a tensor cannot be filled in place."""
    size, stride = [_hint(n) for n in t.shape], [_hint(s) for s in t.stride()]
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
    aten._scaled_dot_product_flash_attention_for_cpu.default: _claim_flash_attention,
    aten.convolution.default: claim_convolution,   # channels-last input (cpu/conv_layout.py)
}


def _onednn_reason(args) -> str:
    post = " with GELU folded in" if len(args) > 3 and args[3] == "gelu" else ""
    return (f"oneDNN's linear{post}: faster than MKL's mm for this shape on this machine, or pinned "
            "(MINICOMPILE_CPU_GEMM=mkl uses mm)")


EXTERN_ON_PURPOSE = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: lambda args: (
        "eager's fused CPU attention streams the scores through cache; for this shape it measured "
        "faster than the math form on this machine, or is pinned (MINICOMPILE_CPU_ATTENTION=math "
        "decomposes it)"),
    torch.ops.mkldnn._linear_pointwise.default: _onednn_reason,
}
