"""The pipeline end to end: kernel counts, eager's strides, error paths, the Dynamo entry point."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import minicompile
from minicompile.config import patch
from minicompile.runtime import CompilerNotFound, CppCompileError
from tests.helpers import assert_matches_eager, check, compile_fn, compile_with_dynamo, subprocess_env

# -- kernel counts, on both code generators (the `backend` fixture) ----------------------------


def counted(backend, fn, *inputs, **tol):
    return check(fn, *inputs, backend=backend, **tol)


def test_pointwise_chain_is_one_kernel(backend):
    c = counted(backend, lambda x, y: ((x * 2 + y).relu() * x).sin() - y.exp(), torch.randn(32, 64), torch.randn(64))
    assert c.num_kernels == 1 and not c.externs


def test_softmax_last_dim_is_one_kernel(backend):
    c = counted(backend, lambda x: torch.softmax(x, -1), torch.randn(32, 128))
    assert c.num_kernels == 1 and not c.externs


def test_layer_norm_is_one_kernel(backend):
    w, b = torch.randn(128), torch.randn(128)
    c = counted(backend, lambda x: F.layer_norm(x, (128,), w, b), torch.randn(32, 128), atol=1e-5, rtol=1e-4)
    assert c.num_kernels == 1 and not c.externs


def test_sibling_reductions_share_a_kernel(backend):
    c = counted(backend, lambda x: (x.sum(-1), x.amax(-1), x.mean(-1)), torch.randn(16, 64))
    assert c.num_kernels == 1


def test_fused_intermediates_are_not_materialized(backend):
    c = counted(backend, lambda x: torch.softmax(x * 3, -1) + 1, torch.randn(8, 32))
    kernel = c.schedule.kernels[0]
    stored = [n for n in kernel.nodes if n.name not in kernel.local and n.name not in kernel.scratch]
    assert len(stored) == 1  # only the output reaches memory
    assert plain_call(c).count("= empty_strided(") + plain_call(c).count("= empty_strided_cpu(") == 1


def plain_call(c) -> str:
    """The wrapper's plain ``call``, without its profiled twin (which repeats every step)."""
    return c.wrapper_source.split("def call_profiled")[0]


def transformer_block(x, ln1_w, ln1_b, w_qkv, w_out, ln2_w, ln2_b, w_fc, w_proj):
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv).split(C, dim=-1)
    q, k, v = (t.view(B, T, 4, C // 4).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / (C // 4) ** 0.5)
    mask = torch.ones(T, T).tril() == 0
    att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + y @ w_out
    h = F.layer_norm(x, (C,), ln2_w, ln2_b)
    return x + F.gelu(h @ w_fc) @ w_proj


def block_inputs(B=2, T=16, C=32):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2
    return (r(B, T, C), 1 + r(C), r(C), r(C, 3 * C), r(C, C), 1 + r(C), r(C), r(C, 4 * C), r(4 * C, C))


def test_transformer_block_kernels(backend):
    # the Triton interpreter runs one numpy step per program: a smaller block there
    inputs = block_inputs() if backend == "cpp" else block_inputs(B=1, T=8, C=16)
    out, graphs = compile_with_dynamo(transformer_block, *inputs)
    assert_matches_eager(out, transformer_block(*inputs), 1e-4, 1e-4)
    assert len(graphs) == 1 and graphs[0].backend == backend
    c = graphs[0]
    eager_ops = len([n for n in c.aten.gm.graph.nodes if n.op == "call_function"])
    compute_ops = [e for e in c.externs if "mm" not in e.op and "_linear_pointwise" not in e.op]
    # eager launches one ATen op per node; the pointwise and reduction work here is a handful of kernels
    assert c.num_kernels <= 10, str(c.schedule)
    assert c.num_kernels * 3 < eager_ops, (c.num_kernels, eager_ops)
    assert not compute_ops or all("gelu" in e.op for e in compute_ops), c.explain()


# -- layouts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: torch.randn(16, 24).t(),                                   # transposed
    lambda: torch.randn(16, 48)[:, ::3],                               # sliced with a step
    lambda: torch.randn(32, 24)[4:20],                                 # offset slice
    lambda: torch.randn(24).expand(16, 24),                            # broadcast (stride 0)
    lambda: torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last),
    lambda: torch.randn(4, 6, 8).permute(2, 0, 1),
], ids=["transposed", "step_slice", "offset_slice", "expanded", "channels_last", "permuted"])
def test_strided_inputs_give_eager_values_and_strides(make):
    x = make()
    check(lambda a: (a * 2).exp() + a, x)
    check(lambda a: a.sum(-1) + a.amax(-1), x)


def test_outputs_that_are_views_keep_eager_strides():
    check(lambda a: ((a + 1).t(), (a * 2)[:, 1:], a.view(-1)), torch.randn(6, 8))


def test_input_mutation_is_written_back():
    a = torch.randn(4, 8)
    expected = a.clone().add_(1).mul_(2)
    c = compile_fn(lambda t: t.add_(1).mul_(2), a.clone())
    out = c(a)
    torch.testing.assert_close(a, expected)
    torch.testing.assert_close(out, expected)


# -- bad input --------------------------------------------------------------------------------

def test_missing_compiler_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with minicompile.patch(cxx="", cache_dir=str(tmp_path / "cache")):
        from minicompile.runtime import cpp_build
        cpp_build._find_compiler.cache_clear()
        try:
            with pytest.raises(CompilerNotFound, match="MINICOMPILE_CXX"):
                compile_fn(lambda x: x.sin() + 1.2345, torch.randn(3))
        finally:
            cpp_build._find_compiler.cache_clear()


def test_unlowered_op_runs_as_extern_with_reason():
    c = check(lambda x: torch.cumsum(x, 0).sin(), torch.randn(5, 3))
    assert any("cumsum" in e.op and e.reason for e in c.externs)
    assert "cumsum" in c.explain()


def test_compile_error_reports_source_path(tmp_path):
    from minicompile.runtime import cpp_build
    with minicompile.patch(cache_dir=str(tmp_path)):
        with pytest.raises(CppCompileError) as err:
            cpp_build.build('extern "C" void broken( { this is not C++ }')
    path = str(err.value).split("source: ")[1].split(")")[0]
    assert os.path.exists(path) and path.endswith(".cpp")


def test_graph_needing_grad_compiles_with_correct_gradients(caplog):
    """Training graphs go through the joint forward/backward path (tests/test_training.py)."""
    w = torch.randn(4, 4, requires_grad=True)
    fn = torch.compile(lambda x: (x @ w).relu().sum(), backend="minicompile")
    x = torch.randn(3, 4)
    out = fn(x)
    out.backward()
    w2 = w.detach().clone().requires_grad_(True)
    (x @ w2).relu().sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    assert "runs eagerly" not in caplog.text and "running it eagerly" not in caplog.text


def test_backend_registered_without_import():
    code = textwrap.dedent("""
        import sys, torch
        f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="minicompile")
        with torch.no_grad():
            x = torch.randn(4, 8)
            torch.testing.assert_close(f(x), torch.softmax(x * 2, -1))
        assert "minicompile" in sys.modules  # loaded by the entry point, not by us
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_internal_error_falls_back_to_eager_with_warning(monkeypatch, caplog):
    from minicompile import backend

    def broken(gm, inputs):
        raise AssertionError("simulated compiler bug")
    monkeypatch.setattr(backend, "compile_graph", broken)
    x = torch.randn(4, 4)
    with minicompile.patch(fallback_on_error=True), torch.no_grad():
        fn = backend.minicompile_backend(torch.fx.symbolic_trace(lambda t: t.sin() * 2), [x])
        torch.testing.assert_close(fn(x), x.sin() * 2)
    assert "simulated compiler bug" in caplog.text and "running it eagerly" in caplog.text
    with minicompile.patch(fallback_on_error=False), pytest.raises(AssertionError):
        backend.minicompile_backend(torch.fx.symbolic_trace(lambda t: t.sin() * 2), [x])


def test_op_returning_nothing_is_kept_as_extern():
    a = torch.randn(3, 3) + 3 * torch.eye(3)
    check(lambda t: torch.linalg.inv(t) * 2, a, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_products_pinned_to_onednn_run_as_its_linear_and_match_eager():
    # cpu/claims.py use_onednn_linear, with config.cpu_gemm pinning the library
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64, bias=False)).eval()
    x, y = torch.randn(8, 64), torch.randn(64, 32)
    with patch(cpu_gemm="onednn"), torch.no_grad():
        c = check(mlp, x, atol=1e-5, rtol=1e-4)
        assert plain_call(c).count("# mkldnn._linear_pointwise.default:") == 2  # with and without bias
        c = check(mlp, x.view(2, 4, 64), atol=1e-5, rtol=1e-4)                   # batch dims folded into rows
        assert plain_call(c).count("# mkldnn._linear_pointwise.default:") == 2
        for a, b in ((x, y), (x.t().contiguous().t(), y.t().contiguous().t()), (x[:, ::2], y[::2])):
            c = check(lambda a, b: a @ b, a, b, atol=1e-5, rtol=1e-4)           # any layout of either operand
            assert plain_call(c).count("# mkldnn._linear_pointwise.default:") == 1
        c = check(lambda a, b: a @ b.expand(64, 32), x, y[:1])                  # a broadcast operand: MKL
        assert "mkldnn" not in c.wrapper_source
    with patch(cpu_gemm="mkl"), torch.no_grad():
        c = check(mlp, x)
        assert "mkldnn" not in c.wrapper_source


def test_auto_gemm_choice_is_measured_once_and_remembered(monkeypatch):
    # cpu/timing.library_choice: the faster candidate wins; the choice is kept on disk
    import time
    from minicompile.cpu import timing
    key = f"test-choice-{time.time_ns()}"
    assert timing.library_choice(key, {"slow": lambda: time.sleep(0.002), "fast": lambda: None}) == "fast"
    monkeypatch.setattr(timing, "_library_choices", {})            # a new process: read from disk
    def never():
        raise AssertionError("a remembered choice is not measured again")
    assert timing.library_choice(key, {"slow": never, "fast": never}) == "fast"
    failing = {"raises": lambda: 1 / 0, "runs": lambda: time.sleep(0.001)}
    assert timing.library_choice(key + "-2", failing) == "runs"   # a candidate that raises is never chosen
    broken = {"raises": lambda: 1 / 0, "also raises": lambda: [][0]}
    with pytest.raises(timing.NoCandidateRan, match="ZeroDivisionError"):
        timing.library_choice(key + "-3", broken)
    assert timing.library_choice(key + "-4", broken, otherwise="ours") == "ours"   # where none runs


def test_a_preferred_library_is_kept_unless_another_is_faster_by_the_margin():
    import time
    from minicompile.cpu import timing

    def spin(seconds):  # CPU time, which the measurement counts (a sleep would count nothing)
        def run():
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
        return run
    key = f"test-prefer-{time.time_ns()}"
    close = {"kept": spin(0.002), "other": spin(0.0019)}
    assert timing.library_choice(key, close, prefer="kept", margin=0.3) == "kept"
    far = {"kept": spin(0.004), "other": spin(0.001)}
    assert timing.library_choice(key + "-far", far, prefer="kept", margin=0.3) == "other"


def test_matrix_products_write_into_the_wrappers_buffers():
    # codegen/wrapper.py OUT_VARIANTS: mm and bmm results come from the wrapper's buffers (out=)
    def fn(a, b, c):
        return (a @ b).relu() @ b.t(), torch.bmm(c, c.transpose(1, 2)) * 2
    args = (torch.randn(300, 64), torch.randn(64, 64), torch.randn(3, 70, 80))
    with patch(cpu_gemm="mkl"), torch.no_grad():
        c = check(fn, *args)
    assert "aten.mm.out" in c.wrapper_source and "aten.bmm.out" in c.wrapper_source


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_exact_gelu_after_a_onednn_linear_is_its_post_op():
    # cpu/epilogues.py: only when GELU is the linear's one use (tests/test_epilogues.py: the rest)
    class Layer(torch.nn.Module):
        def __init__(self, form):
            super().__init__()
            self.fc, self.form = torch.nn.Linear(64, 256), form

        def forward(self, v):
            y = self.fc(v)
            if self.form == "exact":
                return F.gelu(y) * 2
            if self.form == "reused":  # the linear's value feeds more than the GELU
                return F.gelu(y) + y
            return F.gelu(y, approximate="tanh")

    torch.manual_seed(0)
    x = torch.randn(8, 64)
    post_op = "'gelu', [], 'none')"
    with patch(cpu_gemm="onednn", cpu_epilogue="fused"), torch.no_grad():
        c = check(Layer("exact"), x, atol=1e-5, rtol=1e-4)
        assert post_op in c.wrapper_source and "with gelu as its post-op" in c.wrapper_source
        c = check(Layer("reused"), x, atol=1e-5, rtol=1e-4)
        assert post_op not in c.wrapper_source
        c = check(Layer("tanh"), x, atol=1e-5, rtol=1e-4)
        assert post_op not in c.wrapper_source and "'gelu', [], 'tanh')" in c.wrapper_source


@pytest.mark.parametrize("train", [False, True])
def test_library_choices_are_measured_outside_make_fx(monkeypatch, train):
    # cpu/timing.measured_first: inside make_fx a claim only looks a choice up; one not measured
    # yet is measured after that trace, and the graph traced again with the answer
    import inspect
    in_trace = []

    def best(candidates):   # onednn (GEMM) and flash (attention) measured faster
        in_trace.append(any(f.filename.endswith("proxy_tensor.py") for f in inspect.stack()))
        return {name: (1e-3 if name in ("onednn", "flash") else 2e-3) for name in candidates}
    out, expected = _run_timed_choices(monkeypatch, best, train)
    torch.testing.assert_close(out, expected)
    assert in_trace and not any(in_trace)


def _run_timed_choices(monkeypatch, best, train: bool):
    """A product and attention (training: products only) compiled with the GEMM and attention
    choices "auto", timed by ``best`` (candidates -> made-up times, kept off disk); (out, eager's)."""
    from minicompile.cpu import timing
    monkeypatch.setattr(timing, "_library_choices", {})
    monkeypatch.setattr(timing, "_library_times", {})
    monkeypatch.setattr(timing, "load_timings", lambda key: None)
    monkeypatch.setattr(timing, "save_choice", lambda *args: None)
    monkeypatch.setattr(timing, "_interleaved_best", best)
    torch.manual_seed(0)
    w = torch.randn(24, 32, requires_grad=train)
    x = torch.randn(2, 3, 8, 32, requires_grad=train)

    def f(x, w):
        q = x @ w.t()
        return (q @ w).sum() if train else F.scaled_dot_product_attention(q, q, q).sum()
    torch._dynamo.reset()
    with patch(cpu_gemm="auto", cpu_attention="auto"), torch.set_grad_enabled(train):
        out = torch.compile(f, backend="minicompile")(x, w)
        if train:
            out.backward()
        expected = f(x, w)
    torch._dynamo.reset()
    return out, expected


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("winner", ["preferred", "other"])
def test_a_provisional_trace_that_chose_as_measured_is_kept(monkeypatch, compiles, train, winner):
    # cpu/timing.measured_first: the provisional trace takes each question's preferred library
    # (MKL, flash); where that is what was measured, it is the trace and runs once, its header
    # saying what was measured; otherwise the graph is traced again with the answers
    from minicompile import backend
    from minicompile.cpu import policy, timing
    fast = ("mkl", "flash") if winner == "preferred" else ("onednn", "math")
    traces, headers = [], []

    def counting(trace, keep=None):
        def counted():
            traces.append(1)
            return trace()
        result = timing.measured_first(counted, keep)
        headers.extend(getattr(result, "choices", ()))
        return result
    monkeypatch.setattr(backend, "measured_first", counting)
    monkeypatch.setattr(policy, "measured_first", counting)
    best = lambda candidates: {name: (1e-3 if name in fast else 2e-3) for name in candidates}  # noqa: E731
    out, expected = _run_timed_choices(monkeypatch, best, train)
    torch.testing.assert_close(out, expected)
    assert len(traces) == (1 if winner == "preferred" else 2), traces
    headers += [line for c in compiles for line in c.aten.choices]   # inference: the ATen graph's header
    assert not any("measured after the trace" in line for line in headers), headers
    if not train:
        assert any(f"-> {fast[0]} (" in line for line in headers) and any(f"-> {fast[1]} (" in line for line in headers), headers
