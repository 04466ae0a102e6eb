"""minicompile's own decomposition table.

    DECOMPOSITIONS          OpOverload -> function written in aten ops (eager semantics)
    register_decomposition  the decorator that fills it (one module per op family)
    CORE_OPS                frozenset of OpOverloads (+ operator.getitem) decompositions
                            bottom out in: NATIVE_OPS (lowered) + EXTERN_INDEXING_OPS;
                            see docs/core-ops.md
    EXTERN_COMPUTE_OPS      mm, bmm, convolution, oneDNN linear: kept as extern calls on purpose
"""
from minicompile.decomp.core_ops import CORE_OPS, EXTERN_COMPUTE_OPS, NATIVE_OPS, is_core
from minicompile.decomp.registry import DECOMPOSITIONS, register_decomposition

# Importing a family module registers its decompositions.
from minicompile.decomp import (  # noqa: F401  (imported for registration)
    activations,
    backward,
    backward_training,
    attention,
    dropout,
    foreach,
    indexing,
    linalg,
    losses,
    norms,
    pointwise,
    reductions,
)

__all__ = ["CORE_OPS", "DECOMPOSITIONS", "EXTERN_COMPUTE_OPS", "NATIVE_OPS", "is_core", "register_decomposition"]
