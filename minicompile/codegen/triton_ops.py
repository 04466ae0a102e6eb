"""Triton spellings of the loop IR's values: types, literals, one template per pointwise op.

Mirrors cpp_ops.py. Math that Triton leaves to CUDA's libdevice goes through ``libdevice``,
which the generated module takes from minicompile.runtime (the real one on a GPU, a numpy
stand-in under ``TRITON_INTERPRET=1``). Helpers whose semantics Triton does not have
(NaN-propagating max/min, Python's floor division and remainder, first-index argmax) are
``@triton.jit`` functions in PRELUDE, the top of every generated module.
"""
from __future__ import annotations

import math

import torch

from minicompile.ir.expr import Renderer
from minicompile.ir.ops import pick_template

TL = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}

# One template per row of ir.ops.POINTWISE_OPS; (op, "int") / (op, "bool") override it for
# integer / bool operands.
TEMPLATES = {
    "abs": "tl.abs({0})", "neg": "(-{0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "log10": "libdevice.log10({0})", "log1p": "libdevice.log1p({0})", "sqrt": "tl.sqrt_rn({0})",
    "rsqrt": "(1 / tl.sqrt_rn({0}))", "reciprocal": "(1 / {0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "tan": "libdevice.tan({0})", "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})", "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "tanh": "libdevice.tanh({0})", "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})", "erf": "tl.erf({0})",
    "erfc": "libdevice.erfc({0})", "sigmoid": "(1 / (1 + tl.exp(-{0})))",
    "relu": "tl.where({0} < 0, 0, {0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "round": "libdevice.nearbyint({0})", "trunc": "libdevice.trunc({0})", "sign": "mc_sign({0})",
    "logical_not": "({0} == 0)", "bitwise_not": "(~{0})", "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float('inf'))", "square": "({0} * {0})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "mc_floordiv_f({0}, {1})", "truncdiv": "libdevice.trunc({0} / {1})",
    "remainder": "mc_remainder_f({0}, {1})", "fmod": "libdevice.fmod({0}, {1})",
    "pow": "libdevice.pow({0}, {1})", "maximum": "mc_maximum({0}, {1})", "minimum": "mc_minimum({0}, {1})",
    "atan2": "libdevice.atan2({0}, {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))", "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) != ({1} != 0))",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "xlogy": "tl.where({1} != {1}, {1}, tl.where({0} == 0, 0.0, {0} * tl.log({1})))",
    "where": "tl.where({0}, {1}, {2})",
    "fma": "tl.fma({0}, {1}, {2})", ("fma", "int"): "({0} * {1} + {2})",
    # tl.sqrt_rn is float32 only (a CompilationError for float64 on a GPU; the interpreter does
    # not check): float64's tl.sqrt is the IEEE-rounded sqrt.rn.f64
    ("sqrt", "float64"): "tl.sqrt({0})", ("rsqrt", "float64"): "(1 / tl.sqrt({0}))",
    ("floordiv", "int"): "mc_floordiv_i({0}, {1})", ("truncdiv", "int"): "({0} // {1})",
    ("remainder", "int"): "mc_remainder_i({0}, {1})", ("fmod", "int"): "({0} % {1})",
    ("isnan", "int"): "({0} != {0})", ("isinf", "int"): "({0} != {0})",
    ("bitwise_not", "bool"): "({0} == 0)", ("sign", "int"): "mc_sign({0})",
    ("maximum", "bool"): "({0} | {1})", ("minimum", "bool"): "({0} & {1})",
    ("add", "bool"): "({0} | {1})", ("mul", "bool"): "({0} & {1})",
}

def template(op: str, operand_dtype: torch.dtype) -> str:
    return pick_template(TEMPLATES, op, operand_dtype)


def literal(value, dtype: torch.dtype) -> str:
    """A constant of ``dtype``. Python literals are weakly typed in Triton (they take the
    other operand's type), except that a float literal is float32: float64 ones are spelled out."""
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        text = repr(v) if math.isfinite(v) else f"float('{v}')"
        return f"tl.full([], {text}, tl.float64)" if dtype == torch.float64 else text
    v = int(value)
    if dtype == torch.int64 and not -2 ** 31 <= v < 2 ** 31:
        return f"tl.full([], {v}, tl.int64)"
    return str(v)


class TritonRenderer(Renderer):
    """Index expressions: Triton's integer // and % truncate like C, as the C++ backend's do."""

    def floordiv(self, a, d):
        return f"(({a}) // {d})"

    def mod(self, a, d):
        return f"(({a}) % {d})"

    def clamp(self, a, lo, hi):
        return f"tl.minimum(tl.maximum({a}, {lo}), {hi})"


PRELUDE = '''\
import triton
import triton.language as tl

from minicompile.runtime.triton_interpret import interpreting, pick_libdevice

libdevice = pick_libdevice()  # CUDA's libdevice on a GPU; numpy in the Triton interpreter


# float32 rounded to bfloat16's precision, to nearest even as eager rounds; NaN stays NaN. On a
# GPU that is the conversion instruction (one cvt.rn.bf16.f32 each way); the Triton
# interpreter's .to(tl.bfloat16) truncates, so there the rounding is spelled in integer bits
# (seven integer operations an element: a bf16 chain of six ops ran 1.7x Inductor's time on an H200).
MC_HARDWARE_BF16 = tl.constexpr(not interpreting())


@triton.jit
def mc_round_bf16(x):
    if MC_HARDWARE_BF16:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


# NaN-propagating max/min, as torch.maximum/minimum (and amax/amin) behave. Nested wheres,
# not `(a != a) | (a > b)`: Triton's interpreter cannot `|` a 0-d bool (a float64 constant's
# test) with a block (OpInfo linalg.matrix_rank through Triton).
@triton.jit
def mc_maximum(a, b):
    return tl.where(a != a, a, tl.where(a > b, a, b))


@triton.jit
def mc_minimum(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


@triton.jit
def mc_add(a, b):
    return a + b


@triton.jit
def mc_mul(a, b):
    return a * b


@triton.jit
def mc_or(a, b):
    return a | b


@triton.jit
def mc_and(a, b):
    return a & b


# (value, index) pairs: the larger value wins, NaN beats everything, ties go to the first index.
@triton.jit
def mc_argmax_combine(a, ia, b, ib):
    a_nan = a != a
    b_nan = b != b
    take_a = (a > b) | ((a == b) & (ia < ib)) | (a_nan & ~b_nan) | (a_nan & b_nan & (ia < ib))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


@triton.jit
def mc_argmin_combine(a, ia, b, ib):
    a_nan = a != a
    b_nan = b != b
    take_a = (a < b) | ((a == b) & (ia < ib)) | (a_nan & ~b_nan) | (a_nan & b_nan & (ia < ib))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


# Python's floor division and remainder (the sign follows the divisor); Triton's truncate.
@triton.jit
def mc_floordiv_i(a, b):
    q = a // b
    return tl.where((q * b != a) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def mc_remainder_i(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def mc_floordiv_f(a, b):
    m = libdevice.fmod(a, b)
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = tl.floor(d)
    f = tl.where(d - f > 0.5, f + 1, f)
    return tl.where(b == 0, a / b, tl.where(d == 0, 0.0 * (a / b), f))


@triton.jit
def mc_remainder_f(a, b):
    m = libdevice.fmod(a, b)
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def mc_sign(a):
    s = tl.where(a > 0, 1, tl.where(a < 0, -1, 0)).to(a.dtype)
    return tl.where(a != a, a, s)
'''


# Reductions: kind -> (identity, combine). The identity is a number (-inf/inf become the
# dtype's extremes where it has none, codegen/common.py); combine is the @triton.jit function
# (in PRELUDE) that tl.reduce and the looped accumulators call. tl.sum and friends are
# themselves jit functions, which the interpreter cannot call unless triton was imported in
# interpreter mode; these are ours.
REDUCTIONS = {
    "sum": (0, "mc_add"), "prod": (1, "mc_mul"), "any": (0, "mc_or"), "all": (1, "mc_and"),
    "max": (-math.inf, "mc_maximum"), "min": (math.inf, "mc_minimum"),
    "argmax": (-math.inf, "mc_argmax_combine"), "argmin": (math.inf, "mc_argmin_combine"),
}
