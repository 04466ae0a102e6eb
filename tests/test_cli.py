"""The `minicompile` command: as a subprocess the way users run it, and in-process through its entry point."""
import json
import subprocess
import sys
import textwrap

import pytest

from minicompile.cli import main
from minicompile.lowering.graph import _last_frame
from tests.helpers import subprocess_env


def test_source_lines_drop_caret_markers():
    trace = ('  File "/home/u/model.py", line 11, in forward\n'
             '    h = torch.softmax(self.ln(x), dim=-1)\n'
             '        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n')
    assert _last_frame(trace) == "model.py:11: h = torch.softmax(self.ln(x), dim=-1)"


CLI = [sys.executable, "-m", "minicompile.cli"]

MODEL_WITH_EXTERN = textwrap.dedent("""
    import torch

    def model(x, w):
        h = torch.softmax(x, dim=-1) * w
        return torch.cumsum(h, dim=1) + 1.0   # cumsum has no lowering: an extern call

    example_inputs = (torch.randn(8, 32), torch.randn(32))
""")

FACTORY_MODULE = textwrap.dedent("""
    import torch

    def get_model():
        return torch.nn.LayerNorm(16).eval(), (torch.randn(4, 16),)
""")


def run_cli(*args, cwd=None, timeout=300, **env):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, env=subprocess_env(**env),
                          timeout=timeout)


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """One `inspect --out` run of a script with an extern fallback, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("inspect")
    script = tmp / "model_with_extern.py"
    script.write_text(MODEL_WITH_EXTERN)
    out = tmp / "artifacts"
    proc = run_cli("inspect", str(script), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, out


def test_inspect_shows_every_stage(inspected):
    stdout, _ = inspected
    for title in ("graph breaks", "guards", "captured FX graph", "ATen graph", "fusion groups",
                  "generated kernels", "host wrapper"):
        assert title in stdout, title
    assert "1 graph(s), 0 graph break(s)" in stdout
    assert "TENSOR_MATCH" in stdout and "float32[8, 32]" in stdout
    assert "extern void kernel0" in stdout or "kernel0" in stdout


def test_inspect_shows_extern_reason(inspected):
    stdout, _ = inspected
    assert "extern cumsum (aten::cumsum): no lowering for aten::cumsum" in stdout


def test_inspect_shows_user_source_lines(inspected):
    # Needs aot/trace.py to run the graph under torch.fx.traceback.preserve_node_meta();
    # without it the ATen graph has no stack traces and no source lines can be shown.
    stdout, _ = inspected
    assert "model_with_extern.py:5: h = torch.softmax(x, dim=-1) * w" in stdout


def test_inspect_out_writes_artifacts_and_a_reproducer_that_matches_eager(inspected):
    _, out = inspected
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"summary.txt", "breaks.txt", "guards.txt", "graph0/fx_graph.py", "graph0/aten_graph.py",
            "graph0/fusion.txt", "graph0/kernels.cpp", "graph0/wrapper.py", "graph0/repro.py"} <= names
    assert "no lowering for aten::cumsum" in (out / "graph0" / "fusion.txt").read_text()
    proc = subprocess.run([sys.executable, str(out / "graph0" / "repro.py")], capture_output=True, text=True,
                          timeout=300, env=subprocess_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MATCH" in proc.stdout and "MISMATCH" not in proc.stdout


MODEL_WITH_BREAK = textwrap.dedent("""
    import torch

    def model(x, w):
        h = torch.softmax(x, dim=-1) * w
        print("graph break")
        return torch.cumsum(h, dim=1) + 1.0

    example_inputs = (torch.randn(8, 32), torch.randn(32))
""")


@pytest.mark.parametrize("frontend", ["dynamo", "minicompile"])
def test_inspect_prints_the_same_stages_for_both_front_ends(tmp_path, capsys, frontend):
    # In-process through the CLI's entry point: the same report and printers serve both.
    script = tmp_path / "model_with_break.py"
    script.write_text(MODEL_WITH_BREAK)
    assert main(["inspect", str(script), "--frontend", frontend, "--out", str(tmp_path / "out")]) == 0
    stdout = capsys.readouterr().out
    assert f"2 graph(s), 1 graph break(s)" in stdout and f"(front end: {frontend})" in stdout
    assert "compiled output vs eager: max abs diff" in stdout
    assert f"break 0: {script}:6 in model()" in stdout and "print" in stdout
    assert "TENSOR_MATCH" in stdout and "float32[8, 32] stride (32, 1) cpu" in stdout
    for i in (0, 1):
        for title in ("captured FX graph", "ATen graph", "fusion groups", "generated kernels", "host wrapper"):
            assert f"graph {i}: {title}" in stdout, (i, title)
    assert "extern cumsum (aten::cumsum): no lowering for aten::cumsum" in stdout
    assert "model_with_break.py:7" in stdout   # the cumsum's source line, after the break
    written = {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert {"breaks.txt", "guards.txt", "graph0/repro.py", "graph1/kernels.cpp", "graph1/repro.py"} <= written


def test_inspect_minicompile_front_end_shows_a_fallback_and_its_graph(tmp_path, capsys):
    script = tmp_path / "model_with_class.py"   # a class statement has no split point: fx traces it
    script.write_text("import torch\n\ndef model(x):\n    class Local:\n        pass\n    y = x.sin()\n"
                      "    return y * 2\n\nexample_inputs = (torch.randn(4, 8),)\n")
    assert main(["inspect", str(script), "--frontend", "minicompile", "--stages", "breaks,fusion"]) == 0
    stdout = capsys.readouterr().out
    assert "1 graph(s), 0 graph break(s)" in stdout
    assert "fallback to fx for model(): class definition inside the function" in stdout
    assert f"fallback to fx: {script}:3 in model()" in stdout
    assert "graph 0: fusion groups" in stdout and "1 kernel(s)" in stdout


TRAIN_TARGET = textwrap.dedent("""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Tanh())
    example_inputs = (torch.randn(4, 8),)
""")


def test_inspect_train_shows_the_partition_then_forward_and_backward_stages(tmp_path, capsys):
    script = tmp_path / "train_target.py"
    script.write_text(TRAIN_TARGET)
    out = tmp_path / "out"
    assert main(["inspect", str(script), "--train", "--stages", "graph,fusion,kernels", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "(): training graph; forward: " in stdout and "; backward: " in stdout
    diff = float(stdout.split("compiled output and gradients vs eager: max abs diff ")[1].split()[0])
    assert diff < 1e-4   # the output and the gradients of x and of all four parameters
    assert "partition (min_cut): " in stdout and "  saved " in stdout
    titles = [line for line in stdout.splitlines() if line.startswith("=== graph 0: ")]
    assert [t.split(" ===")[0].removeprefix("=== graph 0: ") for t in titles] == [
        "captured FX graph", "partition report (saved for backward, recomputed)",
        "forward: fusion groups", "forward: generated kernels", "backward: fusion groups",
        "backward: generated kernels"]
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"graph0/partition.txt", "graph0/forward/kernels.cpp", "graph0/backward/kernels.cpp",
            "graph0/backward/aten_graph.py", "graph0/repro.py"} <= written
    assert main(["inspect", str(script), "--train", "--frontend", "minicompile"]) == 2
    assert "--train captures with torch.compile" in capsys.readouterr().err


def test_inspect_unknown_front_end_exits_2(capsys):
    assert main(["inspect", "x.py", "--frontend", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown front end 'bogus'" in err and "dynamo" in err and "minicompile" in err


def test_inspect_module_callable_target_and_stage_selection(tmp_path):
    (tmp_path / "factory_target.py").write_text(FACTORY_MODULE)
    proc = run_cli("inspect", "factory_target:get_model", "--stages", "fusion", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "fusion groups" in proc.stdout
    assert "host wrapper" not in proc.stdout and "captured FX graph" not in proc.stdout


@pytest.mark.parametrize("target, message", [
    ("does_not_exist.py", "does not exist"),
    ("no_such_module_xyz:get_model", "cannot import module 'no_such_module_xyz'"),
    ("not a target", "neither an existing .py file nor module:callable"),
])
def test_inspect_bad_target_exits_2_with_a_clear_message(tmp_path, target, message):
    proc = run_cli("inspect", target, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert any(hint in proc.stderr for hint in ("get_model()", "module:callable", "run minicompile from"))


def test_inspect_script_without_model_exits_2(tmp_path):
    script = tmp_path / "empty.py"
    script.write_text("x = 1\n")
    proc = run_cli("inspect", str(script))
    assert proc.returncode == 2
    assert "defines neither `model` and `example_inputs` nor `get_model()`" in proc.stderr


def test_inspect_unknown_stage_exits_2(tmp_path):
    proc = run_cli("inspect", "x.py", "--stages", "graph,bogus")
    assert proc.returncode == 2 and "unknown stage(s) bogus" in proc.stderr


def test_help_documents_the_target_convention():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "get_model()" in proc.stdout and "example_inputs" in proc.stdout and "MINICOMPILE_DEBUG" in proc.stdout


def test_cache_info_and_clear(tmp_path):
    env_dir = tmp_path / "cache"
    (env_dir / "cpp" / "ab").mkdir(parents=True)
    (env_dir / "cpp" / "ab" / "entry.so").write_bytes(b"x" * 10)
    info = run_cli("cache", "info", MINICOMPILE_CACHE_DIR=str(env_dir))
    assert info.returncode == 0 and str(env_dir) in info.stdout and "files: 1" in info.stdout
    clear = run_cli("cache", "clear", MINICOMPILE_CACHE_DIR=str(env_dir))
    assert clear.returncode == 0 and "removed 1 file(s)" in clear.stdout
    assert not (env_dir / "cpp").exists()


def test_bench_tiny_workload_prints_all_columns_and_json(tmp_path):
    # Inductor's cold compile takes ~30 s on 2 cores: the suite benchmarks minicompile vs eager
    # only; `bench --quick` (all three columns) is run by hand and shown in docs/cli.md.
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--workloads", "pointwise", "--size", "tiny", "--no-inductor", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for column in ("eager ms", "minicompile ms", "inductor ms", "mc compile s cold/warm", "copy GB/s"):
        assert column in proc.stdout
    data = json.loads(out.read_text())
    assert data["machine"]["torch"]
    (r,) = data["results"]
    assert r["workload"] == "pointwise"
    assert r["eager"]["median_s"] > 0 and r["minicompile"]["median_s"] > 0
    assert r["minicompile"]["max_abs_diff"] < 1e-5
    assert r["minicompile"]["compile_s"] > 0 and r["minicompile"]["warm_compile_s"] > 0
    assert r["copy_bytes_per_s"] > 0


def test_bench_train_tiny_prints_steps_saved_bytes_and_json(tmp_path):
    # minicompile vs eager only, as above; the CNN's BatchNorm in train mode may run eagerly, and
    # the table must then say so rather than report eager's time as minicompile's.
    out = tmp_path / "train.json"
    proc = run_cli("bench", "--train", "--workloads", "mlp,cnn", "--size", "tiny", "--no-inductor",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for column in ("eager ms", "minicompile ms", "mc / eager", "cold compile s mc", "saved KiB eager / mc"):
        assert column in proc.stdout
    results = {r["workload"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"mlp", "cnn"}
    for name, r in results.items():
        assert r["minicompile"]["max_diff"] < 1e-5 and r["minicompile"]["compile_s"] > 0
        assert r["minicompile"]["import_s"] > 0 and r["minicompile"]["inprocess_compile_s"] > 0  # cold: own process
        assert r["eager"]["saved"] > 0 and r["minicompile"]["saved"] > 0
        row = next(line for line in proc.stdout.splitlines() if line.startswith(name + " "))
        assert ("(eager graphs)" in row) == bool(r["eager_graphs"]), row
    assert results["mlp"]["eager_graphs"] == []


def test_bench_cuda_without_gpu_exits_cleanly():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = run_cli("bench", "--device", "cuda")
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_debug_ladder_prints_the_same_stages(tmp_path):
    script = tmp_path / "dbg.py"
    script.write_text("import torch\n"
                      "f = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend='minicompile')\n"
                      "with torch.no_grad():\n    f(torch.randn(4, 8))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=subprocess_env(MINICOMPILE_DEBUG="4"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "[minicompile] graph: 1 kernel(s)" in proc.stdout
    for title in ("captured FX graph", "ATen graph", "fusion groups", "generated kernels"):
        assert title in proc.stdout
    assert "host wrapper" not in proc.stdout


def test_bench_models_tiny_prints_the_table_and_json(tmp_path):
    # the real-model suite at its test size, minicompile vs eager only (Inductor's compile is slow)
    out = tmp_path / "models.json"
    proc = run_cli("bench", "--models", "--workloads", "resnet18", "--size", "tiny", "--no-inductor",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "resnet18" in proc.stdout and "geomean" in proc.stdout
    result = json.loads(out.read_text())["results"][0]
    assert result["model"] == "resnet18" and result["minicompile"]["max_abs_diff"] < 1e-4
    assert result["eager"]["median_s"] > 0 and result["minicompile"]["median_s"] > 0
    assert result["minicompile"]["compile_s"] > 0 and "import_s" in result["minicompile"]   # its own cold process


def test_cold_compile_env_empties_every_cache_inductor_reads(tmp_path):
    # Inductor's precompiled header sits outside TORCHINDUCTOR_CACHE_DIR (under the temp dir);
    # a torch release that moves it, or another cache, would make "cold" compiles warm.
    from minicompile.tools.cold_compile import cold_env
    env = cold_env(str(tmp_path))
    probe = ("import os, torch._inductor.codecache as c, torch._inductor.runtime.cache_dir_utils as d\n"
             "print(c._HEADER_DIR); print(d.cache_dir()); print(d.triton_cache_dir(0))")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for path in proc.stdout.split():
        assert path.startswith(str(tmp_path)), path
    assert env["MINICOMPILE_CACHE_DIR"].startswith(str(tmp_path)) and "MINICOMPILE_DEBUG" not in env


def test_cold_compile_measures_dynamos_floor_with_the_eager_backend():
    # the floor both compilers share (Dynamo's capture and an eager first step), docs/training.md
    from minicompile.tools.cold_compile import measure
    floor = measure("train", "mlp", "tiny", "eager")
    ours = measure("train", "mlp", "tiny", "minicompile", MINICOMPILE_FALLBACK="0")
    assert "error" not in floor and "error" not in ours, (floor, ours)
    assert 0 < floor["compile_s"] < ours["compile_s"], (floor, ours)


def _dynamic_row(stdout: str, workload: str) -> list:
    return next(line for line in stdout.splitlines() if line.startswith(workload + " ")).split()


def test_bench_dynamic_tiny_times_static_and_dynamic_builds():
    # one workload, minicompile's builds only (Inductor's four compiles take minutes on 2 cores;
    # the slow test below runs them); the compile counts prove the dynamic build served the
    # measured size without a recompile
    proc = run_cli("bench", "--dynamic", "--workloads", "pointwise", "--size", "tiny", "--no-inductor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for column in ("eager ms", "mc static ms", "mc dynamic ms", "mc static/dynamic", "compiles (mc s, mc d)"):
        assert column in proc.stdout
    assert "inductor" not in proc.stdout
    row = _dynamic_row(proc.stdout, "pointwise")
    assert row[-3:-1] == ["1", "1"], row


@pytest.mark.slow
def test_bench_dynamic_with_inductor_columns():
    proc = run_cli("bench", "--dynamic", "--workloads", "softmax", "--size", "tiny", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inductor dynamic ms" in proc.stdout and "ind dyn/mc dyn" in proc.stdout
    assert _dynamic_row(proc.stdout, "softmax")[-5:-1] == ["1", "1", "1", "1"]


def test_bench_dynamic_unknown_workload_is_a_usage_error():
    proc = run_cli("bench", "--dynamic", "--workloads", "nope")
    assert proc.returncode == 2 and "unknown workload" in proc.stderr
