"""Kernel structure the wider model suite's profiles against Inductor asked for (docs/models.md,
"Kernel by kernel against Inductor"): each test is a minimal program compared with eager that
also asserts what the generated code does once, not once per reader."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minicompile.config import patch

from minicompile.ir.nodes import ComputedBuffer
from tests.helpers import check


def _computing(compiled, origin: str) -> list:
    return [b.name for b in compiled.loop_graph.buffers if isinstance(b, ComputedBuffer) and origin in b.origins]


def test_max_pool_read_by_several_consumers_is_computed_once():
    """DenseNet's stem pool feeds every concatenation of its first dense block. The pool is one
    value of a two-output op (values, indices), read through a getitem: the getitem's readers
    were never counted, so each reader recomputed the 3x3 window (and the BatchNorm and ReLU
    inlined into it) until the getitem's value went through the same recompute-or-store test
    as any other."""
    def fn(x):
        p = F.max_pool2d(F.relu(x * 2 + 1), 3, 2, 1)
        return torch.cat([p, p.sin()], 1) + 1, p * 3
    compiled = check(fn, torch.randn(2, 4, 9, 9))
    assert len(_computing(compiled, "max_pool2d_with_indices")) == 1


def test_concatenation_read_along_the_innermost_loop_runs_one_loop_per_piece():
    """DenseNet's BatchNorm-ReLU reads the concatenation of its block's features in channels-last
    layout: the concatenated dimension is the innermost loop, and each element loaded every piece
    at a clamped index (a gather per piece) and picked one, ten times slower than Inductor's
    kernel. The loop is now cut at the pieces' edges, each range planned and written on its own
    and loading its own piece only, at an index without a clamp; the pieces of one width laid out
    alike are one loop over a table of their pointers."""
    def fn(a, b, c, w, s):
        x = torch.cat([a, b, c], 1)
        return F.relu(x * w.view(1, -1, 1, 1) + s.view(1, -1, 1, 1))
    cl = torch.channels_last
    pieces = [torch.randn(2, n, 5, 5).to(memory_format=cl) for n in (8, 4, 4)]
    compiled = check(fn, *pieces, torch.randn(16), torch.randn(16))
    src = compiled.kernel_source
    loops = [ln.strip() for ln in src.splitlines() if ln.strip().startswith(("for (int64_t x2", "for (int64_t piece"))]
    assert loops == ["for (int64_t x2 = 0; x2 < 8; ++x2)", "for (int64_t piece = 0; piece < 2; ++piece)",
                     "for (int64_t piece_c = 0; piece_c < 4; ++piece_c)"], loops
    assert "mc_where(" not in src and "std::max<int64_t>(" not in src and all(src.count(f"arg{k}") == 2 for k in range(3)), src
    assert "x2 cut in 3 pieces at 8, 12 (pieces 1-2 over a pointer table)" in str(compiled.schedule), compiled.schedule


@pytest.mark.parametrize("fmt", [torch.channels_last, torch.contiguous_format], ids=["channels last", "nchw"])
def test_many_pieces_are_cut_each_loading_its_own(fmt):
    """25 pieces (DenseNet-121's third block ends with 25): each range loads its own piece only,
    with no select and no clamp: the concatenation, planned over a range, reads the one piece
    there (not left to g++ to fold: DenseNet's layer k wrote k loops of k loads and selects each,
    23,443 lines, half of its cold compile in g++); along the innermost loop the 24 pieces of one
    width are one loop over a table of their pointers. A concatenation of more than 16 pieces
    was not cut at all: every element loaded every piece."""
    def fn(*args):
        x = torch.cat(args[:-2], 1)
        return F.relu(x * args[-2].view(1, -1, 1, 1) + args[-1].view(1, -1, 1, 1))
    widths = [8] + [4] * 24
    pieces = [torch.randn(2, n, 3, 3).to(memory_format=fmt) for n in widths]
    src = check(fn, *pieces, torch.randn(sum(widths)), torch.randn(sum(widths))).kernel_source
    assert "mc_where(" not in src and " < INT64_C(" not in src and "std::max<int64_t>(" not in src, src
    if fmt == torch.channels_last:
        assert "const float* const pieces_x2_8[24] = {" in src and src.count("piece_in[") == 1, src
    else:
        starts = [ln.split("=")[1].split(";")[0].strip() for ln in src.splitlines() if "for (int64_t x1 = " in ln]
        assert starts == [str(8 + 4 * k) if k >= 0 else "0" for k in range(-1, 24)], src


def _random_concatenation(seed: int):
    """A seeded concatenation read: 1-70 pieces of equal or mixed widths, NCHW or channels-last
    (some pieces transposed views), float32 or bfloat16 (some pieces float32), read by one of five
    pointwise bodies (two read a slice of it, strided or flipped, or through a reshape)."""
    import random
    rng = random.Random(seed)
    k = rng.choice([1, 2, 3, 5, 12, 17, 25, 33, 70])
    widths = [rng.choice([2, 4])] * k if rng.random() < 0.5 else [rng.choice([1, 2, 3, 4, 8]) for _ in range(k)]
    h, w = rng.choice([(1, 1), (2, 3), (4, 4), (5, 7)])
    dtype, mixed = rng.choice([torch.float32, torch.bfloat16]), rng.random() < 0.2
    pieces = []
    for j, c in enumerate(widths):
        t = torch.randn(2, c, h, w, dtype=torch.float32 if mixed and j % 3 == 0 else dtype)
        t = t.contiguous(memory_format=torch.channels_last) if rng.random() < 0.6 else t
        pieces.append(torch.randn(2, c, w, h, dtype=t.dtype).transpose(2, 3) if rng.random() < 0.1 else t)
    total = sum(widths)
    lo = rng.randrange(total)
    hi, step = rng.randrange(lo + 1, total + 1), rng.choice([1, 1, 2, 3])
    body = rng.choice([lambda x, s: F.relu(x * s.view(1, -1, 1, 1) + 1), lambda x, s: torch.sigmoid(x) * x[:, :1],
                       lambda x, s: x + x.flip(1),
                       lambda x, s: torch.sin(x[:, lo:hi:step]) * s[lo:hi:step].view(1, -1, 1, 1),   # a slice: fewer pieces
                       lambda x, s: x.flip(1)[:, lo:hi].exp() + x.permute(0, 2, 3, 1).reshape(2, -1, total)[:, :1, lo:hi].unsqueeze(-1).transpose(1, 2)])
    return (lambda *args: body(torch.cat(args[:-1], 1), args[-1])), [*pieces, torch.randn(sum(widths))], dtype


@pytest.mark.parametrize("seed", range(12))
def test_random_concatenation_reads_match_eager(seed):
    """The concatenation read's piece loops (each range planned on its own) against eager on
    seeded random concatenations: piece counts past the cut limit's old 16, widths equal and
    mixed, layouts, dtypes, three readers. (120 seeds of the same generator passed when written.)"""
    fn, args, dtype = _random_concatenation(seed)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    check(fn, *args, atol=tol, rtol=tol)


@pytest.mark.parametrize("threshold", [1, 1 << 40], ids=["threads", "no region"])
def test_concatenation_read_along_an_outer_loop_runs_one_loop_per_piece(threshold):
    """The same BatchNorm-ReLU over a concatenation in NCHW layout: the concatenated dimension
    (channels) is an outer loop, and every element of the inner loop loaded every piece and
    selected one (DenseNet's last block: 16-24 loads per element). The channel loop is now cut
    at the pieces' edges, the inner loop copied whole into each range; with threads, the whole
    nest per piece (its parallel loop collapses the channel loop, which must stay perfectly nested)."""
    def fn(a, b, c, w, s):
        x = torch.cat([a, b, c], 1)
        return F.relu(x * w.view(1, -1, 1, 1) + s.view(1, -1, 1, 1))
    pieces = [torch.randn(2, n, 5, 5) for n in (8, 4, 4)]
    with patch(parallel_threshold=threshold):
        compiled = check(fn, *pieces, torch.randn(16), torch.randn(16))
    loops = [ln.strip() for ln in compiled.kernel_source.splitlines() if ln.strip().startswith("for (int64_t x1")]
    assert loops == ["for (int64_t x1 = 0; x1 < 8; ++x1)", "for (int64_t x1 = 8; x1 < 12; ++x1)",
                     "for (int64_t x1 = 12; x1 < 16; ++x1)"], compiled.kernel_source


class _DenseBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, 4, 3, padding=1, bias=False) for c in (6, 10, 14))
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(c) for c in (6, 10, 14, 18))
        for bn in self.norms:
            bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        features = [x]
        for conv, bn in zip(self.convs, self.norms):
            features.append(conv(F.relu(bn(torch.cat(features, 1)))))
        return F.relu(self.norms[-1](torch.cat(features, 1)))


def test_dense_block_chain_matches_eager_in_both_layouts():
    """A dense block in miniature (eval): convolutions whose outputs are concatenated and read by
    a BatchNorm-ReLU feeding the next convolution, in NCHW and channels-last; each concatenation's
    kernel runs one loop per piece along the channels, whichever loop they are."""
    torch.manual_seed(0)
    block = _DenseBlock().eval()
    for fmt in (torch.contiguous_format, torch.channels_last):
        with torch.no_grad():
            compiled = check(block, torch.randn(2, 6, 7, 7).to(memory_format=fmt), atol=1e-4, rtol=1e-4)
        src = compiled.kernel_source   # the last concatenation's last piece (channels 14..17): its loop, or in a table
        cut = [ln for ln in src.splitlines() if "; x" in ln and "= 14; " in ln and "< 18;" in ln]
        assert "mc_where(" not in src and "std::max<int64_t>(" not in src, src
        assert cut if fmt == torch.contiguous_format else "pieces_x2_6[3] = {" in src, src


def test_a_slice_of_a_concatenation_reads_only_the_pieces_it_overlaps():
    """``cat([a, b, c])[:, 8:12]`` is ``b``: the concatenation sees its position's range (8..11)
    and loads ``b`` alone, with no select and no clamp (it loaded all three and picked one)."""
    def fn(a, b, c):
        return torch.cat([a, b, c], 1)[:, 8:12] * 2
    a, b, c = (torch.randn(3, n) for n in (8, 4, 4))
    src = check(fn, a, b, c).kernel_source
    assert "mc_where(" not in src and "std::max<int64_t>(" not in src, src
    assert [src.count(f"arg{k}[") for k in range(3)] == [0, 1, 0], src


def test_a_piece_the_body_reads_again_is_not_read_through_the_pointer_table():
    """``sigmoid(x) * x[:, :1]`` over ``cat([a, b])``: both pieces are alike, but piece ``a`` is
    also read for ``x[:, :1]`` in every range. Read through the table, that second read took
    ``b``'s channel 0 in ``b``'s range (values differ by up to 2.9); the pieces stay two loops."""
    def fn(a, b):
        x = torch.cat([a, b], 1)
        return torch.sigmoid(x) * x[:, :1]
    src = check(fn, torch.randn(2, 4, 1, 1), torch.randn(2, 4, 1, 1)).kernel_source
    assert "piece_in" not in src, src
