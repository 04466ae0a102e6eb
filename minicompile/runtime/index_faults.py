"""An index read from memory out of bounds: the C++ kernels record it, the host wrapper raises.

A kernel that reads an index from memory (lowering/gathers.py) takes the record's address as its
last argument and writes (kind, value, dim, size) there for an index out of bounds (the prelude's
``mc_index``); the wrapper reads the kind after the call and raises eager's IndexError."""
from __future__ import annotations

import numpy as np


def fault_record() -> tuple:
    """(the address a kernel takes, the record the wrapper reads): one per compiled graph."""
    record = np.zeros(4, dtype=np.int64)
    return record.ctypes.data, record


def raise_index_fault(record) -> None:
    kind, value, dim, size = (int(v) for v in record)
    record[:] = 0
    if kind == 1:   # index_select, embedding: negatives are out of range too
        raise IndexError("index out of range in self")
    if kind == 3:   # index_select along dim 1
        raise RuntimeError(f"INDICES element is out of DATA bounds, id={value} axis_dim={size}")
    raise IndexError(f"index {value} is out of bounds for dimension {dim} with size {size}")
