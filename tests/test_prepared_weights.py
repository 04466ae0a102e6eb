"""Values computed from parameters alone are prepared once per version (cpu/prepare.py, runtime/prepared.py).

Every test changes a parameter or buffer between calls the way user code does, and checks that
the compiled result follows eager; the counting ones check that the preparation really is
skipped while nothing changed (else the cache would be an untested no-op).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from minicompile.config import patch
from minicompile.runtime.prepared import CachedPreparation
from tests.helpers import Recorder, assert_matches_eager

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def prepared_weights():
    """The preparation is off by default (a write through ``p.data`` moves no version counter)."""
    with patch(prepare_weights=True):
        yield


class ConvBN(nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, groups=4)

    def forward(self, x):
        return self.conv2(F.relu(self.bn(self.conv(x))))


def _model(bias=False):
    torch.manual_seed(0)
    model = ConvBN(bias).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.5, 0.5)
    return model


class Counting:
    """Wraps a graph's preparation: how many times it ran."""

    def __init__(self, prepared: CachedPreparation):
        self.runs, self.inner = 0, prepared.prepare
        prepared.prepare = self

    def __call__(self, *tensors):
        self.runs += 1
        return self.inner(*tensors)


def _compiled(model):
    record = Recorder()
    return torch.compile(model, backend=record), record


def _check(compiled, model, x):
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def _main_targets(graph) -> set:
    return {n.target for n in graph.aten.gm.graph.nodes}


@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_folds_into_the_convolution(bias, fresh_dynamo):
    model, x = _model(bias), torch.randn(2, 3, 10, 9)
    compiled, record = _compiled(model)
    _check(compiled, model, x)
    graph = record.graphs[0]
    prepared = graph.aten.prepared
    assert prepared is not None and aten.rsqrt.default not in _main_targets(graph)   # no BN pass per call
    assert aten.rsqrt.default in {n.target for n in prepared.prepare.graph.nodes}
    convs = [n for n in graph.aten.gm.graph.nodes if n.target is aten.convolution.default]
    assert convs[0].args[2] is not None   # BN's shift became the convolution's bias


def test_prepared_once_while_nothing_changes(fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    compiled, record = _compiled(model)
    _check(compiled, model, x)
    counter = Counting(record.graphs[0].aten.prepared)
    for _ in range(3):
        _check(compiled, model, x)
    assert counter.runs == 0


@pytest.mark.parametrize("change", [
    lambda m: m.conv.weight.add_(0.5),                        # in place, under no_grad
    lambda m: m.bn.running_var.mul_(2.0),                     # BatchNorm statistics in place
    lambda m: m.bn.running_mean.copy_(torch.randn(8)),
    lambda m: m.conv2.weight.mul_(-1),
    lambda m: setattr(m.conv, "weight", nn.Parameter(torch.randn(8, 3, 3, 3))),   # a new tensor
    lambda m: setattr(m.conv.weight, "data", torch.randn(8, 3, 3, 3)),            # new storage
    lambda m: m.load_state_dict({k: v * 1.5 for k, v in m.state_dict().items()}),
], ids=["weight_add_", "running_var_mul_", "running_mean_copy_", "conv2_weight", "new_parameter",
        "data_assigned", "load_state_dict"])
def test_result_follows_a_changed_parameter(change, fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    compiled, record = _compiled(model)
    _check(compiled, model, x)
    counter = Counting(record.graphs[0].aten.prepared)
    with torch.no_grad():
        change(model)
    _check(compiled, model, x)
    _check(compiled, model, x)
    assert counter.runs == 1   # rebuilt once, then cached again


def test_optimizer_step_between_inference_calls(fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    model.train(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compiled, _ = _compiled(model)
    for _ in range(3):
        _check(compiled, model, x)
        loss = model(x).square().mean()    # eager training step between compiled evaluations
        opt.zero_grad()
        loss.backward()
        opt.step()
    _check(compiled, model, x)


def test_inference_mode_writes_are_seen(fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    compiled, _ = _compiled(model)
    _check(compiled, model, x)
    with torch.inference_mode():
        model.conv.weight.mul_(0.5)      # a normal tensor written in inference mode still bumps its version
    _check(compiled, model, x)


def test_a_prepared_value_is_never_returned(fresh_dynamo):
    w = nn.Parameter(torch.randn(4, 4))

    def fn(x):
        scaled = w * 2              # computed from the parameter alone, and returned
        return x @ scaled.t(), scaled.t()

    x = torch.randn(3, 4)
    compiled, _ = _compiled(fn)
    with torch.no_grad():
        out1 = compiled(x)
        out1[1].fill_(0)            # the caller owns what it got
        out2 = compiled(x)
        assert_matches_eager(out2, fn(x))


def test_own_front_end_marks_buffers(fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        compiled = minicompile.compile(model)
        assert_matches_eager(compiled(x), model(x))
        model.bn.running_var.mul_(3.0)
        assert_matches_eager(compiled(x), model(x))


def test_switched_off(fresh_dynamo):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    compiled, record = _compiled(model)
    with patch(prepare_weights=False):
        _check(compiled, model, x)
    graph = record.graphs[0]
    assert graph.aten.prepared is None and aten.rsqrt.default in _main_targets(graph)


def test_inference_tensors_are_prepared_every_call():
    prepared = CachedPreparation(lambda w: (w * 2,), (0,), [((3,), (1,))])
    with torch.inference_mode():
        w = torch.ones(3)
    assert torch.equal(prepared((w,))[0], torch.full((3,), 2.0))
    with torch.inference_mode():
        w.add_(1)           # no version counter to see this: the value must be recomputed
    assert torch.equal(prepared((w,))[0], torch.full((3,), 4.0))


def test_prepared_value_gets_the_kernels_strides():
    prepared = CachedPreparation(lambda w: (w.t(),), (0,), [((3, 2), (2, 1))])
    w = torch.arange(6.0).reshape(2, 3)
    (out,) = prepared((w,))
    assert out.stride() == (2, 1) and torch.equal(out, w.t())


def test_off_by_default_so_writes_through_data_are_followed(fresh_dynamo):
    # config.prepare_weights: p.data.mul_ bumps no version counter; only a per-call preparation sees it
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with patch(prepare_weights=False), torch.no_grad():
        compiled = torch.compile(model, backend="minicompile")
        assert_matches_eager(compiled(x), model(x))
        model.conv.weight.data.mul_(2.0)
        assert_matches_eager(compiled(x), model(x))


def test_freezing_option_turns_it_on_for_one_model(fresh_dynamo, compiles):
    # config.OPTION_ALIASES: Inductor's option name for the same trade
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with patch(prepare_weights=False), torch.no_grad():
        compiled = torch.compile(model, backend="minicompile", options={"freezing": True})
        assert_matches_eager(compiled(x), model(x))
        model.conv.weight.add_(1.0)
        assert_matches_eager(compiled(x), model(x))
    assert len(compiles) == 1 and compiles[0].aten.prepared is not None
