"""Storage readers through views: ``as_strided`` and ``as_strided_scatter`` count their strides and
offset from the start of the *storage*, so a view of an intermediate (a strided slice, a select,
a permute, an unfold, an expand, a chunk) hands them the whole storage of the value it views, laid
out as eager lays it out (lowering/graph.py ``storage_view``). Bug-class fuzzer, layout class,
seed 200019: ``torch.add(a, b)[:, :, ::2].as_strided((1, 3, 5), (47, 1, 5), 91)`` read garbage
(1e19s) because the slice alone was stored, in a buffer of its own size."""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_matches_eager

TOL = dict(rtol=1e-4, atol=1e-4)


def strided_slice(a, b):  # fuzz_classes layout seed 200019
    return torch.add(b, a)[:, :, ::2].as_strided((1, 3, 5), (47, 1, 5), 91) * 2


def select(a, b):
    return torch.as_strided((a * b)[1], (3, 4), (5, 2), 80) + 1


def transpose_slice_unfold(a, b):
    return torch.as_strided((a - b).transpose(1, 2)[:, 1:].unfold(3, 2, 1), (6, 3), (9, 4), 3) * 1.5


def expand(a, b):
    return torch.as_strided((a.sum(1, keepdim=True) + b).expand(2, 8, 3, 3), (2, 3), (5, 1), 7) * 3


def chunk(a, b):
    return torch.as_strided(torch.chunk(a.exp() + b, 2, dim=1)[1], (4, 4), (9, 2), 5).sin()


def permute_default_offset(a, b):
    return torch.as_strided((a + b).permute(0, 2, 3, 1)[:, 1], (2, 3), (4, 1)) * 2


def nested_as_strided(a, b):
    return (a * b)[:, 3:].as_strided((2, 5), (7, 3), 40).as_strided((3, 3), (2, 9), 17).cos()


def scatter_into_a_slice(a, b):
    return torch.as_strided_scatter((a + b)[:, 2:5], torch.ones(2, 3), (2, 3), (4, 1), 20) * 2


def convolution_window(a, b):  # channels-last convolution: the reader sees eager's NCHW storage
    y = F.conv2d(a, b.repeat(2, 8, 1, 1), padding=1)[:, 1:, ::2]
    return torch.as_strided(y, (2, 3, 4), (36, 5, 1), 11) * 2


PROGRAMS = [strided_slice, select, transpose_slice_unfold, expand, chunk, permute_default_offset,
            nested_as_strided, scatter_into_a_slice, convolution_window]


def _inputs(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 8, 3, 3, generator=g).requires_grad_(requires_grad),
            torch.randn(2, 1, 3, 3, generator=g).requires_grad_(requires_grad)]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_storage_reader_of_a_view_of_an_intermediate_inference(program, fresh_dynamo):
    a, b = _inputs()
    with torch.no_grad():
        out = torch.compile(program, backend="minicompile")(a, b)
    assert_matches_eager(out, program(a, b), **TOL)


@pytest.mark.parametrize("program", [p for p in PROGRAMS if p is not scatter_into_a_slice],
                         ids=lambda f: f.__name__)  # eager's as_strided_scatter backward wants contiguous input
def test_storage_reader_of_a_view_of_an_intermediate_training(program, fresh_dynamo):
    def step(fn):
        a, b = _inputs(requires_grad=True)
        out = fn(a, b)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        return out.detach(), a.grad, b.grad

    ref = step(program)
    got = step(torch.compile(program, backend="minicompile"))
    for g, r in zip(got, ref):
        assert_matches_eager(g, r, **TOL)


def corner_of_a_convolution(x, w):
    """A view whose strides agree with eager's though the value it views is laid out otherwise:
    y[:, 0, 0, 0] has stride 4 and offset 0 in NCHW and in channels-last memory, but the storage
    as_strided reads is ordered otherwise; the channels-last passes check the owner of the storage too
    (aot/layout_readers.py)."""
    y = F.conv2d(x, w, padding=(0, 1))                      # (2, 2, 1, 2)
    return torch.as_strided(y[:, 0, 0, 0], (4,), (1,), 0) * 2


@pytest.mark.parametrize("training", [False, True])
def test_storage_reader_of_a_view_sees_the_viewed_values_eager_layout(training, fresh_dynamo):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 1, 2, generator=g), torch.randn(2, 3, 1, 3, generator=g)

    def step(fn):
        xs, ws = x.clone().requires_grad_(training), w.clone().requires_grad_(training)
        with torch.set_grad_enabled(training):
            out = fn(xs, ws)
        if training:
            (out * torch.linspace(-1, 1, out.numel())).sum().backward()
            return out.detach(), xs.grad, ws.grad
        return (out,)

    for got, ref in zip(step(torch.compile(corner_of_a_convolution, backend="minicompile")),
                        step(corner_of_a_convolution)):
        assert_matches_eager(got, ref, **TOL)


def test_as_strided_of_an_as_strided_scatter_result_counts_from_its_whole_storage(fresh_dynamo):
    # layout fuzzer seed 401230: eager's as_strided_scatter copies its input's whole storage and
    # returns its result at the input's storage offset (315 here); an as_strided of that result
    # counts from the storage's start, 315 elements before the data the wrapper sees. It runs as
    # an extern on the real tensor (124 of 160 values were wrong). make_fx, as the fuzzer traces:
    # Dynamo's fake pad result has a storage of its own size, which eager's does not.
    from tests.helpers import compile_fn

    def program(x):
        v4 = F.pad(x, [1, 0, 1, 2])
        v8 = torch.as_strided(v4, (1,), (94,), 315)
        v9 = torch.as_strided_scatter(v8, torch.linspace(-1, 1, 3), (3,), (1,), 486)
        return torch.as_strided(v9, (4, 4, 5, 2), (3, 2, 3, 94), 91) + 1
    x = torch.randn(2, 3, 7, 9, generator=torch.Generator().manual_seed(0))
    assert_matches_eager(compile_fn(program, x, trace="fake")(x), program(x), **TOL)
