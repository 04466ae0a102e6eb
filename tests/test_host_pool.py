"""runtime/host_pool.py: large CPU buffers are reused only once nothing references them."""
from __future__ import annotations

import torch

from minicompile.config import patch
from minicompile.runtime import host_pool

CPU = torch.device("cpu")
SIZE, STRIDE = (512, 1024), (1024, 1)  # 2 MiB of float32: above the pool's 1 MiB floor


def alloc(size=SIZE, stride=STRIDE, dtype=torch.float32):
    return host_pool.empty_strided(size, stride, dtype=dtype, device=CPU)


def test_buffer_in_use_is_never_handed_out_again():
    host_pool.clear()
    a = alloc()
    view = a[3:]
    del a
    b = alloc()  # the first buffer is still referenced by ``view``
    assert view.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_idle_buffer_is_reused_with_the_requested_layout():
    host_pool.clear()
    a = alloc()
    ptr = a.data_ptr()
    del a
    b = alloc(size=(1024, 512), stride=(1, 1024))  # same bytes, another view of them
    assert b.data_ptr() == ptr and b.shape == (1024, 512) and b.stride() == (1, 1024)
    b.copy_(torch.arange(b.numel(), dtype=torch.float32).view(512, 1024).t())
    assert torch.equal(b, torch.arange(b.numel(), dtype=torch.float32).view(512, 1024).t())


def test_small_buffers_and_the_disabled_pool_bypass_it():
    host_pool.clear()
    before = host_pool.held_bytes()
    alloc(size=(16, 16), stride=(16, 1))
    with patch(host_pool_mb=0):
        alloc()
    assert host_pool.held_bytes() == before


def test_cap_releases_idle_buffers_first():
    host_pool.clear()
    with patch(host_pool_mb=5):  # room for two 2 MiB buffers
        kept = alloc()
        idle = alloc(size=(513, 1024), stride=(1024, 1))
        del idle
        third = alloc(size=(514, 1024), stride=(1024, 1))  # evicts the idle one, not ``kept``
        assert host_pool.held_bytes() <= 5 << 20
        kept.fill_(2.0)
        assert bool((kept == 2.0).all()) and third.shape == (514, 1024)
    assert host_pool.clear() >= 0


def test_compiled_outputs_survive_later_calls():
    # an output the caller keeps must not be overwritten by the next call of the same graph
    from minicompile.pipeline import compile_graph
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return x * 2
    x = torch.randn(512, 1024)
    c = compile_graph(make_fx(f)(x), [x])
    out = c(x)
    first = out[0] if isinstance(out, (tuple, list)) else out
    kept = first.clone()
    for _ in range(3):
        c(x + 1)
    assert torch.equal(first, kept)
