"""An extern view (an unfold the lowering runs as an ATen call, a split's pieces) is the memory it
views: the wrapper keeps that memory out of its reuse pool while the view is read
(codegen/wrapper.py ``_last_uses``). Bug-class fuzzer, layout class, seed 201339 (training): the
sine's buffer was handed to a later kernel after its last direct reader, and the clone of
``v4.unfold(...)`` returned that kernel's values; seed 201388: abs's backward read its sign from
reused memory."""
import torch

from tests.helpers import assert_matches_eager


def unfold_then_scatters(v3):  # fuzz_classes layout seed 201339, shrunk
    v4 = torch.sin(v3)
    v5 = v4.unfold(3, 1, 2)
    v6 = torch.as_strided_scatter(v4, torch.linspace(-1, 1, 4, dtype=torch.float64).view((1, 4)), (1, 4), (0, 1), 2)
    v8 = torch.as_strided_scatter(v6, v6.reshape(-1)[:6].view((1, 1, 3, 2)).sin(), (1, 1, 3, 2), (1, 0, 2, 1), 0)
    return v5.clone(), v8.clone()


def unfold_returned(v3):  # the view itself an output: its memory is never reused
    v4 = torch.sin(v3)
    v6 = torch.as_strided_scatter(v4, torch.ones(1, 4, dtype=torch.float64), (1, 4), (0, 1), 2)
    return v4.unfold(3, 1, 2), (v6.reshape(-1)[:6].sin() * 2).view(3, 2, 1, 1)


def abs_of_a_channels_last_unfold(v0):  # layout seed 201388: abs's backward read reused memory
    v5 = v0.contiguous(memory_format=torch.channels_last).unfold(2, 1, 1)
    return (torch.abs(v5).as_strided((1, 2, 4), (1, 4, 3), 63) * 2,)


def test_memory_of_an_extern_view_is_not_reused_while_the_view_is_read(fresh_dynamo):
    for program, shape in ((unfold_then_scatters, (3, 2, 1, 1)), (unfold_returned, (3, 2, 1, 1)),
                           (abs_of_a_channels_last_unfold, (1, 4, 8, 9))):
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        def step(fn, x=x):
            xs = x.clone().requires_grad_(True)
            outs = fn(xs)
            sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in outs).backward()
            return [o.detach() for o in outs] + [xs.grad]

        got, ref = step(torch.compile(program, backend="minicompile")), step(program)
        for g, r in zip(got, ref):
            assert_matches_eager(g, r, rtol=1e-9, atol=1e-9)
