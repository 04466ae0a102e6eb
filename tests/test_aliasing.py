"""Outputs alias what eager's alias: a mutated input returned, an out= argument, views of inputs;
mutating custom ops compile as extern calls (no fallback: MINICOMPILE_FALLBACK=0 in tests)."""
import pytest
import torch

from minicompile.pipeline import compile_graph


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(fn):
    return torch.compile(fn, backend="minicompile")


def test_returned_mutated_input_is_the_input():
    def f(x):
        x.mul_(2)
        return x
    x = torch.ones(3)
    out = _compiled(f)(x)
    assert out.data_ptr() == x.data_ptr()
    out.add_(100)                                   # the caller's x sees it, as in eager
    assert torch.equal(x, torch.full((3,), 102.0))


def test_out_argument_is_returned():
    def f(x, y, out):
        torch.mul(x, y, out=out)
        return out
    x, y, out = torch.randn(4), torch.randn(4), torch.empty(4)
    got = _compiled(f)(x, y, out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out, x * y)


def test_view_of_mutated_input_shares_its_storage():
    def f(x):
        y = x.view(-1)
        y.add_(1)
        return y
    x = torch.zeros(2, 3)
    out = compile_graph(torch.fx.symbolic_trace(f), [x])(x)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert out.shape == (6,) and torch.equal(x, torch.ones(2, 3))


def test_views_of_inputs_share_storage():
    def f(x):
        return x.t(), x[1:], x.view(-1), x + 1
    x = torch.randn(3, 4)
    outs = _compiled(f)(x)
    ref = f(x)
    for o, r in zip(outs[:3], ref[:3]):
        assert o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert (o.shape, o.stride(), o.storage_offset()) == (r.shape, r.stride(), r.storage_offset())
    assert outs[3].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@torch.library.custom_op("minicompile_test::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@scale_.register_fake
def _(x, s):
    return None


@torch.library.custom_op("minicompile_test::shift_and_sum", mutates_args=("x",))
def shift_and_sum(x: torch.Tensor, k: float) -> torch.Tensor:
    x.add_(k)
    return x.sum(0)


@shift_and_sum.register_fake
def _(x, k):
    return x.new_empty(x.shape[1:])


def test_mutating_custom_ops_compile_as_externs():
    def f(x, y):
        z = x.sin()
        scale_(z, 3.0)          # an intermediate: later readers see the scaled value
        scale_(y, 2.0)          # a graph input: written back to the caller's tensor
        s = shift_and_sum(z, 1.0)
        return z.cos(), s, y
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    y_ref, y_got = y.clone(), y.clone()
    ref = f(x, y_ref)
    got = _compiled(f)(x, y_got)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
    assert torch.equal(y_got, y_ref) and got[2].data_ptr() == y_got.data_ptr()


def test_mutating_custom_op_is_an_extern_with_a_reason():
    def f(x):
        z = x.exp()
        scale_(z, 0.5)
        return z + 1
    x = torch.randn(8)
    c = compile_graph(torch.fx.symbolic_trace(f), [x])
    torch.testing.assert_close(c(x), f(x))
    assert any("scale_" in e.op for e in c.externs)


def test_a_compiled_mutation_bumps_the_version_counter_as_eager_does():
    """Autograd must still see that a tensor it saved was changed in place."""
    compiled = compile_graph(torch.fx.symbolic_trace(lambda p: p.mul_(2)), [torch.ones(3)])
    w, p = torch.ones(3, requires_grad=True), torch.ones(3)
    loss = (w * p).sum()            # saves p for backward
    version = p._version
    compiled(p)
    assert p._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("front", ["dynamo", "minicompile"])
def test_training_outputs_that_alias_each_other_or_an_input_compile(front, caplog):
    # aot/joint.py refused (ran eagerly) a training graph with an output that is a view of another
    # output or an input itself: Gemma2's cache returns its keys and their last window. The
    # runtime now rebuilds such outputs as views of the compiled base (aot/joint._views)
    import minicompile

    def f(x, w, i):
        y = torch.cat([x, x @ w], 1)
        return y[:, -3:], y.sin(), y, i.to("cpu"), y[1:, 2:4]
    x, w, i = torch.randn(4, 5), torch.randn(5, 5, requires_grad=True), torch.tensor(3)
    compiled = minicompile.compile(f) if front == "minicompile" else _compiled(f)
    expected, got = f(x, w, i), compiled(x, w, i)
    assert "runs eagerly" not in caplog.text
    assert got[3] is i and got[0].untyped_storage().data_ptr() == got[2].untyped_storage().data_ptr()
    for e, g in zip(expected, got):
        assert e.stride() == g.stride()
        torch.testing.assert_close(e, g)
    g = torch.randn(4, 3)
    grad = [torch.autograd.grad((out[0] * g).sum() + out[1].sum() + out[4].sum(), w)[0] for out in (expected, got)]
    torch.testing.assert_close(*grad)
    got[2][0, -1] = 7.0   # a write through one output shows in its view, as in eager
    assert got[0][0, -1] == 7.0
