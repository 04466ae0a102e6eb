"""The shared checks in dynamic mode: the op table, the kernel counts and the fuzzer, with
every size symbolic (docs/dynamic.md).

Each program is compiled by torch.compile(dynamic=True) at its own sizes and then called at
two more: every size made odd, and one size made 1 (``helpers.size_maps``). Dynamo
specialises sizes 0 and 1, so the size-1 call recompiles; the odd one runs the first,
symbolic build. Every result is compared with eager. CI runs a bounded subset on both code
generators (Triton in its interpreter); the whole table and a longer fuzz run are marked slow.
"""
import pytest
import torch
import torch.nn.functional as F

from minicompile.backend import PerShapeGraph
from minicompile.testing import fuzz, fuzz_dynamic
from tests.helpers import Recorder, assert_matches_eager, compile_with_dynamo, run_sample_dynamic
from tests.op_table import SAMPLES
from tests.test_pipeline import block_inputs, transformer_block

# Samples whose symbolic build is refused (NotSymbolic) and compiled per shape: right, not one build.
PER_SHAPE = {
    "split_chunk": "the last chunk's length s - 3*((s + 3)//4) is no polynomial in the symbols",
    "view_split": "(s0, s1) viewed as (2, 4, s1//4, 4): a size s1//4 that may be 0",
    "repeat": "a repeat over a dimension of symbolic size: its index is a modulo by the size",
    "roll": "a roll over a dimension of symbolic size: its index is a modulo by the size",
    "max_pool2d_dilated": "the output size Max(1, s - 2) is no polynomial in the symbols",
}
# Samples with no size for a symbol (a 0-d input, every size fixed) or whose every size Dynamo specialises.
NO_SYMBOL = {"scalar_tensor", "view_split", "patch_merge"}
CI_SAMPLES = ["unary_exp", "add_broadcast", "where", "int64_arith", "bf16_add_mul", "sum_first_keepdim",
              "var_std", "argmax_flat", "softmax", "layer_norm", "transpose", "slice_step", "select",
              "cat_dim1", "pad", "split_chunk", "matmul_softmax", "inplace_input"]
BY_NAME = {s.name: s for s in SAMPLES}
SIZE_ARG = {"cpp": "int64_t s", "triton": "# a size, known at call time"}


def check_dynamic_sample(sample, backend):
    graphs = run_sample_dynamic(sample)
    assert 1 <= len(graphs) <= 3, len(graphs)  # the build, the size-1 one, at most one guard failure
    first = graphs[0]
    assert isinstance(first, PerShapeGraph) == (sample.name in PER_SHAPE), PER_SHAPE.get(sample.name)
    if sample.name not in NO_SYMBOL | set(PER_SHAPE) and first.num_kernels:
        assert first.backend == backend and SIZE_ARG[backend] in first.kernel_source, first.kernel_source


def test_ci_subset_is_in_the_table():
    assert set(CI_SAMPLES) <= set(BY_NAME) and set(PER_SHAPE) <= set(BY_NAME)


@pytest.mark.parametrize("name", CI_SAMPLES)
def test_op_table_sample_with_symbolic_sizes(name, backend):
    check_dynamic_sample(BY_NAME[name], backend)


@pytest.mark.slow
@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.name not in CI_SAMPLES],
                         ids=[s.name for s in SAMPLES if s.name not in CI_SAMPLES])
def test_whole_op_table_with_symbolic_sizes(sample, backend):
    check_dynamic_sample(sample, backend)


# -- kernel counts: the symbolic build fuses as the static one does -------------------------------

_W, _B = torch.randn(64), torch.randn(64)
KERNEL_COUNTS = {  # name -> (function, input of size n, kernels)
    "pointwise_chain": (lambda x, y: ((x * 2 + y).relu() * x).sin() - y.exp(),
                        lambda n: (torch.randn(n, 64), torch.randn(64)), 1),
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(n, 64),), 1),
    "layer_norm": (lambda x: F.layer_norm(x, (64,), _W, _B), lambda n: (torch.randn(n, 64),), 1),
    "sibling_reductions": (lambda x: (x.sum(-1), x.amax(-1), x.mean(-1)), lambda n: (torch.randn(n, 64),), 1),
}


@pytest.mark.parametrize("name", KERNEL_COUNTS)
def test_kernel_counts_with_symbolic_sizes(name, backend):
    fn, make, kernels = KERNEL_COUNTS[name]
    record = Recorder()
    graphs = record.graphs
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=record, dynamic=True)
    for n in (8, 5, 1):
        inputs = make(n)
        assert_matches_eager(compiled(*inputs), fn(*inputs), 1e-5, 1e-4)
    torch._dynamo.reset()
    assert len(graphs) == 2  # symbolic, then size 1
    symbolic = graphs[0]
    assert symbolic.num_kernels == kernels and not symbolic.externs, symbolic.explain()
    assert SIZE_ARG[backend] in symbolic.kernel_source


def test_transformer_block_kernel_count_with_symbolic_sizes(backend):
    small = {} if backend == "cpp" else dict(B=1, C=16)
    _, static = compile_with_dynamo(transformer_block, *block_inputs(T=8, **small))
    record = Recorder()
    graphs = record.graphs
    torch._dynamo.reset()
    compiled = torch.compile(transformer_block, backend=record)
    for t in (8, 5, 11, 1):  # the sequence length symbolic; 1 recompiles
        inputs = block_inputs(T=t, **small)
        if t != 1:
            torch._dynamo.mark_dynamic(inputs[0], 1)
        assert_matches_eager(compiled(*inputs), transformer_block(*inputs), 1e-4, 1e-4)
    torch._dynamo.reset()
    assert len(graphs) == 2
    symbolic = graphs[0]
    assert not isinstance(symbolic, PerShapeGraph) and SIZE_ARG[backend] in symbolic.kernel_source
    # one more than static: the head copies of q and v ([B*H, T, D]) and of k transposed ([B*H, D, T])
    # share a kernel only through one flat loop, which takes a division by T
    assert symbolic.num_kernels <= static[0].num_kernels + 1, (symbolic.explain(), static[0].explain())


# -- the fuzzer ----------------------------------------------------------------------------------

def run_dynamic_fuzz(tmp_path, n: int):
    before = dict(fuzz_dynamic.STATS)
    failures = fuzz.run(seed=0, n=n, batch=5, repro_dir=str(tmp_path), log=lambda *a: None,
                        check=fuzz_dynamic.check_batch)
    assert not failures, "fuzzed programs disagree with eager at symbolic sizes; reproducers:\n" + "\n".join(
        open(p).read() for p in failures[:3])
    stats = {k: v - before[k] for k, v in fuzz_dynamic.STATS.items()}
    # a batch is one graph: one program that cannot be symbolic makes the whole batch compile per
    # shape (seed 0, 400 programs: 34 of 240 calls reuse a build), so the bound is loose
    assert stats["calls"] == 3 * (n // 5) and stats["calls served by an earlier build"] >= n // 16, stats
    assert stats["programs resized"] >= n, stats  # most programs run at other sizes than their own
    return stats


def test_fuzzed_programs_match_eager_with_symbolic_sizes(tmp_path):
    run_dynamic_fuzz(tmp_path, 30)


@pytest.mark.slow
def test_more_fuzzed_programs_match_eager_with_symbolic_sizes(tmp_path):
    run_dynamic_fuzz(tmp_path, 400)
