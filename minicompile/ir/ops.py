"""The ``ops`` handler contract that loop bodies are written against.

A body calls only these methods; a handler decides what they mean:

    load(buffer_name, index: Expr, dtype) -> value     read one element
    constant(value, dtype) -> value                    a literal
    index_expr(expr: Expr, dtype) -> value             an index as a number (arange, masks)
    to_dtype(x, dtype) -> value                        cast (bf16/fp16 round, compute in fp32)
    pointwise(op: str, *args, dtype) -> value          an elementwise op from POINTWISE_OPS
    indirect(x, size) -> Expr                          a loaded value used as an index

``dtype`` on pointwise is the result dtype. Handlers here: PrintOps (the readable form of a
body), RecordOps (which buffers a body reads and at which index). Backends add their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minicompile.ir.expr import Expr, Indirect, PythonRenderer

# Every elementwise op a body may use, with its arity. A backend renders each of these.
POINTWISE_OPS = {
    **{name: 1 for name in (
        "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
        "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
        "acosh", "atanh", "erf", "erfc", "sigmoid", "relu", "floor", "ceil", "round", "trunc",
        "sign", "logical_not", "bitwise_not", "isnan", "isinf", "square")},
    **{name: 2 for name in (
        "add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow",
        "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
        "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")},
    "where": 3,
    "fma": 3,   # a * b + c rounded once (Dynamo's rewrite of addcmul_ with a value)
}

# Dtypes the loop IR computes in; bfloat16/float16 are stored narrow but computed as float32.
COMPUTE_DTYPE = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
SUPPORTED_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                    torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool}


# Ops that cost far more than a load: a value using one is computed once, not per reader.
TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                  "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
                  "sigmoid", "pow", "atan2"}



def pick_template(templates: dict, op: str, operand_dtype: torch.dtype) -> str:
    """A backend's spelling of ``op``: ``templates[op]``, or its ``(op, "bool")`` /
    ``(op, "int")`` entry for bool / integer operands where the table has one."""
    if operand_dtype == torch.bool and (op, "bool") in templates:
        return templates[(op, "bool")]
    if not operand_dtype.is_floating_point and (op, "int") in templates:
        return templates[(op, "int")]
    return templates[op]

def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return COMPUTE_DTYPE.get(dtype, dtype)


class PrintOps:
    """Renders a body as readable Python-like lines: ``tmp3 = ops.exp(tmp2)``."""

    def __init__(self):
        self.lines: list[str] = []
        self._n = 0
        self._r = PythonRenderer()

    def _emit(self, rhs: str) -> str:
        name = f"tmp{self._n}"
        self._n += 1
        self.lines.append(f"{name} = {rhs}")
        return name

    def load(self, name, index, dtype):
        return self._emit(f"ops.load({name!r}, {self._r.render(index)})")

    def constant(self, value, dtype):
        return self._emit(f"ops.constant({value!r}, {str(dtype).replace('torch.', '')})")

    def index_expr(self, expr, dtype):
        return self._emit(f"ops.index_expr({self._r.render(expr)}, {str(dtype).replace('torch.', '')})")

    def to_dtype(self, x, dtype):
        return self._emit(f"ops.to_dtype({x}, {str(dtype).replace('torch.', '')})")

    def pointwise(self, op, *args, dtype):
        return self._emit(f"ops.{op}({', '.join(map(str, args))})")

    def indirect(self, x, size):
        name = self._emit(f"ops.indirect({x}, {size})")
        return Expr.of(Indirect(name, size))


@dataclass(frozen=True)
class Read:
    name: str
    index: Expr


@dataclass
class RecordOps:
    """Collects the buffers a body reads and the index of each read; computes nothing."""
    reads: list = field(default_factory=list)
    op_count: int = 0
    ops_used: set = field(default_factory=set)

    def load(self, name, index, dtype):
        self.reads.append(Read(name, index))
        return None

    def constant(self, value, dtype):
        return None

    def index_expr(self, expr, dtype):
        return None

    def to_dtype(self, x, dtype):
        return None

    def pointwise(self, op, *args, dtype):
        self.op_count += 1
        self.ops_used.add(op)
        return None

    def indirect(self, x, size):
        return Expr.of(Indirect(f"ind{len(self.reads)}", size))
