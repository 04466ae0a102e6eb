"""The Triton code generator beyond the shared op table (tests/test_ops_table.py runs that on both
code generators, and the kernel counts are in tests/test_pipeline.py): looped reductions, views,
edge cases, the generated source, launching.

Without a GPU every kernel runs in the Triton interpreter on CPU tensors
(``config.cpu_backend = "triton"``); tests marked ``gpu`` run real kernels on CUDA and are
skipped without one. Shapes stay small: the interpreter runs one numpy step per program.
"""
import functools
import json
import os

import pytest
import torch
import torch.nn.functional as F

from minicompile.codegen import BACKENDS
from minicompile.config import patch
from minicompile.runtime.triton_launch import TritonKernelLauncher
from tests import helpers
from tests.helpers import compile_fn, run_sample
from tests.op_table import SAMPLES

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")


def gpu(test):
    """Real Triton kernels on CUDA: marked ``gpu`` (``pytest -m gpu`` selects them), skipped without a device."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


check = functools.partial(helpers.check, backend="triton")


@pytest.fixture(autouse=True)
def triton_on_cpu():
    with patch(cpu_backend="triton"):
        yield


# -- the shared correctness table (in the interpreter: tests/test_ops_table.py) ---------------

LOOPED = ["sum_last", "sum_all", "var_std", "amax_amin", "argmax_argmin", "argmax_flat", "prod", "any_all",
          "bf16_sum", "softmax", "softmax_dim0", "log_softmax", "layer_norm", "sum_int", "sum_then_pointwise"]


@pytest.mark.parametrize("name", LOOPED)
def test_looped_reductions_match_eager(name):
    """Rows longer than the persistent limit loop over RBLOCK-sized chunks with running accumulators."""
    sample = next(s for s in SAMPLES if s.name == name)
    with patch(triton_persistent_rnumel=4):
        run_sample(sample, backend="triton")


@gpu
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_matches_eager_triton_gpu(sample):
    with patch(cpu_backend="cpp"):
        run_sample(sample, backend="triton", device="cuda")


# (the kernel-count tests run on both code generators in tests/test_pipeline.py)


# -- views, dtypes, edge cases beyond the table -----------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: torch.randn(16, 24).t(),
    lambda: torch.randn(16, 48)[:, ::3],
    lambda: torch.randn(32, 24)[4:20],
    lambda: torch.randn(24).expand(16, 24),
    lambda: torch.randn(4, 6, 8).permute(2, 0, 1),
], ids=["transposed", "step_slice", "offset_slice", "expanded", "permuted"])
def test_strided_inputs(make):
    x = make()
    check(lambda a: (a * 2).exp() + a, x)
    check(lambda a: a.sum(-1) + a.amax(-1), x)


def test_nan_propagates_through_max_and_argmax():
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")
    x[2, 5] = float("nan")
    x[2, 6] = float("nan")
    check(lambda a: (a.amax(-1), a.argmax(-1), a.amin(0), a.argmin(0), torch.maximum(a, a.flip(1))), x)


def test_argmax_ties_take_the_first_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    check(lambda a: (a.argmax(-1), a.argmin(-1)), x)
    with patch(triton_persistent_rnumel=1):
        check(lambda a: (a.argmax(-1), a.argmin(-1)), torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 3.0]]))


def test_full_reduction_to_a_scalar_and_bf16_rows():
    check(lambda a: (a * a).sum(), torch.randn(7, 9))
    check(lambda a: (a.float() + 1).softmax(-1).to(torch.bfloat16), torch.randn(6, 10).to(torch.bfloat16),
          atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "looped"])
def test_narrow_dtypes_load_widened_and_accumulate_in_float32(dtype, persistent):
    # 2048 values near 1: a sum kept in bf16 (8 bits of mantissa) stalls at 256, in fp16 at 2048;
    # eager accumulates in float32, and so must every kernel, persistent or looped
    x = (torch.ones(3, 2048) + torch.rand(3, 2048) / 64).to(dtype)
    with patch(triton_persistent_rnumel=4096 if persistent else 64):
        c = check(lambda a: (a.sum(-1), a.float().mean(-1), (a * 2).amax(-1)), x, atol=1e-2, rtol=1e-3)
    src = c.kernel_source
    name = {torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16"}[dtype]
    loads = [line for line in src.splitlines() if "tl.load(" in line]
    assert loads and all(line.rstrip().endswith(".to(tl.float32)") for line in loads), loads
    assert name in src  # stored narrow again
    if not persistent:
        assert "tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)" in src


def test_zero_dim_inputs_combine_with_blocks():
    # a 0-d input is loaded as a block: the interpreter could not `|` a 0-d bool with a block
    # (maximum(s, x)'s NaN test, fuzzer seed 900023); bool ops of a 0-d and a block too
    s, x = torch.tensor(0.25), torch.randn(9, 6)
    check(lambda s, a: (torch.maximum(s, a), torch.minimum(a, s)), s, x)
    b, m = torch.tensor(True), torch.rand(3, 4) > 0.5
    check(lambda b, m: (b | m, m & b, b ^ m, torch.logical_or(b, m), torch.logical_and(m, b)), b, m)
    check(lambda s, a: torch.maximum(s.to(torch.bfloat16), a.to(torch.bfloat16)), s, x)
    # a float64 constant is a 0-d tensor too (OpInfo linalg.matrix_rank: clamp_min(x, 0.0))
    check(lambda a: (a.double().clamp_min(0.0), a.double().clamp_max(0.5)), x)


def test_embedding_gather_runs_as_an_extern_between_kernels():
    """A gather of indices from memory has no native lowering (eager raises on an out-of-range index,
    a kernel cannot): the Triton path calls eager's index_select (ATen's embedding) and feeds its
    result to the next kernel."""
    w = torch.randn(10, 8)
    c = check(lambda idx, w: F.embedding(idx, w) * 2, torch.tensor([[1, 2], [9, 0]]), w)
    assert [e.op for e in c.externs] == ["aten::index_select"] and c.num_kernels == 1


# -- readability: the generated source ------------------------------------------------------------

def test_kernel_source_reads_well():
    c = compile_fn(lambda x, w: torch.softmax(x * w, -1), torch.randn(4, 16), torch.randn(16))
    src = c.kernel_source
    assert "@triton.jit" in src and "XBLOCK: tl.constexpr" in src and "RBLOCK: tl.constexpr" in src
    assert "# kernel0_" in src and "fuses FX nodes" in src and "mul" in src
    assert "persistent reduction: 4 rows x 16 reduced elements" in src
    assert "# in: float32[4, 16]" in src and "# out: float32[4, 16]" in src
    compile(src, "<kernels>", "exec")  # plain Python


def test_looped_source_has_running_accumulators():
    with patch(triton_persistent_rnumel=8):
        c = compile_fn(lambda x: x.sum(-1), torch.randn(4, 40))
    assert "for roffset in range(0, rnumel, RBLOCK):" in c.kernel_source
    assert "tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)" in c.kernel_source


# -- launching: grid, autotune choice cached on disk ----------------------------------------------

def test_autotune_choice_is_cached_on_disk(tmp_path, monkeypatch):
    calls = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **settings: calls.append((grid, settings))

    meta = dict(xnumel=1000, rnumel=None, persistent=False, written=["out"], args=["x", "out"])
    with patch(cache_dir=str(tmp_path), triton_autotune=True):
        launcher = TritonKernelLauncher(FakeKernel(), "kernel0_pointwise", meta, "source-key", interpret=False)
        options = launcher.candidates(1000, None)
        assert len(options) > 1 and all("XBLOCK" in o and "num_warps" in o for o in options)
        monkeypatch.setattr(TritonKernelLauncher, "_benchmark", lambda self, opts, args, xnumel: opts[-1])
        x = torch.randn(1000)
        launcher(x, torch.empty(1000))
        assert list(launcher.choices.values()) == [options[-1]]
        assert calls[-1] == ((-(-1000 // options[-1]["XBLOCK"]),), options[-1])
        # a fresh launcher (a new process) reads the choice back instead of timing again
        monkeypatch.setattr(TritonKernelLauncher, "_benchmark", lambda self, opts, args, xnumel: pytest.fail("re-tuned"))
        again = TritonKernelLauncher(FakeKernel(), "kernel0_pointwise", meta, "source-key", interpret=False)
        again(x, torch.empty(1000))
        assert list(again.choices.values()) == [options[-1]]
        stored = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f == "choice.json"]
        assert len(stored) == 1 and json.load(open(stored[0])) == options[-1]


def test_symbolic_extents_are_evaluated_per_call_and_choices_kept_per_size_bucket():
    calls = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **settings: calls.append((grid, args, settings))

    meta = dict(xnumel="4*s0", rnumel=None, persistent=False, written=["out"], args=["x", "out", "s0"])
    launcher = TritonKernelLauncher(FakeKernel(), "kernel0_pointwise", meta, "source-key", interpret=True)
    for s0 in (3, 250, 251, 0):
        launcher(None, None, s0)
    grids = [grid for grid, _, _ in calls]
    assert grids == [(1,), (1,), (1,)] and [a[-1] for _, a, _ in calls] == [3, 250, 251]  # size 0: no launch
    assert [c["XBLOCK"] for _, _, c in calls] == [16, 1024, 1024]
    assert len(launcher.choices) == 2  # 12 and 1000..1004 elements: two buckets


def test_empty_grid_launches_nothing():
    check(lambda a: (a * 2).sum(0), torch.randn(0, 4))


def test_missing_triton_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(BACKENDS, "triton")
    with pytest.raises(NotImplementedError, match="Triton"):
        compile_fn(lambda x: x + 1, torch.randn(4))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is for machines without a GPU")
def test_gpu_check_dry_run(tmp_path):
    """benchmarks/gpu_check.sh with the GPU work stubbed (2-6 minutes on 2 cores): every step
    passes and the results file has the summary and the benchmark table."""
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..")
    env = dict(helpers.subprocess_env(), MINICOMPILE_GPU_DRY_RUN="1", PYTHON=sys.executable)
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    results = (tmp_path / "gpu-results.md").read_text()
    assert "| gpu-tests |" in results and "FAILED" not in results and "| pointwise chain |" in results


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_benchmark_exits_cleanly_without_cuda(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_gpu", os.path.join(os.path.dirname(__file__), "..",
                                                                            "benchmarks", "bench_gpu.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out
