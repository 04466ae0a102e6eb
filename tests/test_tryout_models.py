"""The real-model tryout's verdicts (minicompile/testing/tryout_models.py; the run itself takes
most of an hour and is in docs/testing.md): a gradient off eager's by more than float32 noise
is wrong, one eager is as far from float64 is not, a logged eager graph is a fallback, and a
small channels-last CNN through the whole worker is ok."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from minicompile.testing import tryout_models as tryout


def _grads(*tensors):
    return [[t] for t in tensors]   # one step, one parameter


def test_a_gradient_far_from_float64_is_wrong():
    torch.manual_seed(0)
    f64 = torch.randn(1000, dtype=torch.float64)
    eager = f64.float() + 1e-7 * torch.randn(1000)
    ours = f64.float() * 1.02           # 2% off, as the BatchNorm bias gradient of issue 23
    r = tryout.Result("m")
    assert "grad of w" in tryout.judge_grads(_grads(ours), _grads(eager), _grads(f64), ["w"], r)
    assert r.grad_l2 > 1e-2


def test_a_gradient_as_noisy_as_eager_passes():
    torch.manual_seed(0)
    f64 = torch.randn(1000, dtype=torch.float64) * 1e-3
    eager = f64.float() + 2e-5 * torch.randn(1000)     # an ill-conditioned gradient: eager is noisy too
    ours = f64.float() + 2e-5 * torch.randn(1000)
    r = tryout.Result("m")
    assert tryout.judge_grads(_grads(ours), _grads(eager), _grads(f64), ["w"], r) == ""
    assert r.grad_l2 > tryout.GRAD_RTOL          # passed on float64's word, not on eager's


def test_losses_judged_against_float64():
    f64 = [torch.tensor(2.3, dtype=torch.float64)] * 2
    eager = [torch.tensor(2.3000001), torch.tensor(2.3004)]   # step 2: AdamW's sign-sized update of noise
    assert tryout.judge_losses([torch.tensor(2.3000001), torch.tensor(2.2996)], eager, f64) == []
    wrong = tryout.judge_losses([torch.tensor(2.3023), torch.tensor(2.3004)], eager, f64)
    assert len(wrong) == 1 and wrong[0].startswith("step 1 loss")


def test_a_logged_eager_graph_is_a_fallback(monkeypatch):
    def build():
        return nn.Sequential(nn.Linear(4, tryout.CLASSES)), (torch.randn(tryout.BATCH, 4),)

    def compile_and_complain(model, backend):
        logging.getLogger("minicompile").warning("minicompile: training graph runs eagerly: a test")
        return model
    monkeypatch.setitem(tryout.MODELS, "linear", build)
    monkeypatch.setattr(torch, "compile", compile_and_complain)
    r = tryout.run_one("linear")
    assert r.status == "fallback" and "a test" in r.fallbacks[0]


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, tryout.CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


@pytest.mark.slow   # three graphs compiled cold (inference, forward, backward): 10-25 s on 2 cores
def test_a_small_cnn_is_ok(monkeypatch):
    monkeypatch.setitem(tryout.MODELS, "convbn", lambda: (ConvBN(), (torch.randn(tryout.BATCH, 3, 8, 8),)))
    r = tryout.run_one("convbn")
    assert r.status == "ok", r.detail
    assert r.infer_err < tryout.OUT_RTOL and r.grad_l2 is not None and not r.fallbacks
