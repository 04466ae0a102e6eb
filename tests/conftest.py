"""Fixtures for every test. Shared functions live in tests/helpers.py, not here."""
import json
import os
import platform
import tempfile
import time

import pytest
import torch

import minicompile.backend as backend_module
from minicompile.codegen import BACKENDS
from minicompile.config import patch

# backend="minicompile" resolves through the installed entry point; a checkout run without installing
# (PYTHONPATH on a GPU machine) registers it here, or every torch.compile(backend=...) test fails
if "minicompile" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(backend_module.minicompile_backend, name="minicompile")

# Tests build into their own cache directory unless MINICOMPILE_CACHE_DIR names one.
TEST_CACHE_DIR = os.environ.get("MINICOMPILE_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                        "minicompile-test-cache")

# Under pytest-xdist (pyproject's addopts: two workers on the 2-core machine) each worker computes
# on one thread, and so do the Pythons the tests start: two workers of two OpenMP threads each
# oversubscribe the cores, and OpenMP's barriers then wait on a thread that is not running.
# Eager's first OpenMP parallel region in a process sometimes computes its second thread's share
# of sin/cos/exp ~1e-4 off (torch 2.13 CPU build, about 1 fresh process in 10; docs/testing.md):
# run one, on the process's own threads, before any test takes an eager reference.
torch.exp(torch.randn(1 << 17))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Tests marked two_threads (a file's ``pytestmark``) run their kernels on two threads under xdist
# too: their parallel loops' shares, a threaded reduction's partial results and a horizontal
# group's region need a second thread to be tested at all, and one-thread workers would run
# every loop on one.
@pytest.fixture(autouse=True)
def two_threads_for_parallel_kernels(request):
    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.node.get_closest_marker("two_threads")):
        yield
        return
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def test_config():
    """Tests see compiler errors instead of the eager fallback users get, and build into the test
    cache; subprocesses get the same knobs from ``helpers.subprocess_env``. Products run on
    oneDNN wherever it can run them: the library users get on the machines measured so far,
    and one choice on every machine, so kernel counts (a GELU folded into the product) do not
    depend on a timing (tests of "auto" and "mkl" set the knob themselves). For the same reason
    convolution graphs always run channels-last (conv_layout "auto" measures; its tests set it),
    and attention is decomposed to its math form (cpu_attention "auto" measures; its tests set it),
    and activations and residual adds stay out of the products (cpu_epilogue "auto" measures, and
    chose "separate" on the machines measured so far; tests/test_epilogues.py sets it)."""
    with patch(fallback_on_error=False, cache_dir=TEST_CACHE_DIR, cpu_gemm="onednn", conv_layout="channels_last",
               cpu_attention="math", cpu_epilogue="separate"):
        yield


@pytest.fixture(params=["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    "triton" not in BACKENDS, reason="triton is not installed"))])
def backend(request):
    """The code generator under test; Triton runs CPU tensors in its interpreter."""
    with patch(cpu_backend=request.param):
        yield request.param


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def compiles(monkeypatch):
    """The CompiledGraphs the backend builds through the pipeline (the per-shape path counts too)."""
    built = []
    compile_graph = backend_module.compile_graph

    def counting(gm, example_inputs):
        built.append(compile_graph(gm, example_inputs))
        return built[-1]
    monkeypatch.setattr(backend_module, "compile_graph", counting)
    return built


# -- the run record behind the numbers docs/testing.md and the README quote -------------------------

def pytest_addoption(parser):
    parser.addoption("--record-run", metavar="FILE", default=None,
                     help="write this run's outcome counts, duration and machine load to FILE (JSON); "
                          "python -m minicompile.tools.doc_numbers puts them into the docs")


def pytest_configure(config):
    config.run_started = time.time()


# Under pytest-xdist the controller collects nothing, so it never sees the slow tests deselected:
# each worker (all collect the same tests) sends its count back in ``workeroutput``.
_deselected = [0]


def pytest_deselected(items):
    _deselected[0] += len(items)


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["deselected"] = _deselected[0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _deselected[0] = max(_deselected[0], getattr(node, "workeroutput", {}).get("deselected", 0))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.getoption("--record-run")
    if not path:
        return
    stats = terminalreporter.stats
    counts = {k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") in ("call", "setup", None)])
              for k in ("passed", "failed", "skipped", "xfailed", "error")}
    counts["deselected"] = max(len(stats.get("deselected", [])), _deselected[0])
    record = {"command": "python -m pytest " + " ".join(config.invocation_params.args),
              "counts": counts, "duration_s": round(time.time() - config.run_started, 1),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
              "workers": config.getoption("numprocesses", None) or 1,
              "load_average_at_end": round(os.getloadavg()[0], 1), "python": platform.python_version(),
              "torch": torch.__version__, "exit_status": int(exitstatus)}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
