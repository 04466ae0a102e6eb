"""C++ spellings of the loop IR's values: types, literals and one template per pointwise op."""
from __future__ import annotations

import math
import struct

import torch

from minicompile.codegen.common import INDEX_FAULT
from minicompile.ir.expr import Expr, Renderer, Var
from minicompile.ir.ops import indirect_atoms, pick_template

CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t",
    torch.float16: "_Float16", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t",
    torch.int32: "int32_t", torch.int64: "int64_t", torch.bool: "bool",
}

# One template per row of ir.ops.POINTWISE_OPS; (op, "int") overrides for integer/bool operands.
# cos adds +0.0f: the same value (cos is even, so -0.0 -> +0.0 changes nothing), but no longer
# the same operand as a neighbouring sin(x), so g++ does not merge the pair into a scalar
# sincosf call and both vectorise.
TEMPLATES = {
    "abs": "std::abs({0})", "neg": "(-{0})", "exp": "mc_exp({0})", "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})", "log": "std::log({0})", "log2": "std::log2({0})",
    "log10": "std::log10({0})", "log1p": "std::log1p({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "(1 / std::sqrt({0}))", "reciprocal": "(1 / {0})", "sin": "std::sin({0})",
    "cos": "std::cos({0} + 0.0f)", "tan": "std::tan({0})", "asin": "std::asin({0})", "acos": "std::acos({0})",
    "atan": "std::atan({0})", "sinh": "std::sinh({0})", "cosh": "std::cosh({0})",
    "tanh": "std::tanh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})", "erf": "mc_erf({0})", "erfc": "std::erfc({0})",
    "sigmoid": "(1 / (1 + mc_exp(-{0})))", "relu": "({0} < 0 ? 0 : {0})",
    "floor": "std::floor({0})", "ceil": "std::ceil({0})", "round": "std::nearbyint({0})",
    "trunc": "std::trunc({0})", "sign": "mc_sign({0})", "logical_not": "(!{0})",
    "bitwise_not": "(~{0})", "isnan": "std::isnan({0})", "isinf": "std::isinf({0})",
    "square": "({0} * {0})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "mc_floordiv_f({0}, {1})", "truncdiv": "std::trunc({0} / {1})",
    "remainder": "mc_remainder_f({0}, {1})", "fmod": "std::fmod({0}, {1})",
    "pow": "std::pow({0}, {1})", "maximum": "mc_max({0}, {1})", "minimum": "mc_min({0}, {1})",
    "atan2": "std::atan2({0}, {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
    "logical_xor": "(static_cast<bool>({0}) != static_cast<bool>({1}))",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "xlogy": "(std::isnan({1}) ? {1} : {0} == 0 ? 0 : {0} * std::log({1}))",
    "where": "mc_where({0}, {1}, {2})", ("where", "int"): "({0} ? {1} : {2})",  # prelude: a blend, not a branch
    "fma": "std::fma({0}, {1}, {2})", ("fma", "int"): "({0} * {1} + {2})",
    ("abs", "int"): "({0} < 0 ? -{0} : {0})",
    ("floordiv", "int"): "mc_floordiv_i({0}, {1})", ("truncdiv", "int"): "({0} / {1})",
    ("remainder", "int"): "mc_remainder_i({0}, {1})", ("fmod", "int"): "({0} % {1})",
    ("isnan", "int"): "false", ("isinf", "int"): "false",
    ("bitwise_not", "bool"): "(!{0})", ("sign", "int"): "(({0} > 0) - ({0} < 0))",
    ("maximum", "bool"): "({0} || {1})", ("minimum", "bool"): "({0} && {1})",
    ("add", "bool"): "({0} || {1})", ("mul", "bool"): "({0} && {1})",
}


def template(op: str, operand_dtype: torch.dtype) -> str:
    return pick_template(TEMPLATES, op, operand_dtype)


def literal(value, dtype: torch.dtype) -> str:
    """A constant of ``dtype``, with the value eager computes with: a Python float is rounded
    to float32 by ``static_cast`` unless float32 holds it exactly (then ``0.5f`` is it)."""
    ctype = CTYPE[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(v):
            inf = f"std::numeric_limits<{ctype}>::infinity()"
            return f"(-{inf})" if v < 0 else inf  # parenthesised: (-{0}) must not become --std::...
        if dtype == torch.float64 or dtype == torch.float32 and _exact_in_float32(v):
            text = repr(v) + ("f" if dtype == torch.float32 else "")
            return f"({text})" if text.startswith("-") else text  # (-{0}) must not become --0.5f
        return f"static_cast<{ctype}>({v!r})"
    v = int(value)
    info = torch.iinfo(dtype)
    if v != 0 and v in (info.min, info.max):  # by name: -2**63 has no literal
        return f"std::numeric_limits<{ctype}>::{'min' if v == info.min else 'max'}()"
    if dtype == torch.int64:
        return f"INT64_C({v})"
    return f"static_cast<{ctype}>({v})"


def _exact_in_float32(v: float) -> bool:
    return abs(v) <= torch.finfo(torch.float32).max and struct.unpack("f", struct.pack("f", v))[0] == v


class CppRenderer(Renderer):
    def floordiv(self, a, d):
        return f"(({a}) / {d})"

    def mod(self, a, d):
        return f"(({a}) % {d})"

    def clamp(self, a, lo, hi):
        return f"std::min<int64_t>(std::max<int64_t>({a}, {lo}), {hi})"


def checked_index(ops, index: Expr) -> Expr:
    """``index`` with each index read from memory in it (expr.Indirect) read by CppOps ``ops``, checked
    (the prelude's mc_index, which records one out of bounds at INDEX_FAULT) and named."""
    names = {}
    for a in indirect_atoms(index):
        value, step = ops.load(a.buffer, a.index, a.dtype), next(ops.planned)
        check = f"mc_index({value}, {CppRenderer().render(Expr.of(a.size))}, {a.check}, {a.dim}, {INDEX_FAULT})"
        names[a] = Var(ops._tmp(torch.int64, check, step).expr if a.check else value.expr, a.size)
    return index.substitute(names) if names else index


# Reductions: kind -> (identity, combine). The identity is a number (-inf/inf become the
# dtype's extremes where it has none, codegen/common.py); combine is a C++ expression of the
# accumulator {0} and a value {1}. argmax/argmin carry a value and its index together, in a
# compare-and-keep that CppKernel writes out: they have no combine expression.
REDUCTIONS = {
    "sum": (0, "{0} + {1}"), "prod": (1, "{0} * {1}"), "any": (0, "{0} || {1}"), "all": (1, "{0} && {1}"),
    "max": (-math.inf, "mc_max({0}, {1})"), "min": (math.inf, "mc_min({0}, {1})"),
    "argmax": (-math.inf, None), "argmin": (math.inf, None),
}
