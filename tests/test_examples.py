"""The example scripts run and match eager (each checks itself and exits non-zero on a mismatch)."""
import os
import subprocess
import sys

import pytest

from tests.helpers import subprocess_env

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


@pytest.mark.parametrize("script", ["mlp.py", "layernorm_softmax.py", "transformer_block.py"])
def test_example_matches_eager(script):
    proc = subprocess.run([sys.executable, script], cwd=EXAMPLES, capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "check vs eager: OK" in proc.stdout
    assert "extern" in proc.stdout or "kernel" in proc.stdout


@pytest.mark.parametrize("script", ["mlp.py", "layernorm_softmax.py", "transformer_block.py"])
def test_example_is_an_inspect_target(script):
    """The README's first CLI example, `minicompile inspect examples/mlp.py`, needs `model` and
    `example_inputs` at module level (not only under __main__)."""
    from minicompile.tools.target import load_target
    target = load_target(os.path.join(EXAMPLES, script))
    assert callable(target.model) and isinstance(target.example_inputs, tuple)


def test_finetune_example_compiles_every_graph_and_follows_eagers_loss_curve():
    """examples/finetune_gpt2.py (autocast bf16, checkpointed blocks, a new length each step), 6 of its
    20 steps: the static first compile and the symbolic one; MINICOMPILE_FALLBACK=0 inside it, so a
    graph that ran eagerly would fail the script."""
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, "finetune_gpt2.py", "--steps", "6"], cwd=EXAMPLES, capture_output=True,
                          text=True, timeout=900, env=subprocess_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "check vs eager: OK" in proc.stdout
    assert "graphs compiled: 2, graph breaks: 0" in proc.stdout
