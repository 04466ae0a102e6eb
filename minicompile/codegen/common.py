"""What every code generator shares: a kernel's arguments, its header, the stage walk, reductions.

A backend renders each FusedKernel (scheduler/kernel.py) with a KernelRenderer subclass
(CppKernel, TritonKernel). The subclass supplies the spelling: an ops handler that runs the
IR's body functions, how a value is stored or kept in registers, and how a loop stage becomes
a loop. What is the same everywhere lives here, so the two generators cannot drift apart:

- the arguments: every buffer the kernel touches in memory, in first-use order, with its role,
  dtype and shape (``KernelArg``, scheduler/kernel.py: horizontal groups read them too);
- the header comment: the FX nodes the kernel fuses, grouped by the user source line they came from;
- ``comment_text``: how text the user wrote enters a comment of the generated code;
- the stage walk: a "scalar" stage runs once per outer point, a "loop" stage is one loop over
  the inner (reduced) ranges, in the order the scheduler planned;
- reductions: each backend's ``REDUCTIONS = {kind: (identity, combine)}`` table (next to its
  op templates) and one rule for the accumulator's dtype.

This is the split of Inductor's ``codegen/common.py``, without its class hierarchy.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Callable

import torch

from minicompile.ir.expr import Expr
from minicompile.ir.nodes import Reduction, prod
from minicompile.ir.ops import compute_dtype
from minicompile.scheduler.kernel import kernel_args

ARG_REDUCTIONS = ("argmax", "argmin")  # the result is an index; the accumulator holds the values


@dataclass(frozen=True)
class GeneratedKernels:
    """What a code generator hands the runtime: one source holding every kernel of a graph."""
    source: str              # the C++ translation unit or the Python module: what DEBUG prints
    kernel_args: dict        # kernel name -> argument names in call order (pointers or tensors)
    language: str            # "cpp" | "python": syntax highlighting and file suffixes
    interpret: bool = False  # Triton with CPU tensors: the kernels run in the Triton interpreter
    # C++: the source's independent parts (its functions, without the prelude's include), which
    # the runtime may compile as separate objects in parallel; () compiles ``source`` whole
    units: tuple = ()


# /* and */ open and close a C block comment, ?? starts a trigraph (??/ is a backslash to some compilers)
_COMMENT_PAIRS = re.compile(r"/(?=\*)|\*(?=/)|\?(?=\?)")


def comment_text(text) -> str:
    """User text (a source line, a file or FX node name, an extern's reason) as one line that stays
    inside a C++ ``//`` or ``/* */`` comment and a Python ``#`` one: printable ASCII, with Python
    escapes for the rest (``café`` -> ``caf\\xe9``, a newline -> ``\\n``); ``/*``, ``*/`` and ``??``
    split by a space; a trailing backslash, which C++ joins with the next line (the kernel's
    signature) even across trailing blanks, followed by ``<newline>``."""
    text = "".join(c if " " <= c <= "~" else " " if c == "\t" else ascii(c)[1:-1] for c in str(text))
    text = _COMMENT_PAIRS.sub(lambda m: m.group() + " ", text).rstrip()
    return text + "<newline>" if text.endswith("\\") else text


INDEX_FAULT = "index_fault"   # a kernel's out-parameter: an index read from memory out of bounds


def reductions_of(nodes) -> list:
    return [n for n in nodes if isinstance(n.data, Reduction)]


def origins_by_source_line(kernel, sources: dict) -> dict:
    """User source line ("file.py:9: code", or "" when none was recorded) -> the FX nodes from
    it, in the kernel's order: one header line per source line, not one per FX node."""
    groups: dict = {}
    for origin in dict.fromkeys(o for n in kernel.nodes for o in n.origins):
        groups.setdefault(sources.get(origin, ""), []).append(origin)
    return groups


def acc_dtype(node, wide_sums_above: int | None) -> torch.dtype:
    """The dtype a reduction accumulates in: the compute dtype of its result (of its values
    for argmax/argmin, whose result is an index). A float32 sum or product of more than
    ``wide_sums_above`` elements accumulates in float64 (None: never); see each backend's
    WIDE_SUMS_ABOVE for why they differ."""
    kind = node.data.reduction_type
    if kind in ARG_REDUCTIONS:
        return compute_dtype(node.data.src_dtype)
    dt = compute_dtype(node.dtype)
    count = prod(node.data.reduction_ranges)  # symbolic: any length, so as wide as the longest
    if (wide_sums_above is not None and kind in ("sum", "prod") and dt == torch.float32
            and (isinstance(count, Expr) or count > wide_sums_above)):
        return torch.float64
    return dt


def identity_value(identity, dtype: torch.dtype):
    """A reduction table's identity for ``dtype``: +-inf (max/min) becomes the dtype's
    extreme where it has no infinity (integers, bool)."""
    if dtype.is_floating_point or not (isinstance(identity, float) and math.isinf(identity)):
        return identity
    if dtype == torch.bool:
        return identity > 0
    info = torch.iinfo(dtype)
    return info.min if identity < 0 else info.max


class KernelRenderer:
    """The skeleton of one kernel's code. A subclass sets the class parameters and writes the
    hooks ``ops(lines, known)``, ``store_or_keep(ops, node, value, known)`` and
    ``loop(stage, known) -> lines``."""

    COMMENT: str                 # line comment of the target language
    REDUCTIONS: dict             # kind -> (identity, combine), from the backend's ops module
    WIDE_SUMS_ABOVE: int | None  # see acc_dtype
    literal: Callable            # the backend's literal(value, dtype) -> str, as a staticmethod

    def __init__(self, kernel, buffers: dict, storage: dict, sources: dict):
        self.k = kernel
        self.buffers = buffers
        self.storage = storage
        self.sources = sources
        self.counter = itertools.count()  # numbers temporaries and accumulators, unique in the kernel
        self.args = kernel_args(kernel, buffers, storage)
        self.narrow: dict = {}   # loop variable -> the same over part of its range (a loop cut in pieces)

    def pointer(self, name: str) -> str:
        """The argument a buffer is read or written through (a mutated input's, for in-place ones)."""
        return self.storage.get(name, name)

    def header(self) -> list[str]:
        c, groups = self.COMMENT, origins_by_source_line(self.k, self.sources)
        if list(groups) == [""]:
            return [f"{c} {self.k.name}: fuses FX nodes {comment_text(', '.join(groups['']))}"]
        lines = [f"{c} {self.k.name}: fuses FX nodes, by the user source line they came from:"]
        for source, nodes in groups.items():
            where, _, code = source.partition(": ")
            lines.append(f"{c}   {comment_text(where) or '(no source line)'}  <- {comment_text(', '.join(nodes))}")
            if code:
                lines.append(f"{c}       {comment_text(code)}")
        return lines

    def walk_stages(self, lines: list, known: dict, separator: tuple = ()) -> list:
        """Append the kernel's stages to ``lines`` in order, each after ``separator``. ``known``:
        buffer name -> (index, value) of what the stages so far hold in registers."""
        for stage in self.k.stages:
            lines += separator
            if stage.kind == "scalar":  # once per outer point: straight into the kernel body
                self.scalar_stage(stage, lines, known)
            else:
                lines += self.loop(stage, known)
        return lines

    def scalar_stage(self, stage, lines: list, known: dict) -> None:
        """A stage computed once where it stands: its values stored, or kept in ``known``."""
        ops = self.ops(lines, known)
        for n in stage.nodes:
            self.store_or_keep(ops, n, self.evaluate(ops, n), known)

    def evaluate(self, ops, node):
        """Run ``node``'s body against ``ops`` at the kernel's loop variables; its value."""
        index, rindex = self.k.node_index(node)
        if self.narrow:
            index = [e.substitute(self.narrow) for e in index]
        if isinstance(node.data, Reduction):
            return node.data.body(ops, index, rindex)
        return node.data.body(ops, index)

    @classmethod
    def acc_dtype(cls, node) -> torch.dtype:
        return acc_dtype(node, cls.WIDE_SUMS_ABOVE)

    @classmethod
    def identity(cls, kind: str, dtype: torch.dtype) -> str:
        """The value an accumulator starts from (and masked lanes contribute), in this language."""
        return cls.literal(identity_value(cls.REDUCTIONS[kind][0], dtype), dtype)

    @classmethod
    def combine(cls, kind: str):
        return cls.REDUCTIONS[kind][1]
