"""Epilogues fused into oneDNN's products (cpu/epilogues.py): each activation, with and without
bias, residual add, linear and convolution, compared with eager; the fused call is in the ATen
graph when pinned fused and absent when pinned separate; training graphs never get it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.config import patch
from minicompile.cpu.timing import cpu_flags
from tests.helpers import Recorder, assert_matches_eager, check

pytestmark = pytest.mark.skipif(not (torch.backends.mkldnn.is_available()
                                     and hasattr(torch.ops.mkldnn, "_convolution_pointwise")),
                                reason="this torch build has no oneDNN post-ops")

LINEAR = torch.ops.mkldnn._linear_pointwise
CONV = torch.ops.mkldnn._convolution_pointwise
ACTIVATIONS = {
    "relu": (F.relu, "relu"),
    "gelu": (F.gelu, "gelu"),
    "gelu_tanh": (lambda y: F.gelu(y, approximate="tanh"), "gelu"),
    "silu": (F.silu, "swish"),
    "hardtanh": (lambda y: F.hardtanh(y, -0.5, 0.75), "hardtanh"),
    "relu6": (F.relu6, "hardtanh"),
    # Hugging Face's NewGELUActivation (GPT-2's "gelu_new"), written out in Python
    "gelu_new": (lambda y: 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0)))),
                 "gelu"),
}
# oneDNN's post-ops compute the activation in its own vectorised code: float rounding apart
TOL = dict(atol=1e-5, rtol=1e-4)


def fused_nodes(compiled, op) -> list:
    return [n for n in compiled.aten.gm.graph.nodes if n.op == "call_function" and n.target is op]


class Linear(nn.Module):
    def __init__(self, act, bias, residual=False):
        super().__init__()
        self.fc, self.act, self.residual = nn.Linear(32, 48, bias=bias), act, residual

    def forward(self, x, r):
        y = self.fc(x)
        return y + r if self.residual else self.act(y)


class Conv(nn.Module):
    def __init__(self, act, bias, residual=False, groups=1):
        super().__init__()
        self.conv, self.act, self.residual = nn.Conv2d(8, 16, 3, padding=1, bias=bias, groups=groups), act, residual

    def forward(self, x, r):
        y = self.conv(x)
        return self.act(y + r) if self.residual else self.act(y)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [(6,), (2, 5), (2, 3, 2)], ids=["2d", "3d", "4d"])   # 4d: matmul, then the bias
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_linear_activation_is_a_post_op(name, rows, bias):
    torch.manual_seed(0)
    act, attr = ACTIVATIONS[name]
    model, x, r = Linear(act, bias).eval(), torch.randn(*rows, 32), torch.randn(*rows, 48)
    for gemm in ("onednn", "auto"):     # a oneDNN product; mm (MKL) where that measured faster alone
        with torch.no_grad(), patch(cpu_gemm=gemm, cpu_epilogue="fused"):
            c = check(model, x, r, **TOL)
        fused = fused_nodes(c, LINEAR.default)
        assert len(fused) == 1 and fused[0].args[3] == attr, c.aten.gm.graph
        assert (fused[0].args[2] is not None) == bias
        assert "as its post-op: pinned by MINICOMPILE_CPU_EPILOGUE=fused" in c.wrapper_source
    with torch.no_grad(), patch(cpu_gemm="onednn", cpu_epilogue="separate"):
        c = check(model, x, r, **TOL)
    assert all(n.args[3] == "none" for n in fused_nodes(c, LINEAR.default))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [(6,), (2, 5), (2, 3, 2)], ids=["2d", "3d", "4d"])
def test_linear_residual_add_is_a_post_op(rows, bias):
    torch.manual_seed(0)
    model, x, r = Linear(None, bias, residual=True).eval(), torch.randn(*rows, 32), torch.randn(*rows, 48)
    with torch.no_grad(), patch(cpu_gemm="onednn", cpu_epilogue="fused"):
        c = check(model, x, r, **TOL)
    assert len(fused_nodes(c, LINEAR.binary)) == 1, c.aten.gm.graph
    with torch.no_grad(), patch(cpu_gemm="onednn", cpu_epilogue="separate"):
        c = check(model, x, r, **TOL)
    assert not fused_nodes(c, LINEAR.binary)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_conv_activation_is_a_post_op(name, bias, layout):
    torch.manual_seed(0)
    act, attr = ACTIVATIONS[name]
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x, r = torch.randn(2, 8, 9, 7).contiguous(memory_format=fmt), torch.randn(2, 16, 9, 7)
    model = Conv(act, bias).eval().to(memory_format=fmt)
    with torch.no_grad(), patch(cpu_epilogue="fused"):
        c = check(model, x, r, **TOL)             # eager's values and strides
    fused = fused_nodes(c, CONV.default)
    assert len(fused) == 1 and fused[0].args[7] == attr, c.aten.gm.graph
    with torch.no_grad(), patch(cpu_epilogue="separate"):
        c = check(model, x, r, **TOL)
    assert not fused_nodes(c, CONV.default)


@pytest.mark.parametrize("then", ["none", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_residual_add_then_relu_is_a_post_op(bias, then):
    torch.manual_seed(0)
    act = {"none": lambda y: y, "relu": F.relu, "silu": F.silu}[then]
    model, x, r = Conv(act, bias, residual=True).eval(), torch.randn(2, 8, 9, 7), torch.randn(2, 16, 9, 7)
    with torch.no_grad(), patch(cpu_epilogue="fused"):
        c = check(model, x, r, **TOL)
    fused = fused_nodes(c, CONV.binary)
    assert len(fused) == 1, c.aten.gm.graph
    # oneDNN applies only ReLU after its add here; SiLU stays our kernel after the fused add
    assert fused[0].args[10] == ("relu" if then == "relu" else None)
    with torch.no_grad(), patch(cpu_epilogue="separate"):
        c = check(model, x, r, **TOL)
    assert not fused_nodes(c, CONV.binary)


def test_depthwise_conv_takes_its_activation_too():
    torch.manual_seed(0)
    model = Conv(F.gelu, True, groups=8).eval()
    x, r = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last), torch.randn(2, 16, 9, 7)
    with torch.no_grad(), patch(cpu_epilogue="fused"):
        c = check(model, x, r, **TOL)
    assert len(fused_nodes(c, CONV.default)) == 1 and fused_nodes(c, CONV.default)[0].args[6] == 8


def test_pointwise_conv_as_linear_takes_its_activation_through_the_permute():
    # cpu/conv_layout.py runs an NHWC 1x1 convolution as a linear over pixels, viewed back as NCHW
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.SiLU()).eval()
    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), patch(cpu_gemm="onednn", cpu_epilogue="fused"):
        c = check(model, x, **TOL)
    fused = fused_nodes(c, LINEAR.default)
    assert len(fused) == 1 and fused[0].args[3] == "swish", c.aten.gm.graph


def test_product_read_elsewhere_is_not_fused():
    class Reused(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.conv = nn.Linear(16, 16), nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x, img):
            y, z = self.fc(x), self.conv(img)
            return F.gelu(y) + y, F.relu(z) * z

    torch.manual_seed(0)
    with torch.no_grad(), patch(cpu_gemm="onednn", cpu_epilogue="fused"):
        c = check(Reused().eval(), torch.randn(4, 16), torch.randn(1, 4, 6, 6), **TOL)
    assert not fused_nodes(c, CONV.default) and not fused_nodes(c, CONV.binary)
    assert all(n.args[3] == "none" for n in fused_nodes(c, LINEAR.default))


def test_bfloat16_is_left_to_the_library_here():
    # oneDNN's bfloat16 post-ops need AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; the pass takes float32 only
    torch.manual_seed(0)
    model = Conv(F.relu, True).eval().to(torch.bfloat16)
    x, r = torch.randn(2, 8, 9, 7, dtype=torch.bfloat16), torch.randn(2, 16, 9, 7, dtype=torch.bfloat16)
    with torch.no_grad(), patch(cpu_epilogue="fused"):
        c = check(model, x, r, atol=2e-2, rtol=2e-2)
    assert not fused_nodes(c, CONV.default)
    if not {"avx512bw", "avx512vl", "avx512dq"} <= cpu_flags():
        with pytest.raises(RuntimeError):
            CONV.default(x, model.conv.weight, model.conv.bias, [1, 1], [1, 1], [1, 1], 1, "relu", [], "")


def test_measured_choice_is_in_the_header():
    torch.manual_seed(0)
    model, x, r = Conv(F.relu, True).eval(), torch.randn(2, 8, 9, 7), torch.randn(2, 16, 9, 7)
    with torch.no_grad(), patch(cpu_epilogue="auto"):
        c = check(model, x, r, **TOL)
    lines = [line for line in c.aten.choices if "epilogue conv" in line]
    assert len(lines) == 1 and "+ relu -> " in lines[0] and "separate " in lines[0] and "fused " in lines[0], lines
    fused = bool(fused_nodes(c, CONV.default))
    assert lines[0].split(" -> ")[1].startswith("fused" if fused else "separate")


def test_training_graphs_are_unaffected():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 16),
                          nn.GELU()).train()
    x = torch.randn(2, 3, 6, 6)
    ref = model(x)
    ref.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rec = Recorder()
    torch._dynamo.reset()
    with patch(cpu_epilogue="fused", cpu_gemm="onednn"):
        out = torch.compile(model, backend=rec)(x)
        out.sum().backward()
    assert_matches_eager(out, ref, **TOL)
    for p, g in zip(model.parameters(), grads):
        assert_matches_eager(p.grad, g, **TOL)
    assert len(rec.training) == 1
    for half in (rec.training[0].forward, rec.training[0].backward):
        targets = {n.target for n in half.aten.gm.graph.nodes}
        assert not targets & {CONV.default, CONV.binary, LINEAR.binary}, targets
        assert all(n.args[3] == "none" for n in half.aten.gm.graph.nodes if n.target is LINEAR.default)
