"""Compiled optimizer steps and train steps match eager, with no fallback (MINICOMPILE_FALLBACK=0
in tests), and a compile that fails leaves the user's tensors exactly as they were."""
import pytest
import torch

import minicompile.backend
import minicompile.pipeline
from minicompile.config import patch

OPTIMIZERS = {
    "sgd_momentum": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=fe),
    "sgd_nesterov_wd": lambda ps, fe: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                      weight_decay=1e-2, foreach=fe),
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe),
    "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=fe),
    "rmsprop_centered": lambda ps, fe: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.9, centered=True,
                                                           weight_decay=1e-2, foreach=fe),
    "adagrad": lambda ps, fe: torch.optim.Adagrad(ps, lr=1e-2, foreach=fe),
}
# Adam, RMSprop and Adagrad divide by a square root: a near-zero gradient's float rounding becomes
# an lr-sized step, so their parameters are compared a little more loosely than SGD's after 10 steps.
TOL = {"sgd_momentum": 1e-5, "sgd_nesterov_wd": 1e-5, "adam": 1e-4, "adamw": 1e-4, "rmsprop_centered": 1e-4,
       "adagrad": 1e-4}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(kind, foreach, compile_step, steps=10, whole_step=False):
    model = _model()
    opt = OPTIMIZERS[kind](model.parameters(), foreach)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(4, 8, generator=gen) for _ in range(steps)]

    def train_step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    if whole_step:
        step = torch.compile(train_step, backend="minicompile") if compile_step else train_step
        losses = [step(x).detach() for x in data]
    else:
        opt_step = torch.compile(opt.step, backend="minicompile") if compile_step else opt.step
        losses = []
        for x in data:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt_step()
            losses.append(loss.detach())
    return model, opt, losses


def _compare(kind, ref, got):
    (m_ref, o_ref, l_ref), (m_got, o_got, l_got) = ref, got
    tol = TOL[kind]
    torch.testing.assert_close(torch.stack(l_got), torch.stack(l_ref), atol=tol, rtol=tol)
    for p_ref, p_got in zip(m_ref.parameters(), m_got.parameters()):
        torch.testing.assert_close(p_got, p_ref, atol=tol, rtol=tol)
        for name, value in o_ref.state[p_ref].items():
            # Adam's `step` counts steps: it must be exactly eager's (a replayed update would show)
            torch.testing.assert_close(o_got.state[p_got][name], value, atol=tol, rtol=tol)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_compiled_optimizer_step_matches_eager(kind, foreach, fresh_dynamo):
    _compare(kind, _train(kind, foreach, False), _train(kind, foreach, True))


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_step_is_one_fused_kernel_per_parameter(kind, foreach, fresh_dynamo, monkeypatch):
    """The _foreach_* ops decompose to per-tensor ops and Dynamo's prims.fma (its form of the
    for-loop's addcmul_) is lowered: no extern call is left, and each parameter's whole update
    (read p, grad, state; write p and state) is one kernel, plus one kernel for all the step
    counters (and, in the for-loop form, one for the per-parameter step sizes)."""
    graphs = []

    def spy(gm, example_inputs):
        graphs.append(minicompile.pipeline.compile_graph(gm, example_inputs))
        return graphs[-1]

    monkeypatch.setattr(minicompile.backend, "compile_graph", spy)
    model, _, _ = _train(kind, foreach, True, steps=2)
    n_params = len(list(model.parameters()))
    assert graphs and all(not g.externs for g in graphs), [g.explain() for g in graphs]
    assert max(g.num_kernels for g in graphs) <= n_params + (1 if foreach else 2), [g.explain() for g in graphs]


@pytest.mark.parametrize("kind", ["sgd_momentum", "adamw"])
def test_compiled_train_step_matches_eager(kind, fresh_dynamo):
    # forward + backward + opt.step() in one compiled function: the forward graph is a training
    # graph (compiled forward and backward, tests/test_training.py), the optimizer graph compiles
    _compare(kind, _train(kind, False, False, whole_step=True), _train(kind, False, True, whole_step=True))


def test_failed_compile_leaves_parameters_and_state_untouched(fresh_dynamo, monkeypatch):
    """Make every compile fail after tracing: the eager fallback must then be exactly eager."""
    def fail(*args, **kwargs):
        raise RuntimeError("compile failed on purpose")

    monkeypatch.setattr(minicompile.pipeline, "schedule", fail)
    ref = _train("sgd_momentum", False, False, steps=3)
    with patch(fallback_on_error=True):
        got = _train("sgd_momentum", False, True, steps=3)
    for p_ref, p_got in zip(ref[0].parameters(), got[0].parameters()):
        assert torch.equal(p_ref, p_got)
        assert torch.equal(ref[1].state[p_ref]["momentum_buffer"], got[1].state[p_got]["momentum_buffer"])


def _stateful_graph() -> torch.fx.GraphModule:
    """count.add_(1); x.mul_(2); return x + count -- with `count` a graph attribute, as Dynamo
    passes optimizer state (fx.symbolic_trace would run the add_ on the real buffer itself)."""
    root = torch.nn.Module()
    root.register_buffer("count", torch.zeros(3))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    count = g.get_attr("count")
    g.call_method("add_", (count, 1))
    g.call_method("mul_", (x, 2))
    g.output(g.call_function(torch.add, (x, count)))
    return torch.fx.GraphModule(root, g)


def test_failed_compile_leaves_inputs_and_attributes_untouched(monkeypatch):
    """The trace runs on fake tensors only: the real input and attribute keep their values."""
    gm = _stateful_graph()
    x = torch.ones(3)
    monkeypatch.setattr(minicompile.pipeline, "schedule", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        minicompile.pipeline.compile_graph(gm, [x])
    assert torch.equal(x, torch.ones(3)) and torch.equal(gm.count, torch.zeros(3))


def test_attribute_and_input_mutations_are_written_back_once():
    gm = _stateful_graph()
    compiled = minicompile.pipeline.compile_graph(gm, [torch.ones(3)])
    assert torch.equal(gm.count, torch.zeros(3))          # compiling changed nothing
    for k in range(1, 4):
        x = torch.ones(3)
        out = compiled(x)
        assert torch.equal(x, torch.full((3,), 2.0)) and torch.equal(gm.count, torch.full((3,), float(k)))
        assert torch.equal(out, torch.full((3,), 2.0 + k))


def _compile_fn(fn, *inputs):
    return minicompile.pipeline.compile_graph(torch.fx.symbolic_trace(fn), list(inputs))


def test_write_back_fuses_into_the_kernel_reading_the_same_element():
    def update(p, g):
        old = p * 2
        p.add_(g)
        return old

    p, g = torch.randn(64, 8), torch.randn(64, 8)
    compiled = _compile_fn(update, p.clone(), g)
    assert compiled.num_kernels == 1, compiled.explain()
    got_p = p.clone()
    torch.testing.assert_close(compiled(got_p, g), p * 2, rtol=0, atol=0)
    torch.testing.assert_close(got_p, p + g, rtol=0, atol=0)


def test_write_back_stays_apart_from_a_read_of_another_element():
    """y (contiguous) reads p transposed: in one loop, element (i, j) would be overwritten before
    (j, i) reads it. (``p.t() * 2`` alone is laid out transposed, like eager's, and its loop now runs
    in memory order, reading each element of p in the iteration that writes it: that one fuses.)"""
    def update(p):
        y = (p.t() * 2).contiguous()
        p.mul_(3)
        return y

    p = torch.randn(16, 16)
    compiled = _compile_fn(update, p.clone())
    assert compiled.num_kernels == 2, compiled.explain()
    assert "that" in compiled.explain() and "reads at" in compiled.explain()
    got_p = p.clone()
    torch.testing.assert_close(compiled(got_p), p.t() * 2, rtol=0, atol=0)
    torch.testing.assert_close(got_p, p * 3, rtol=0, atol=0)


def test_scalar_math_on_a_0d_input_runs_once_before_the_loop():
    """Adam's bias corrections (pow of its 0-d step) are computed once per kernel, not per element."""
    def scaled(x, step):
        return x / (1 - torch.pow(0.999, step + 1))   # still a division, as in eager: exact

    x, step = torch.randn(4096), torch.tensor(3.0)
    compiled = _compile_fn(scaled, x, step)
    source = compiled.kernel_source[compiled.kernel_source.index('extern "C"'):]
    assert "std::pow" in source and source.index("std::pow") < source.index("for ("), source
    torch.testing.assert_close(compiled(x, step), scaled(x, step), rtol=0, atol=0)
