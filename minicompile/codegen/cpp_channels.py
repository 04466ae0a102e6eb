"""Per-channel values of a C++ pointwise kernel, computed once before its loops.

A kernel over NHWC data (or any row-major array) whose innermost loop runs over channels
often computes, per element, values that depend on the channel alone: inference BatchNorm's
``weight / sqrt(running_var + eps)`` and ``bias - mean * scale``. g++ cannot move them out of
the loops (the loads they start from may alias the kernel's stores). CppOps (codegen/cpp.py)
puts each such value, with the loads and hoisted values it is computed from, into an array
that one loop over the channels fills before the kernel's loops; the loop body then reads
``tmp3_c[x2]``. The values and their order of operations are those of the loop they replace.

    channel = ChannelValues.of(kernel)       # CppKernel: its innermost loop, or None when not worth it
    expr = channel.add("tmp3", "float", "(1 / std::sqrt(tmp2_c[x2]))")   # -> "tmp3_c[x2]"
    lines = hoisted + channel.block() + loops
"""
from __future__ import annotations

from dataclasses import dataclass, field

# A kernel precomputes per-channel values when its innermost range is at most this long (stack
# arrays) and the rest of its loops run at least CHANNEL_MIN_REPEATS times over it.
CHANNEL_MAX = 2048
CHANNEL_MIN_REPEATS = 4


@dataclass
class ChannelValues:
    """Values of a pointwise kernel that depend on its innermost loop variable alone (a channel of
    NHWC data): BatchNorm's ``weight / sqrt(var + eps)`` and shift. In the loop they were computed
    per element (a vector sqrt and two divisions per 8 floats: EfficientNet's BatchNorm+SiLU
    kernels spent more time there than in memory traffic); here one loop over the channels fills
    an array per value before the kernel's loops, and the loop body loads ``tmp3_c[x2]``."""
    var: object                 # the innermost loop variable (an ir.expr Var)
    size: int                   # its range
    decls: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    values: set = field(default_factory=set)   # expressions of values known per channel

    @classmethod
    def of(cls, kernel) -> ChannelValues | None:
        """For a pointwise FusedKernel of static sizes whose innermost loop is short enough for
        stack arrays and runs often enough for the channel loop to pay; None otherwise."""
        ranges = kernel.outer_ranges
        if (kernel.is_reduction or len(ranges) < 2 or ranges[-1] > CHANNEL_MAX
                or kernel.outer_numel < CHANNEL_MIN_REPEATS * ranges[-1]):
            return None
        return cls(kernel.outer_vars[-1], int(ranges[-1]))

    def add(self, name: str, ctype: str, expr: str) -> str:
        """A new per-channel value ``name`` = ``expr``; how the loops read it."""
        self.decls.append(f"{ctype} {name}_c[{self.size}];")
        self.lines.append(f"{name}_c[{self.var.name}] = {expr};")
        self.values.add(f"{name}_c[{self.var.name}]")
        return f"{name}_c[{self.var.name}]"

    def block(self) -> list:
        """The arrays and the loop that fills them (nothing when no value was computed here)."""
        if not self.lines:
            return []
        loop = [f"for (int64_t {self.var.name} = 0; {self.var.name} < {self.size}; ++{self.var.name})", "{"]
        return self.decls + loop + ["    " + ln for ln in self.lines] + ["}"]

