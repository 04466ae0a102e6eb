"""Layouts are a contract (docs/architecture.md): what observes a buffer's layout sees eager's.

An op that reads storage (``as_strided``, ``as_strided_scatter``) or draws random numbers in
memory order (dropout) sees eager's layout for its input, though the channels-last passes would
change it (aot/layout_readers.py); every output has eager's strides; a backward that fails to
compile never runs on the compiled forward's own layouts (aot/runtime.py)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.helpers import assert_matches_eager

TOL = dict(rtol=1e-4, atol=1e-4)


class PaddedWindows(nn.Module):
    """Overlapping windows of a padded convolution output by two ``as_strided`` views, with
    strides that only eager's NCHW layout gives these values."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 24, 1, bias=False)

    def forward(self, x):
        y = F.pad(self.conv(x), [2, 2, 2, 2])                    # [2, 24, 20, 20], NCHW in eager
        a = torch.as_strided(y, (2, 24, 2, 20, 12), (24 * 400, 400, 160, 1, 20))
        return torch.as_strided(a, (2, 24, 2, 2, 12, 12), (24 * 400, 400, 160, 8, 20, 1)).clone()


class ScatterIntoConv(nn.Module):
    """``as_strided_scatter`` into a convolution's result: it writes elements by storage offset."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 24, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.as_strided_scatter(y, torch.ones(5), (5,), (3,), 7) * 2


class StridedConvMethod(nn.Module):
    """The method form, ``y.as_strided``, on a residual sum after a convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        y = self.conv(x) + x
        return y.as_strided((2, 16, 8, 8), (16 * 256, 256, 32, 2)).sigmoid()


MODELS = [PaddedWindows, ScatterIntoConv, StridedConvMethod]


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
def test_storage_reads_after_a_convolution_see_eager_layout_inference(model_cls, fresh_dynamo):
    torch.manual_seed(0)
    model, x = model_cls(), torch.randn(2, 16, 16, 16)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="minicompile")(x)
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
def test_storage_reads_after_a_convolution_see_eager_layout_training(model_cls, fresh_dynamo):
    torch.manual_seed(0)
    model, x = model_cls(), torch.randn(2, 16, 16, 16)

    def step(fn):
        xg = x.clone().requires_grad_(True)
        out = fn(xg)
        (out * torch.linspace(0, 1, out.numel()).view(out.shape)).sum().backward()
        grads = [xg.grad] + [p.grad for p in model.parameters()]
        model.zero_grad()
        return out, grads

    ref, ref_grads = step(model)
    out, grads = step(torch.compile(model, backend="minicompile"))
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()
    for g, r in zip(grads, ref_grads):
        assert_matches_eager(g, r, **TOL)
        assert g.stride() == r.stride()


class InputWindows(nn.Module):
    """as_strided of the graph's input, before the convolution: eager's layout, whatever the pass does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return self.conv(torch.as_strided(x, (2, 16, 8, 8), (16 * 256, 256, 32, 2)))


class PooledDropout(nn.Module):
    """Dropout of a pooled vector: its layout is the same whether the convolution ran NCHW or NHWC."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return F.dropout(self.conv(x).mean((2, 3)), 0.5, True)


class KeptDimsDropout(nn.Module):
    """Dropout of a [N, C, 1, 1] pooled map: channels-last and NCHW differ only in the strides of
    its size-1 dimensions, which place no element elsewhere."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return F.dropout(F.adaptive_avg_pool2d(self.conv(x), 1), 0.5, True)


@pytest.mark.parametrize("model_cls,traced", [(PaddedWindows, 2), (StridedConvMethod, 2), (InputWindows, 1),
                                              (PooledDropout, 1), (KeptDimsDropout, 1)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_channels_last_stays_where_no_reader_sees_a_changed_layout(model_cls, traced, monkeypatch, fresh_dynamo):
    """The training trace runs under the channels-last mode once when it may, and again without it
    when an op would read a layout the mode changed."""
    import minicompile.aot.joint as joint
    traces, trace = [], joint._trace
    monkeypatch.setattr(joint, "_trace", lambda fn, ctx: traces.append(fn) or trace(fn, ctx))
    torch.manual_seed(0)
    model, x = model_cls(), torch.randn(2, 16, 16, 16)
    ref = _same_seed(model, x)
    out = _same_seed(torch.compile(model, backend="minicompile"), x)
    out.sum().backward()
    assert len(traces) == traced
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()


class ConvTokens(nn.Module):
    """conv (channels-last in training) -> tokens by permute + reshape -> linear, as CoaT's
    stages: backward views the saved convolution output through the permute, which only its
    traced layout allows."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.lin = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Linear(16, 8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        tokens = y.permute(0, 2, 3, 1).reshape(x.shape[0], -1, 16)
        return (self.lin(tokens) * tokens[..., :8]).mean(1)


def _train_steps(model, x, steps: int = 2) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in model.parameters()]


def _other_layouts(gm, inputs) -> bool:
    traced = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return any(isinstance(x, torch.Tensor) and x.stride() != t.stride() for x, t in zip(inputs, traced))


@pytest.mark.parametrize("saved_layout,backward_fails,compiles,fallback", [
    ("as compiled", "always", 2, True),            # forward, backward (fails): eager backward
    ("another layout", "always", 3, True),         # forward, backward, backward for the traced layouts
    ("another layout", "for other layouts", 3, True),   # ... which compiles: CoaT's view of a saved value
    # compiling for the traced layouts is a layout choice, not a fallback: MINICOMPILE_FALLBACK=0 takes it
    ("another layout", "for other layouts", 3, False),
])
def test_failed_backward_compile_never_runs_on_our_layouts(saved_layout, backward_fails, compiles, fallback,
                                                           monkeypatch, fresh_dynamo):
    """The backward's compile fails (forced), and the training steps still match eager's. The
    compiled forward may hand backward saved values in a layout of its own (simulated: every 4-d
    output made NCHW-contiguous), which the graph's views (permute, then view) do not allow: the
    backward is then compiled, or run eagerly, for the traced layouts."""
    import minicompile.backend as backend_module
    from minicompile.config import patch

    compile_aten, calls = backend_module.compile_aten, []

    def forward_then_failing_backward(gm, example_inputs, **about):
        calls.append(gm)
        if len(calls) > 1 and (backward_fails == "always" or _other_layouts(gm, example_inputs)):
            raise RuntimeError("backward compile forced to fail")
        compiled = compile_aten(gm, example_inputs, **about)
        if saved_layout == "as compiled" or len(calls) > 1:
            return compiled
        return lambda *args: [o.contiguous() if isinstance(o, torch.Tensor) and o.dim() == 4 else o
                              for o in compiled(*args)]

    monkeypatch.setattr(backend_module, "compile_aten", forward_then_failing_backward)
    torch.manual_seed(0)
    model, x = ConvTokens(), torch.randn(2, 3, 8, 8)
    eager = copy.deepcopy(model)
    with patch(fallback_on_error=fallback):
        got = _train_steps(torch.compile(model, backend="minicompile"), x)
    want = _train_steps(eager, x)
    assert len(calls) == compiles
    for g, w in zip(got, want):
        assert_matches_eager(g, w, **TOL)


class ConvDropout(nn.Module):
    """Dropout of a convolution's output: NCHW in eager, channels-last in the training trace."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return F.dropout(self.conv(x), 0.5, True)


# Dropout's input as each function makes it: dense but not contiguous (eager draws it in memory
# order), not dense (contiguous draws), contiguous.
DROPOUTS = {
    "transposed": lambda x: F.dropout(x.t() * 2, 0.5, True),
    "permuted": lambda x: F.dropout(x.view(2, 3, 4).permute(2, 0, 1) + 1, 0.3, True),
    "module": lambda x: nn.Dropout(0.25)(x.view(3, 2, 4).transpose(0, 2) * 3),
    "strided": lambda x: F.dropout(x[:, ::2], 0.5, True),
    "empty_like": lambda x: torch.empty_like(x.t() * 2).bernoulli_(0.5) * x.t(),
    "rand_like": lambda x: torch.rand_like(x.t() * 2) + x.t(),
    "uniform_": lambda x: torch.empty_like(x.t() * 2).uniform_() * x.t(),
    "bernoulli_tensor": lambda x: torch.empty_like(x.t() * 2).bernoulli_(torch.sigmoid(x.t())) * x.t(),
    "alpha_dropout": lambda x: F.alpha_dropout(x.t() * 2, 0.5, True),
    "contiguous": lambda x: F.dropout(x * 2, 0.5, True),
}


def _same_seed(fn, *args):
    torch.manual_seed(7)
    return fn(*args)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", list(DROPOUTS))
def test_random_draws_equal_eager_for_non_contiguous_inputs(name, training, fresh_dynamo):
    fn = DROPOUTS[name]
    x = torch.randn(6, 4, requires_grad=training)
    ref, out = _same_seed(fn, x), _same_seed(torch.compile(fn, backend="minicompile"), x)
    assert torch.equal(out != 0, ref != 0) and torch.equal(out, ref)
    assert out.stride() == ref.stride()
    if training:
        (ref_grad,) = torch.autograd.grad(ref.sum(), x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.equal(grad, ref_grad)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_dropout_of_a_convolution_draws_eager_mask(training, fresh_dynamo):
    torch.manual_seed(0)
    model, x = ConvDropout(), torch.randn(2, 3, 8, 8)
    with torch.set_grad_enabled(training):
        ref, out = _same_seed(model, x), _same_seed(torch.compile(model, backend="minicompile"), x)
    assert torch.equal(out != 0, ref != 0)
    assert_matches_eager(out, ref, **TOL)
    assert out.stride() == ref.stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op", [torch.minimum, torch.add, torch.mul], ids=lambda f: f.__name__)
def test_symbolic_sizes_keep_eager_elementwise_strides(op, dtype, compiles, fresh_dynamo):
    """An expanded and a transposed input: TensorIterator orders the output by the transposed
    one's strides, which fake tensors of narrow dtypes miss (aot/strides.py); with symbolic sizes
    too (the dynamic fuzzer's seed 734093: (3, 18, 1) where eager has (1, 6, 6))."""
    fn = torch.compile(lambda a, b: op(a, b), backend="minicompile", dynamic=True)
    for n, m in [(6, 3), (7, 5)]:
        a = torch.randn(n, 1, 1).to(dtype).expand(n, 1, m)
        b = torch.randn(m, 1, n).to(dtype).permute(2, 1, 0)
        ref, out = op(a, b), fn(a, b)
        assert out.stride() == ref.stride(), (n, m)
        assert_matches_eager(out, ref)
    assert len(compiles) == 1  # one symbolic build serves both sizes: the order holds for every size
