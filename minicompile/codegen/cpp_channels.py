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
    value before the kernel's loops, and the loop body loads ``tmp3_c[x2]``."""
    sizes: dict                 # loop variable (an ir.expr Var) -> its range, for each that may have arrays
    decls: dict = field(default_factory=dict)   # variable -> array declarations
    lines: dict = field(default_factory=dict)   # variable -> the statements of its filling loop

    def add(self, var, name: str, ctype: str, expr: str) -> str:
        """A new value ``name`` = ``expr`` per value of ``var``; how the loops read it. A variable
        narrowed to a piece of its loop (``var.start``, cpp_pieces.py) has an array of that piece."""
        at = f"{var.name} - {var.start}" if var.start else var.name
        self.decls.setdefault(var, []).append(f"{ctype} {name}_c[{self.sizes[var]}];")
        self.lines.setdefault(var, []).append(f"{name}_c[{at}] = {expr};")
        return f"{name}_c[{at}]"

    def block(self) -> list:
        """The arrays and the loops that fill them (nothing when no value was computed here)."""
        out = []
        for var, lines in self.lines.items():
            end = var.start + self.sizes[var]
            out += self.decls[var] + [f"for (int64_t {var.name} = {var.start}; {var.name} < {end}; ++{var.name})", "{"]
            out += ["    " + ln for ln in lines] + ["}"]
        return out


def channel_sizes(kernel) -> dict:
    """For a pointwise FusedKernel of static sizes over several loops: each loop variable whose
    range is short enough for stack arrays while the other loops run at least
    CHANNEL_MIN_REPEATS times over it -> that range."""
    ranges = kernel.outer_ranges
    if kernel.is_reduction or len(ranges) < 2:
        return {}
    return {v: int(r) for v, r in zip(kernel.outer_vars, ranges)
            if 1 < r <= CHANNEL_MAX and kernel.outer_numel >= CHANNEL_MIN_REPEATS * r}
