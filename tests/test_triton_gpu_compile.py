"""Generated Triton kernels compile for a real GPU (Hopper, sm_90), checked without one.

The interpreter runs kernels but is not the compiler: it accepted ``tl.sqrt_rn`` of a float64,
which the first H200 run rejected. Triton's compiler and ptxas run on any machine, so each
op-table kernel (every block setting the GPU launcher would try for its sizes) is compiled
for sm_90 here and checked against the device's limits (testing/triton_gpu_compile.py). A
quarter of the table runs by default; ``-m slow`` runs the rest.
"""
import pytest
import torch

from minicompile.codegen import BACKENDS, triton_ops
from minicompile.config import config, patch
from tests.helpers import compile_fn, run_sample
from tests.op_table import SAMPLES


def _gpu_compiler_available() -> bool:
    try:
        from triton.backends import backends
        return "nvidia" in backends
    except Exception:  # noqa: BLE001
        return False


pytestmark = pytest.mark.skipif("triton" not in BACKENDS or not _gpu_compiler_available(),
                                reason="needs triton with its NVIDIA compiler backend (ptxas ships with it)")


def _kernels_of(fn, *inputs):
    from minicompile.testing.triton_gpu_compile import record_launches
    with patch(cpu_backend="triton"), record_launches() as launches:
        compile_fn(fn, *inputs)(*inputs)
    assert launches, "no Triton kernel ran"
    return launches


def test_float64_math_compiles_for_the_gpu():
    # tl.sqrt_rn is float32-only: the H200 rejected float64 rsqrt (an interpreter of triton 3.6
    # ran it); the float64 templates use tl.sqrt
    from minicompile.testing.triton_gpu_compile import compile_for_gpu

    def f(x):
        return torch.rsqrt(x.abs() + 1) * torch.sqrt(x.abs())
    assert compile_for_gpu(_kernels_of(f, torch.randn(8, 16, dtype=torch.float64))) == []


def test_a_setting_the_gpu_compiler_rejects_is_reported(monkeypatch):
    # the block settings the GPU launcher would try are compiled, not only what the interpreter ran
    from minicompile.runtime.triton_launch import TritonKernelLauncher
    from minicompile.testing.triton_gpu_compile import compile_for_gpu
    launches = _kernels_of(lambda x: x.sin() + 1, torch.randn(64))
    monkeypatch.setattr(TritonKernelLauncher, "candidates",
                        lambda self, xnumel, rnumel: [dict(XBLOCK=1 << 21, num_warps=4)])
    problems = compile_for_gpu(launches)
    assert len(problems) == 1 and "XBLOCK" in problems[0] and "numel" in problems[0], problems


def test_launch_settings_stay_within_the_device_limits():
    from minicompile.testing.triton_gpu_compile import THREADS_LIMIT
    from minicompile.runtime.triton_launch import TritonKernelLauncher
    meta = {"xnumel": 1, "rnumel": None, "persistent": False, "written": []}
    for persistent in (True, False):
        for rnumel in (None, 1, 7, 4096, 100_000):
            if persistent and rnumel and rnumel > config.triton_persistent_rnumel:
                continue  # longer rows loop
            launcher = TritonKernelLauncher(None, "k", dict(meta, rnumel=rnumel, persistent=persistent), "src", False)
            for xnumel in (1, 3, 1000, 1 << 24):
                for choice in launcher.candidates(xnumel, rnumel):
                    assert choice["num_warps"] * 32 <= THREADS_LIMIT
                    block = choice["XBLOCK"] * choice.get("RBLOCK", 1)
                    assert block <= 1 << 16, (xnumel, rnumel, choice)  # registers: at most 64K values a program
                    if rnumel is not None and persistent:
                        assert choice["RBLOCK"] >= rnumel  # a persistent row is whole in one block


def _slice(i, sample):
    return pytest.param(sample, id=sample.name, marks=() if i % 4 == 0 else pytest.mark.slow)


@pytest.mark.parametrize("sample", [_slice(i, s) for i, s in enumerate(SAMPLES)])
def test_op_table_kernels_compile_for_hopper(sample):
    from minicompile.testing.triton_gpu_compile import compile_for_gpu, record_launches
    with patch(cpu_backend="triton"), record_launches() as launches:
        graphs = run_sample(sample, backend="triton")
    assert launches or not any(getattr(g, "kernel_source", "") for g in graphs)
    assert compile_for_gpu(launches) == []


@pytest.mark.slow
@pytest.mark.parametrize("cols", [4096, 16384], ids=["persistent", "looped"])
def test_long_rows_build_without_spilling(cols):
    # rows as long as a transformer's (persistent up to 4096, looped beyond): every block setting
    # the launcher tries keeps its values in registers (no local memory); measured 29-76
    # registers a thread for softmax, layer norm and logsumexp rows in float32 and bf16
    from minicompile.testing.triton_gpu_compile import compile_for_gpu
    x = torch.randn(4, cols)
    usage = []
    assert compile_for_gpu(_kernels_of(lambda a: torch.softmax(a, -1), x), usage=usage) == []
    assert usage and all(local == 0 and regs <= 255 for _, regs, local in usage if regs is not None), usage
