"""The ``ops`` handler contract that loop bodies are written against, and the one table of
elementwise ops.

A body calls only these methods; a handler decides what they mean:

    load(buffer_name, index: Expr, dtype) -> value     read one element (at indices from memory too: expr.Indirect)
    constant(value, dtype) -> value                    a literal
    index_expr(expr: Expr, dtype) -> value             an index as a number (arange, masks)
    to_dtype(x, dtype) -> value                        cast (bf16/fp16 round, compute in fp32)
    pointwise(op: str, *args, dtype) -> value          an elementwise op from POINTWISE_OPS

``dtype`` on pointwise is the result dtype. Handlers here: PrintOps (the readable form of a
body; ir/graph.py prints every buffer with it), RecordOps (which buffers a body reads and at which index). Backends add their own.

POINTWISE_OPS is the one list of elementwise ops. The lowering registers every row's ATen
overloads (lowering/pointwise.py), ``decomp.CORE_OPS`` lists them, and each backend has one
template per row (codegen/cpp_ops.py, codegen/triton_ops.py). A new elementwise op is one row
here, one template line per backend and one sample in tests/op_table.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minicompile.ir.expr import Expr, Indirect, Prod, PythonRenderer, Sym, Var


@dataclass(frozen=True)
class PointwiseOp:
    """One elementwise op of the loop IR.

    ``aten`` names the ATen ops whose overloads lower straight to it: None is the op's own
    name, ``()`` none (a lowering of its own emits it, e.g. ``add`` for add's ``alpha``); a
    name with a namespace (``prims.fma.default``) names one overload of an op that may only
    be defined once another library loads, and is claimed by its name.
    """
    arity: int
    expensive: bool = False    # far dearer than a load: a value using it is computed once, not per reader
    bool_result: bool = False  # a test: operands compute in their promoted dtype, the result is bool
    int_div: bool = False      # a division: eager raises on an integer zero divisor, a loop cannot
    aten: tuple | None = None


_UNARY, _BINARY = PointwiseOp(1), PointwiseOp(2)
_UNARY_EXPENSIVE, _BINARY_EXPENSIVE = PointwiseOp(1, expensive=True), PointwiseOp(2, expensive=True)
_UNARY_TEST, _BINARY_TEST = PointwiseOp(1, bool_result=True), PointwiseOp(2, bool_result=True)
POINTWISE_OPS: dict[str, PointwiseOp] = {
    "abs": _UNARY, "neg": _UNARY, "reciprocal": _UNARY, "relu": _UNARY, "sign": _UNARY,
    "bitwise_not": _UNARY, "floor": _UNARY, "ceil": _UNARY, "round": _UNARY, "trunc": _UNARY,
    "sqrt": _UNARY, "rsqrt": _UNARY,
    "square": PointwiseOp(1, aten=()),  # from pow(x, 2)
    "exp": _UNARY_EXPENSIVE, "exp2": _UNARY_EXPENSIVE, "expm1": _UNARY_EXPENSIVE,
    "log": _UNARY_EXPENSIVE, "log2": _UNARY_EXPENSIVE, "log10": _UNARY_EXPENSIVE,
    "log1p": _UNARY_EXPENSIVE, "sin": _UNARY_EXPENSIVE, "cos": _UNARY_EXPENSIVE,
    "tan": _UNARY_EXPENSIVE, "asin": _UNARY_EXPENSIVE, "acos": _UNARY_EXPENSIVE,
    "atan": _UNARY_EXPENSIVE, "sinh": _UNARY_EXPENSIVE, "cosh": _UNARY_EXPENSIVE,
    "tanh": _UNARY_EXPENSIVE, "asinh": _UNARY_EXPENSIVE, "acosh": _UNARY_EXPENSIVE,
    "atanh": _UNARY_EXPENSIVE, "erf": _UNARY_EXPENSIVE, "erfc": _UNARY_EXPENSIVE,
    "sigmoid": _UNARY_EXPENSIVE,
    "logical_not": _UNARY_TEST, "isnan": _UNARY_TEST, "isinf": _UNARY_TEST,
    "add": PointwiseOp(2, aten=()), "sub": PointwiseOp(2, aten=()),  # alpha: lowering/pointwise.py
    "mul": _BINARY, "truediv": PointwiseOp(2, aten=("div",)),
    "floordiv": PointwiseOp(2, int_div=True, aten=("floor_divide",)),
    "truncdiv": PointwiseOp(2, int_div=True, aten=()),  # from div(rounding_mode="trunc")
    "remainder": PointwiseOp(2, int_div=True), "fmod": PointwiseOp(2, int_div=True),
    "pow": PointwiseOp(2, expensive=True, aten=()),  # integer pow, x**2: lowering/pointwise.py
    "maximum": _BINARY, "minimum": _BINARY, "atan2": _BINARY_EXPENSIVE,
    "xlogy": _BINARY_EXPENSIVE,
    "eq": _BINARY_TEST, "ne": _BINARY_TEST, "lt": _BINARY_TEST, "le": _BINARY_TEST,
    "gt": _BINARY_TEST, "ge": _BINARY_TEST,
    "logical_and": _BINARY_TEST, "logical_or": _BINARY_TEST, "logical_xor": _BINARY_TEST,
    "bitwise_and": _BINARY, "bitwise_or": _BINARY, "bitwise_xor": _BINARY,
    "where": PointwiseOp(3),
    "fma": PointwiseOp(3, aten=("prims.fma.default",)),  # a * b + c, rounded once (Dynamo's addcmul_)
}
TRANSCENDENTAL = frozenset(name for name, op in POINTWISE_OPS.items() if op.expensive)
BOOL_RESULT = frozenset(name for name, op in POINTWISE_OPS.items() if op.bool_result)

# Dtypes the loop IR computes in; bfloat16/float16 are stored narrow but computed as float32.
COMPUTE_DTYPE = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
SUPPORTED_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                    torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool}


def aten_overloads(name: str) -> list:
    """The ATen overloads that lower straight to pointwise op ``name``: each functional
    overload of its ATen ops that takes exactly ``arity`` tensors or numbers (``div.Tensor``,
    ``div.Scalar``; not ``div.out``, ``div.Tensor_mode`` or TorchScript's ``div.int``)."""
    row = POINTWISE_OPS[name]
    found = []
    for packet_name in (name,) if row.aten is None else row.aten:
        if "." in packet_name:  # "prims.fma.default": claimed by name (str(OpOverload))
            found.append(packet_name)
            continue
        packet = getattr(torch.ops.aten, packet_name)
        overloads = [getattr(packet, o) for o in packet.overloads()]
        claimed = [ov for ov in overloads if _elementwise(ov._schema, row.arity)]
        if not claimed:
            raise ValueError(f"aten.{packet_name} has no overload taking {row.arity} tensors or numbers")
        found += claimed
    return found


def _elementwise(schema, arity: int) -> bool:
    return (not schema.is_mutable and len(schema.arguments) == arity
            and all(str(a.type) in ("Tensor", "number") for a in schema.arguments)
            and [str(r.type) for r in schema.returns] == ["Tensor"])


def pick_template(templates: dict, op: str, operand_dtype: torch.dtype) -> str:
    """A backend's spelling of ``op``: ``templates[op]``, or its ``(op, "bool")`` /
    ``(op, "int")`` / ``(op, "float64")`` entry for bool / integer / double operands where the
    table has one."""
    if operand_dtype == torch.float64 and (op, "float64") in templates:
        return templates[(op, "float64")]
    if operand_dtype == torch.bool and (op, "bool") in templates:
        return templates[(op, "bool")]
    if not operand_dtype.is_floating_point and (op, "int") in templates:
        return templates[(op, "int")]
    return templates[op]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return COMPUTE_DTYPE.get(dtype, dtype)


class PrintOps:
    """Renders a body as readable Python-like lines: ``tmp3 = ops.exp(tmp2)``.

    Loads name their buffer and index, casts and constants their dtype. ``reduction`` is not
    part of the contract bodies call: the printer uses it to show what a Reduction accumulates.
    """

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

    def reduction(self, kind, value):
        return self._emit(f"ops.reduction({kind!r}, {value})")


def indirect_atoms(e: Expr) -> list:
    """The outermost Indirect atoms of ``e`` in order, each once (those inside one: its own index's)."""
    out = []
    for a, _ in e.terms:
        found = [a] if isinstance(a, Indirect) else [] if isinstance(a, (Var, Sym)) else \
            [x for f in a.factors for x in indirect_atoms(Expr.of(f))] if isinstance(a, Prod) else indirect_atoms(a.arg)
        out += [x for x in found if x not in out]
    return out


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
    exprs: list = field(default_factory=list)   # the index expressions the body computes with

    def load(self, name, index, dtype):   # an index read from memory is a read of its buffer first
        for a in indirect_atoms(index):
            self.load(a.buffer, a.index, a.dtype)
        self.reads.append(Read(name, index))
        return None

    def constant(self, value, dtype):
        return None

    def checks_indices(self) -> bool:
        """Whether the body checks an index read from memory (an expr.Indirect with a check)."""
        return any(a.check for e in self.exprs + [r.index for r in self.reads] for a in indirect_atoms(e))

    def index_expr(self, expr, dtype):
        for a in indirect_atoms(expr):
            self.load(a.buffer, a.index, a.dtype)
        self.exprs.append(expr)
        return None

    def to_dtype(self, x, dtype):
        return None

    def pointwise(self, op, *args, dtype):
        self.op_count += 1
        self.ops_used.add(op)
        return None
