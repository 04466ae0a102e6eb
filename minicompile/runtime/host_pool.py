"""Large CPU buffers kept for reuse once every tensor using them is gone.

    buf = host_pool.empty_strided(size, stride, dtype=..., device=...)

A fresh multi-megabyte CPU allocation is page-faulted in as it is first written, at about
4 GB/s on the development machine (../docs/benchmarks.md): on a 8192x1024 layer_norm the
32 MiB output cost 8 ms of faults per call, more than the kernel. Whether glibc hands back
already-mapped memory depends on the allocation history of the whole process, so the same
compiled graph ran 1.5x slower or faster from one process to the next.

The wrapper allocates its intermediates and outputs here. Each buffer of at least
``MIN_BYTES`` is remembered by its storage; a later request of the same byte size takes a
remembered storage that nothing else references any more (its reference count is ours
alone) and views it with the requested sizes and strides. Nothing a caller holds is ever
handed out again: a returned output stays the caller's for as long as any tensor or view of
it lives. The pool keeps at most ``config.host_pool_mb`` MiB; past that, the idle buffers
are released first and new ones are no longer remembered. ``clear()`` drops every idle
buffer. ``MINICOMPILE_HOST_POOL_MB=0`` turns the pool off.
"""
from __future__ import annotations

import threading

import torch

from minicompile.config import config

# torch's C++ paths that Dynamo's guards use: a view, a CPU allocation without the dispatcher's
# Python argument parsing (a third of torch.as_strided's time, a half of torch.empty_strided's)
from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu  # noqa: F401 (the wrapper's)
from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret_tensor

# glibc maps a request of its mmap threshold (128 KiB, raised as large blocks are freed) or more
# afresh, and gives back the top of its heap past twice that: buffers from 64 KiB up are kept.
MIN_BYTES = 64 << 10

_use_count = torch._C._storage_Use_Count
_lock = threading.Lock()
_storages: dict = {}   # nbytes -> [(UntypedStorage, a tensor on it of the first request's dtype)]
_total = [0]           # bytes of every remembered storage, idle or in use


def empty_strided(size, stride, *, dtype, device):
    """torch.empty_strided, served from remembered memory when possible (CPU, >= MIN_BYTES)."""
    nbytes = _storage_bytes(size, stride, dtype)
    if device.type != "cpu" or nbytes < MIN_BYTES:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)
    return take(size, stride, dtype, nbytes)


def take(size, stride, dtype, nbytes: int):
    """A CPU tensor of ``nbytes`` bytes (at least MIN_BYTES) viewed as ``size``/``stride``.

    The generated wrapper calls this directly for the buffers it knows, when it is
    generated, to be large CPU ones; everything else there is a plain torch.empty_strided.
    """
    limit = config.host_pool_mb << 20
    if nbytes > limit:
        return torch.empty_strided(size, stride, dtype=dtype)
    with _lock:
        for st, base in _storages.get(nbytes, ()):
            if _use_count(st._cdata) == 2 and st.nbytes() == nbytes:  # idle: only the pool's two hold it
                if base.dtype == dtype:   # a view without the dispatcher (a third of set_'s time)
                    return reinterpret_tensor(base, size, stride, 0)
                return torch.empty(0, dtype=dtype).set_(st, 0, size, stride)
        t = torch.empty_strided(size, stride, dtype=dtype)
        if _total[0] + nbytes > limit:
            _release_idle()
        if _total[0] + nbytes <= limit:
            # a tensor of its own (not t, which the caller holds: that would not count)
            _storages.setdefault(nbytes, []).append((t.untyped_storage(), reinterpret_tensor(t, size, stride, 0)))
            _total[0] += nbytes
        return t


def copy_with_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` viewing a copy of its whole storage as ``t`` views its own: sizes, strides
    with gaps or zeros (an expanded input), offset. ``clone()`` makes a tensor with gaps contiguous
    (a kernel compiled for the gaps indexes past its end); copying into an expanded tensor raises."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


def clear() -> int:
    """Release every idle buffer; returns the bytes released."""
    with _lock:
        return _release_idle()


def held_bytes() -> int:
    """Bytes of every remembered buffer (idle or still in use)."""
    return _total[0]


def _release_idle() -> int:
    freed = 0
    for nbytes, sts in list(_storages.items()):
        keep = [held for held in sts if _use_count(held[0]._cdata) > 2]
        freed += nbytes * (len(sts) - len(keep))
        if keep:
            _storages[nbytes] = keep
        else:
            del _storages[nbytes]
    _total[0] -= freed
    return freed


def _storage_bytes(size, stride, dtype) -> int:
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(size, stride))) * dtype.itemsize
