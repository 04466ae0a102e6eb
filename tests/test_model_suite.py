"""The model suite's sizes and batch option (tools/models.py, tools/models_more.py); whether each model
compiles and matches eager is checked at its tiny size in tests/test_conv_layout.py (vision) and
tests/test_shipped_defaults.py (Hugging Face), and at batch 16 here for the wider half; every model
in bfloat16 and a vision/language half under autocast here too (issue 27 item 2)."""
import importlib.util
import json

import pytest
import torch

from minicompile.cli import main
from minicompile.tools.models import MODELS
from tests.helpers import assert_matches_eager, compile_with_dynamo

WIDER = ["resnext", "densenet", "deit", "mixer", "llama", "t5"]
BF16 = dict(atol=2e-2, rtol=2e-2)   # a bfloat16 ulp is 2**-7 relative: products rounded once more or less


def _needs(name):
    if MODELS[name].needs and importlib.util.find_spec(MODELS[name].needs) is None:
        pytest.skip(f"needs {MODELS[name].needs}")


@pytest.mark.parametrize("name", list(MODELS))
def test_every_size_builds_and_batch_replaces_the_first_size(name):
    _needs(name)
    shapes = {size: [tuple(x.shape) for x in MODELS[name].build(size)[1]] for size in ("full", "quick", "tiny")}
    assert shapes["quick"] != shapes["full"]   # quick: smaller images or sequences
    for batch in (1, 16):
        _, inputs = MODELS[name].build("tiny", batch)
        assert [tuple(x.shape) for x in inputs] == [(batch, *s[1:]) for s in shapes["tiny"]]


@pytest.mark.parametrize("name", WIDER)
def test_wider_suite_matches_eager_at_batch_16(name, fresh_dynamo):
    _needs(name)
    model, inputs = MODELS[name].build("tiny", 16)
    with torch.no_grad():
        ref = model(*inputs)
    out, graphs = compile_with_dynamo(model, *inputs)
    assert_matches_eager(out, ref, atol=1e-4, rtol=1e-4)
    assert len(graphs) == 1 and hasattr(graphs[0], "aten")   # one compiled graph, no fallback


def test_batch_is_for_models_inference_only(capsys):
    assert main(["bench", "--batch", "2"]) == 2
    assert main(["bench", "--models", "--train", "--batch", "2"]) == 2
    assert "--batch N (N >= 1) is for --models" in capsys.readouterr().err


def test_bench_models_batch_reaches_the_worker(tmp_path):
    from tests.test_cli import run_cli
    out = tmp_path / "models.json"
    proc = run_cli("bench", "--models", "--workloads", "mixer", "--size", "tiny", "--batch", "3", "--no-inductor",
                   "--no-cold-compile", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())["results"][0]
    assert result["shape"] == "mixer (tiny), batch 3" and result["minicompile"]["max_abs_diff"] < 1e-4
    assert "compile_s" not in result["minicompile"]   # no cold-compile process


NARROW = [(name, {"dtype": "bf16"}) for name in MODELS] + \
    [(name, {"autocast": "bf16"}) for name in ("resnet18", "convnext", "vit", "gpt2", "bert", "llama")]


@pytest.mark.parametrize("name, precision", NARROW, ids=[f"{n}-{next(iter(p))}" for n, p in NARROW])
def test_suite_in_bfloat16_matches_eager(name, precision, fresh_dynamo):
    """``model.to(torch.bfloat16)`` with bfloat16 inputs, as CPU inference serves (bench --models --dtype bf16),
    and the forward under ``torch.autocast("cpu", torch.bfloat16)`` (--autocast bf16): the casts eager's
    autocast inserts are traced into the graph."""
    _needs(name)
    model, inputs = MODELS[name].build("tiny", **precision)
    with torch.no_grad():
        ref = model(*inputs)
    out, graphs = compile_with_dynamo(model, *inputs)
    assert out.dtype == ref.dtype and (out.dtype == torch.bfloat16 or "autocast" in precision)
    torch.testing.assert_close(out, ref, **BF16)
    assert len(graphs) == 1 and hasattr(graphs[0], "aten")   # one compiled graph, no fallback


def test_bench_models_dtype_and_autocast_reach_the_worker(tmp_path, capsys):
    from tests.test_cli import run_cli
    out = tmp_path / "models.json"
    proc = run_cli("bench", "--models", "--workloads", "mixer", "--size", "tiny", "--dtype", "bf16", "--no-inductor",
                   "--no-cold-compile", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["results"][0]["shape"] == "mixer (tiny), bf16" and data["machine"]["dtype"] == "bf16"
    assert "inference (bf16)" in proc.stdout
    assert main(["bench", "--models", "--train", "--dtype", "bf16"]) == 2
    assert "--dtype is for --models (inference)" in capsys.readouterr().err


def test_bench_models_mode_reaches_both_compilers(tmp_path, monkeypatch):
    """``bench --models --mode max-autotune``: the timing worker's and both cold-compile processes' command
    lines carry the mode, and in each process both compilers get ``torch.compile(..., mode=mode)``
    (processes and compilers stood in for: this checks the plumbing, not a compile)."""
    import subprocess
    from minicompile.tools import bench_models, cold_compile
    commands, compiles, real_run = [], [], subprocess.run

    def fake_run(cmd, **kwargs):
        if "--result" not in cmd:
            return real_run(cmd, **kwargs)   # lscpu
        commands.append(cmd)
        with open(cmd[cmd.index("--result") + 1], "w") as f:
            json.dump({"compile_s": 1.0, "import_s": 0.1} if cmd[2].endswith("cold_compile") else
                      {"model": "mixer", "shape": "", "minicompile": {}, "inductor": {}}, f)
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert main(["bench", "--models", "--workloads", "mixer", "--size", "tiny", "--mode", "max-autotune"]) == 0
    assert [c[2] for c in commands] == ["minicompile.tools.bench_models"] + ["minicompile.tools.cold_compile"] * 2
    assert all(c[c.index("--mode") + 1] == "max-autotune" for c in commands)

    monkeypatch.setattr(torch, "compile", lambda model, backend, mode: compiles.append((backend, mode)) or model)
    for cmd, run in zip(commands, [bench_models.main, cold_compile.main, cold_compile.main]):
        at = cmd.index("--result")
        assert run(cmd[3:at] + cmd[at + 2:] + ["--result", str(tmp_path / "result.json")]) == 0
    assert compiles == [("minicompile", "max-autotune"), ("inductor", "max-autotune")] * 2
