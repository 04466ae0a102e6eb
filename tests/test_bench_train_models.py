"""``minicompile bench --train --models``: training steps of real models, at the tiny size.

In-process through the CLI's entry point (no torch import per test), minicompile against eager
only and without the cold-compile processes, so each run stays within seconds; the Inductor
column, the cold compiles and ``--autocast`` were run by hand (docs/training.md). The table's
marking of graphs minicompile ran eagerly is checked on made-up results."""
import json

import pytest

from minicompile.cli import main
from minicompile.tools.bench_train_models import format_table


@pytest.mark.parametrize("name", ["gpt2", "resnet18"])
def test_bench_train_models_tiny_prints_a_row_per_model_and_json(name, tmp_path, capsys, fresh_dynamo):
    if name == "gpt2":
        pytest.importorskip("transformers")
    out = tmp_path / "train_models.json"
    assert main(["bench", "--train", "--models", "--workloads", name, "--size", "tiny", "--no-inductor",
                 "--no-cold-compile", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    for column in ("eager ms", "minicompile ms", "mc / eager", "mc graphs", "cold compile s mc",
                   "saved KiB eager / mc", "max |grad diff| mc"):
        assert column in stdout
    (r,) = json.loads(out.read_text())["results"]
    assert r["workload"] == name and r["eager_graphs"] == []
    assert r["mc_graphs"]["total"] >= 1 and r["mc_graphs"]["compiled"] == r["mc_graphs"]["total"]
    assert r["eager"]["median_s"] > 0 and r["minicompile"]["median_s"] > 0
    assert r["eager"]["saved"] > 0 and r["minicompile"]["saved"] > 0
    assert r["minicompile"]["max_diff"] < 1e-3 and "compile_s" not in r["minicompile"]
    row = next(line for line in stdout.splitlines() if line.startswith(name + " "))
    assert "(eager graphs)" not in row
    assert "geomean (1 of 1)" in stdout


def _result(name, compiled, total, reasons=()):
    col = dict(median_s=0.01, inprocess_compile_s=1.0, saved=4096, max_diff=1e-7, compile_s=2.0, import_s=0.5)
    return {"workload": name, "eager_graphs": list(reasons), "mc_graphs": dict(compiled=compiled, total=total),
            "eager": dict(col, median_s=0.02), "minicompile": col, "inductor": dict(col, compile_s=8.0)}


def test_bench_train_models_table_marks_eager_graphs_and_leaves_them_out_of_the_geomean():
    info = dict(cpu="cpu", cores=2, torch="2", torch_threads=1, reps=3, size="tiny", autocast="bf16")
    table = format_table([_result("gpt2", 2, 2), _result("resnet18", 0, 1, ["autocast is enabled"]),
                          {"workload": "vit", "error": "RuntimeError: boom"}], info)
    assert "autocast bf16 forward" in table
    assert "resnet18 (eager graphs)" in table and "vit (error)" in table and "vit: RuntimeError: boom" in table
    assert "resnet18: minicompile ran 1 of 1 graph(s) eagerly (its time is eager's there): autocast is enabled" in table
    geomean = next(line for line in table.splitlines() if line.startswith("geomean"))
    assert geomean.startswith("geomean (1 of 3)") and "2.00x" in geomean and "0.25" in geomean   # compile 2 / 8


def test_saved_bytes_leave_out_what_the_caller_holds():
    """A Linear saves its input and weight; what the caller holds anyway (the input, the weight)
    is not memory the step adds: only the activation between the two products counts."""
    import torch
    from minicompile.tools.bench_train import saved_bytes
    a, b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    x = torch.randn(3, 8, requires_grad=True)
    step = lambda backward=True: b(a(x).relu()).sum()  # noqa: E731
    held = [*a.parameters(), *b.parameters(), x]
    everything = saved_bytes(step)
    added = saved_bytes(step, held)
    assert added == 3 * 16 * 4            # relu's output, saved by b (relu's own saved result is the same storage)
    assert everything > added + 16 * 4 * 4   # b's weight and x counted there
