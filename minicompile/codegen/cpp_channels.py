"""Per-channel values of a C++ pointwise kernel, computed once before its loops.

A kernel over NHWC data (or any row-major array) whose innermost loop runs over channels, or
over NCHW data whose middle loop does, often computes, per element, values that depend on the
channel alone: inference BatchNorm's
``weight / sqrt(running_var + eps)`` and ``bias - mean * scale``. g++ cannot move them out of
the loops (the loads they start from may alias the kernel's stores). The kernel's plan
(codegen/cpp_plan.py) gives such values the channel level, and CppOps (codegen/cpp.py) puts each, with the loads and hoisted values it is computed from, into an array
that one loop over the channels fills before the kernel's loops; the loop body then reads
``tmp3_c[x2]``. The values and their order of operations are those of the loop they replace.

    channel = ChannelValues(channel_sizes(kernel))   # when that is not empty
    expr = channel.add(x2, "tmp3", "float", "(1 / std::sqrt(tmp2_c[x2]))")   # -> "tmp3_c[x2]"
    lines = hoisted + channel.block() + loops
"""
from __future__ import annotations

from dataclasses import dataclass, field

# A kernel precomputes values per index of one of its loops when that loop's range is at most
# this long (stack arrays) and its loops run at least CHANNEL_MIN_REPEATS times over it.
CHANNEL_MAX = 2048
CHANNEL_MIN_REPEATS = 4


@dataclass
class ChannelValues:
    """Values of a pointwise kernel that depend on one loop variable alone (a channel of NHWC
    data, the innermost loop; or of NCHW data, an outer one): BatchNorm's
    ``weight / sqrt(var + eps)`` and shift. In the loop they were computed per element (a vector
    sqrt and two divisions per 8 floats: EfficientNet's BatchNorm+SiLU kernels spent more time
    there than in memory traffic); here one loop over that variable's range fills an array per
    value before the kernel's loops, and the loop body loads ``tmp3_c[x2]``.

    A loop cut at a concatenation's pieces (cpp_pieces.py) spells each piece with its variable
    narrowed to the piece: a value is filled over the pieces that compute it, and pieces that
    compute the same expression (BatchNorm's scale over the concatenated channels) share one
    array, filled in one loop over their ranges."""
    sizes: dict                 # loop variable (an ir.expr Var) -> its whole loop's range, for each that may have arrays
    values: dict = field(default_factory=dict)   # (variable name, expression) -> _Array

    def add(self, var, name: str, ctype: str, expr: str) -> str:
        """A value ``name`` = ``expr`` per value of ``var`` (the same array as an earlier value of that
        expression); how the loops read it."""
        array = self.values.setdefault((var.name, expr), _Array(name, ctype, self.sizes[var]))
        array.fill((var.start, var.size))
        return f"{array.name}_c[{var.name}]"

    def widen(self, var_name: str, piece: tuple, others: list) -> None:
        """Every value of ``var_name`` filled over range ``piece`` is filled over ``others`` too (a
        loop over a table of pieces computes each with the first piece's body)."""
        for (var, _), array in self.values.items():
            if var == var_name and piece in array.ranges:
                for r in others:
                    array.fill(r)

    def block(self) -> list:
        """The arrays and the loops that fill them (nothing when no value was computed here): the
        values of one variable filled over the same ranges share a loop, in the order first added."""
        groups: dict = {}
        for (var, expr), a in self.values.items():
            decls, lines = groups.setdefault((var, _spans(a.ranges)), ([], []))
            decls.append(f"{a.ctype} {a.name}_c[{a.size}];")
            lines.append(f"    {a.name}_c[{var}] = {expr};")
        out = []
        for (var, spans), (decls, lines) in groups.items():
            out += decls
            for lo, hi in spans:
                out += [f"for (int64_t {var} = {lo}; {var} < {hi}; ++{var})", "{", *lines, "}"]
        return out


@dataclass
class _Array:
    """A per-channel array: its length is the whole loop's; ``ranges``: where it is filled (half-open)."""
    name: str
    ctype: str
    size: int
    ranges: list = field(default_factory=list)

    def fill(self, r: tuple) -> None:
        if r not in self.ranges:
            self.ranges.append(r)


def _spans(ranges: list) -> tuple:
    """Half-open ranges merged where they touch or overlap, in order."""
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return tuple(out)


def channel_sizes(kernel) -> dict:
    """For a pointwise FusedKernel of static sizes over several loops: each loop variable whose
    range is short enough for stack arrays while the other loops run at least
    CHANNEL_MIN_REPEATS times over it -> that range."""
    ranges = kernel.outer_ranges
    if kernel.is_reduction or len(ranges) < 2:
        return {}
    return {v: int(r) for v, r in zip(kernel.outer_vars, ranges)
            if 1 < r <= CHANNEL_MAX and kernel.outer_numel >= CHANNEL_MIN_REPEATS * r}
