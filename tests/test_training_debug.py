"""MINICOMPILE_DEBUG=3 on a training step: the joint graph (stamped), the partition, and both
halves titled by what they are, with the user's source lines and the partition's names
(docs/training.md, "A training step at MINICOMPILE_DEBUG=3")."""
from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.config import patch
from tests.helpers import Recorder

SOURCE_LINE = "h = F.layer_norm(self.fc1(x), (32,))"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = F.layer_norm(self.fc1(x), (32,))
        return self.fc2(F.gelu(h)).tanh()


def _blocks(out: str) -> dict:
    """Banner title -> the text under it (the last block of each title)."""
    parts = re.split(r"^=== \[minicompile\] (.*?) =+$", out, flags=re.M)
    return {parts[k]: parts[k + 1] for k in range(1, len(parts) - 1, 2)}


def _train_step_at_debug_3(capsys):
    torch.manual_seed(0)
    model, x = Model(), torch.randn(8, 16)
    rec = Recorder()
    with patch(debug=3):
        torch.compile(model, backend=rec)(x).square().mean().backward()
    return capsys.readouterr().out, rec.graphs[0]


def test_debug_3_prints_the_joint_graph_the_partition_and_both_halves(capsys, fresh_dynamo):
    out, graph = _train_step_at_debug_3(capsys)
    blocks = _blocks(out)
    joint = blocks["joint graph (forward and backward, ATen)"]
    assert joint.lstrip().startswith("# Constructed by trace_joint: custom_ops "), joint[:200]
    assert "compress_pool_indices" in joint and "class JointGraph(" in joint
    assert f"partition ({graph.report.mode})" in blocks
    assert "forward half of the joint graph" in blocks and "backward half of the joint graph" in blocks
    assert "captured FX graph" not in out
    # each half's ATen graph says where it came from: the joint trace, the partition, compile_aten
    assert "#   then partition, backward half: " in out and "#   then compile_aten: lift " in out
    # carried as values (Partition.about, AtenProgram.constructed_by), not in the halves' meta
    part = graph.partition
    assert not {"constructed_by", "title"} & {*part.forward.meta, *part.backward.meta}
    assert graph.backward.aten.constructed_by[:-1] == part.about("backward")["constructed_by"]


def test_the_backward_half_keeps_source_lines_and_saved_names(capsys, fresh_dynamo):
    out, graph = _train_step_at_debug_3(capsys)
    backward = _blocks(out)["backward half of the joint graph"]
    assert SOURCE_LINE in backward and "No stacktrace found" not in backward
    saved = [s.name for s in graph.report.saved if not s.name.startswith("primals_")]
    assert saved, str(graph.report)
    signature = backward.split("def forward(self, ", 1)[1].split(")", 1)[0]
    for name in saved:   # the partition's names, not the retrace's arg<k>_1
        assert f"{name}: " in signature, (name, signature)
    # the compiled backward's ATen graph and kernels keep them too
    aten = graph.backward.aten.gm.print_readable(print_output=False)
    assert all(f"{name}: " in aten.split("def forward(self, ", 1)[1].split(")", 1)[0] for name in saved)
    assert "test_training_debug.py:" in graph.backward.kernel_source   # the kernels' source-line headers


def _code(text: str) -> list:
    """Generated source without comments (they name FX nodes and source lines, which differ)."""
    return [re.sub(r"\s*(//|#).*$", "", line) for line in text.splitlines() if not line.strip().startswith(("//", "#"))]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return F.gelu(self.fc(h.mean((2, 3))))   # GELU after a linear: the epilogues pass (inference only)


def test_compile_aten_builds_the_kernels_tracing_the_halves_again_built(fresh_dynamo):
    """compile_aten runs the passes after tracing (AFTER_TRACE_PASSES) on a half of the joint graph;
    compile_graph traces the half again first. Both must generate the same code."""
    from minicompile.aot.joint import trace_joint
    from minicompile.cpu import CPU
    from minicompile.aot.partition import partition
    from minicompile.pipeline import compile_aten, compile_graph

    for model, x in ((Model(), torch.randn(8, 16)), (ConvNet().train(), torch.randn(2, 3, 8, 8))):
        rec = []
        torch.compile(model, backend=lambda gm, inputs: rec.append((gm, list(inputs))) or gm.forward)(x)
        gm, inputs = rec[0]
        part = partition(trace_joint(gm, inputs, CPU))
        with patch(conv_channels_last=False, prepare_weights=False):
            for half in (part.forward, part.backward):
                fakes = [n.meta["val"] for n in half.graph.nodes if n.op == "placeholder"]
                direct, traced = compile_aten(half, fakes), compile_graph(half, fakes)
                assert _code(direct.kernel_source) == _code(traced.kernel_source)
                assert _code(direct.wrapper_source) == _code(traced.wrapper_source)
