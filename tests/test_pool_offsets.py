"""Max pooling's indices saved for backward as int8 window offsets (aot/pool_offsets.py)."""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import Recorder, assert_matches_eager

CL = torch.channels_last
POOLS = {   # name: (input shape, max_pool2d keyword arguments)
    "2x2": ((2, 3, 8, 10), dict(kernel_size=2)),
    "3x3_stride2_pad1": ((2, 3, 9, 7), dict(kernel_size=3, stride=2, padding=1)),
    "ceil_mode": ((1, 2, 7, 7), dict(kernel_size=2, ceil_mode=True)),
    "rectangular": ((2, 2, 6, 9), dict(kernel_size=(2, 3), stride=(1, 2))),
    "unbatched": ((3, 8, 8), dict(kernel_size=2)),
}


def _saved_dtypes(graph) -> list:
    return [s.dtype for s in graph.report.saved]


def _run(fn, x, backend):
    x = x.clone().requires_grad_(True)
    out = (torch.compile(fn, backend=backend) if backend else fn)(x)
    (out * torch.arange(out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return out, x.grad


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("name", list(POOLS))
def test_pool_backward_matches_eager_and_saves_one_byte_per_output(name, layout, fresh_dynamo):
    shape, kwargs = POOLS[name]
    torch.manual_seed(0)
    x = torch.randn(shape)
    x[..., ::3, ::2] = 0.5   # ties inside windows: the offsets must keep ATen's choice
    if layout == "channels_last":
        if x.dim() != 4:
            pytest.skip("channels-last needs a batch dimension")
        x = x.contiguous(memory_format=CL)

    def fn(x):
        return F.max_pool2d(x.sin(), **kwargs).cos()

    rec = Recorder()
    out, grad = _run(fn, x, rec)
    ref_out, ref_grad = _run(fn, x, None)
    assert_matches_eager((out, grad), (ref_out, ref_grad))
    (graph,) = rec.training
    dtypes = _saved_dtypes(graph)
    assert torch.int8 in dtypes and torch.int64 not in dtypes


def test_indices_the_user_reads_stay_int64(fresh_dynamo):
    def fn(x):
        out, idx = F.max_pool2d(x, 2, return_indices=True)
        return out * 2, idx

    x = torch.randn(1, 2, 4, 4)
    rec = Recorder()
    (out, idx), ref = torch.compile(fn, backend=rec)(x.requires_grad_(True)), fn(x)
    assert_matches_eager((out, idx), ref)
    (graph,) = rec.training
    assert torch.int8 not in _saved_dtypes(graph)


def test_pool_and_its_backward_in_one_graph(fresh_dynamo):
    # the forward itself runs the pooling backward (as OpInfo's max_pool2d_with_indices_backward
    # does): the indices are rebuilt from offsets after those are computed (the rebuild was placed
    # before them: KeyError _to_copy_default when the graph was split)
    aten = torch.ops.aten

    def fn(x):
        y, i = F.max_pool2d_with_indices(x, 3, 2, 0, 1, ceil_mode=True, return_indices=True)
        return aten.max_pool2d_with_indices_backward(torch.ones_like(y), x, [3, 3], [2, 2], [0, 0], [1, 1], True, i)

    x = torch.randn(1, 2, 3, 6, requires_grad=True)
    rec = Recorder()
    out = torch.compile(fn, backend=rec)(x)
    ref = fn(x)
    assert_matches_eager(out, ref)
    cot = torch.randn_like(ref)
    assert_matches_eager(torch.autograd.grad(out, x, cot), torch.autograd.grad(ref, x, cot))
    assert rec.training
