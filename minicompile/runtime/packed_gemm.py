"""The CPU's float32 product template: ``a @ b (+ bias)`` with ``b`` packed once (packed_gemm.cpp).

An inference weight is packed into 16-column panels once per version (cpu/prepare.py computes
``pack_weight(t(W))`` as a prepared value); each call then runs AVX2 6x16 register tiles over
the panels, the bias added as the tiles are stored. Two ops carry it through the ATen graph
(cpu/gemm_template.py rewrites products into them), with fake forms for tracing:

    minicompile::pack_weight(b)            b: K x N, any strides -> panels [ceil(N/16), K, 16]
    minicompile::packed_mm(a, packed, bias, n)   a: M x K -> M x n

The wrapper calls ``packed_mm_into`` (codegen/wrapper.py OUT_VARIANTS) with the result's pooled
buffer: one ctypes call with pointers and sizes. The library is built once per machine and
cached like the generated kernels (runtime/cpp_build.py).
"""
from __future__ import annotations

import functools
import os

import torch

from minicompile.runtime import cpp_build

PANEL = 16


@functools.cache
def library() -> cpp_build.KernelLibrary:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "packed_gemm.cpp")) as f:
        return cpp_build.load(f.read(), {"mc_pack": 6, "mc_gemm": 10})


def packed_size(k: int, n: int) -> list:
    return [-(-n // PANEL), k, PANEL]


@torch.library.custom_op("minicompile::pack_weight", mutates_args=())
def pack_weight(b: torch.Tensor) -> torch.Tensor:
    """``b`` (K x N, float32, any strides) as zero-padded panels of 16 columns."""
    out = b.new_empty(packed_size(*b.shape))
    library().mc_pack(b.data_ptr(), b.stride(0), b.stride(1), b.shape[0], b.shape[1], out.data_ptr())
    return out


@pack_weight.register_fake
def _(b):
    return b.new_empty(packed_size(*b.shape))


@torch.library.custom_op("minicompile::packed_mm", mutates_args=())
def packed_mm(a: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """``a @ b + bias`` for the ``b`` that ``pack_weight`` packed (n columns)."""
    return packed_mm_into(a, packed, bias, n, out=a.new_empty(a.shape[0], n))


@packed_mm.register_fake
def _(a, packed, bias, n):
    return a.new_empty(a.shape[0], n)


def packed_mm_into(a, packed, bias, n, out):
    """``packed_mm`` into ``out`` (row-major, M x n); ``a`` read in place when row- or column-major."""
    if a.stride(1) != 1 and a.stride(0) != 1:
        a = a.contiguous()
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if a.shape[1] == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand_as(out))
    column = a.stride(1) != 1
    library().mc_gemm(a.data_ptr(), a.stride(1) if column else a.stride(0), column, packed.data_ptr(),
                      None if bias is None else bias.data_ptr(), out.data_ptr(), out.stride(0), a.shape[0], n, a.shape[1])
    return out
