"""An index read from memory out of bounds: a C++ kernel records (check, value, dim, size) at the
address it takes last (the prelude's ``mc_index``); the host wrapper reads it and raises eager's error."""
import numpy as np


def fault_record() -> tuple:
    """(the address kernels take, the record the wrapper reads): one per compiled graph."""
    record = np.zeros(4, dtype=np.int64)
    return record.ctypes.data, record


def raise_index_fault(record) -> None:
    check, value, dim, size = (int(v) for v in record)
    record[:] = 0
    if check == 3:   # index_select along dim 1
        raise RuntimeError(f"INDICES element is out of DATA bounds, id={value} axis_dim={size}")
    raise IndexError("index out of range in self" if check == 1 else   # index_select, embedding
                     f"index {value} is out of bounds for dimension {dim} with size {size}")
