"""flex_attention's forward as one buffer of the loop IR: a fused attention kernel.

``torch.ops.higher_order.flex_attention`` carries the user's ``score_mod`` and the block mask's
``mask_mod`` as FX graphs over one score and its (b, h, q_idx, kv_idx) position. Lowering
(lowering/flex.py) turns each into a loop-IR body over the four index variables below, so a
backend renders them with its own ops handler, inside a kernel that walks the key blocks the
block mask lists with an online softmax (running max and sum): no Lq x Lk score matrix.

A FlexAttention buffer is the attention output; its two FlexStat buffers are the logsumexp and
the row maximum, in base 2, as the higher-order op returns them (``flex_attention`` multiplies
them by ln 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from minicompile.ir.expr import Expr, Var
from minicompile.ir.nodes import Buffer, StorageView

SCORE = "mc_score"   # the name a score body loads the (scaled) score under; the kernel supplies it
SCORE_INDEX = Expr.of(0)


def index_vars(batch, heads, q_len, kv_len) -> tuple:
    """The (b, h, q_idx, kv_idx) variables mod bodies index with; the kernel's loops define them."""
    return tuple(Expr.of(Var(name, size)) for name, size in
                 zip(("b", "h", "q_idx", "kv_idx"), (batch, heads, q_len, kv_len)))


@dataclass(eq=False)
class FlexAttention(Buffer):
    """``out[b, h, q] = softmax_kv(where(mask(b, h, q, kv), score(q.k * scale, b, h, q, kv), -inf)) @ v``.

    The buffer's layout is the output's. Key blocks run as the block mask lists them: partial
    blocks (``kv_num_blocks``/``kv_indices``) with the mask body, full blocks without it; a
    block listed in neither is skipped (masked everywhere, as the BlockMask promises)."""
    query: StorageView = None              # [B, Hq, Lq, D]
    key: StorageView = None                # [B or 1, Hkv, Lk, D]; Hq = G * Hkv (grouped-query)
    value: StorageView = None              # [B or 1, Hkv, Lk, Dv]
    partial: tuple = ()                    # (kv_num_blocks [Bm, Hm, nQ], kv_indices [Bm, Hm, nQ, nK])
    full: tuple = ()                       # the same for full blocks, or () when the mask has none
    score: Callable = None                 # score(ops) -> value: loads SCORE, indexes with index_vars
    mask: Optional[Callable] = None        # mask(ops) -> bool value, or None (every position kept)
    captured: tuple = ()                   # StorageViews the two bodies read (an ALiBi slope tensor)
    scale: float = 1.0
    q_block: int = 128                     # the block mask's BLOCK_SIZE: rows per kv_num_blocks entry
    kv_block: int = 128                    # keys per block index
    stats: list = field(default_factory=list)   # FlexStat: logsumexp, max (base 2)

    path = (0,)   # the op's result this buffer is (the output), as a MultiOutput's path

    def views(self) -> list:
        """Every StorageView the kernel reads."""
        return [self.query, self.key, self.value, *self.partial, *self.full, *self.captured]


@dataclass(eq=False)
class FlexStat(Buffer):
    """A per-row statistic [B, Hq, Lq] the FlexAttention kernel writes beside its output."""
    parent: Optional[FlexAttention] = None
    which: str = ""                        # "lse" | "max"

    @property
    def path(self) -> tuple:
        """The op's result this buffer is, as a MultiOutput's path: (out, lse, max)."""
        return (1,) if self.which == "lse" else (2,)
