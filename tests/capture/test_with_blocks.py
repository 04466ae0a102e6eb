"""Graph breaks inside ``with`` blocks, try blocks and decorators are split (issue 24 item 4):
the graph before the break, the breaking instruction in Python with the context active, then
tracing resumes inside the block and leaves it as Python does, exceptions included. Every case
runs the same function in plain CPython and compiled, several calls: same results, same
enter/exit log, same grad mode after the call, same exception."""
from __future__ import annotations

import contextlib
import copy
import functools
import os

import pytest
import torch

import minicompile
from minicompile.capture import compile as capture_compile

LOG: list = []


def note(*what):
    """A call the tracer does not model (a graph break): it runs in Python."""
    LOG.append(what)
    print(end="")


class Ctx:
    def __init__(self, tag, suppress=False):
        self.tag, self.suppress = tag, suppress

    def __enter__(self):
        LOG.append(("enter", self.tag))
        return self.tag

    def __exit__(self, kind, value, tb):
        LOG.append(("exit", self.tag, kind.__name__ if kind else None))
        return self.suppress


@contextlib.contextmanager
def managed(tag):
    LOG.append(("cm-enter", tag))
    try:
        yield tag
    except ValueError as e:
        LOG.append(("cm-caught", str(e)))
    finally:
        LOG.append(("cm-exit", tag))


def fails(x, fail):
    note("fails", fail)
    if fail:
        raise ValueError("boom")
    return x + 1


def outcome(fn, args):
    """What calling ``fn`` does: (result or exception, log, grad mode after)."""
    LOG.clear()
    before = torch.is_grad_enabled()
    try:
        result = fn(*args)
    except Exception as e:   # compared by type and message
        result = (type(e), str(e))
    finally:
        after = torch.is_grad_enabled()
        torch.set_grad_enabled(before)
    return result, list(LOG), after


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.requires_grad == b.requires_grad and torch.allclose(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check(fn, *calls):
    """``fn`` eagerly and compiled on each argument tuple in ``calls`` (then all again): same outcome."""
    compiled = capture_compile(fn)
    for args in [*calls, *calls]:
        expected, got = outcome(fn, args), outcome(compiled, args)
        assert same(expected, got), (args, expected, got)
    report = compiled.capture_report
    assert not report.fallbacks, report
    return report


def x3(requires_grad=False):
    return torch.arange(3.0).requires_grad_(requires_grad)


# ---------------------------------------------------------------------- user context managers
def f_user_ctx(x, fail):
    y = x * 2
    with Ctx("a") as tag:
        y = y + len(tag)
        y = fails(y, fail)
        y = y * 3
    return y - 1


def test_break_inside_a_user_context_manager():
    report = check(f_user_ctx, (x3(), False), (x3(), True))
    assert report.graphs[0].code_name == "f_user_ctx" and report.graphs[0].ops == 2, report   # x * 2, + len
    compiled = capture_compile(f_user_ctx)
    for _ in range(3):
        outcome(compiled, (x3(), False))
    assert not compiled.capture_report.recompiles   # the resumed block's __exit__ is not guarded by identity


def f_suppressing_ctx(x, fail):
    y = x * 2
    with Ctx("s", suppress=True):
        y = fails(y, fail)
        y = y * 3
    return y + 1


def test_exception_suppressed_by_exit_continues_after_the_block():
    check(f_suppressing_ctx, (x3(), False), (x3(), True))


def f_contextmanager(x, fail):
    y = x + 1
    with managed("m") as tag:
        y = fails(y, fail) * len(tag)
    return y * 2


def test_break_inside_a_contextmanager_block():
    # its generator is entered in Python (the break moves to the with), caught ValueError included
    check(f_contextmanager, (x3(), False), (x3(), True))


# ---------------------------------------------------------------------- grad mode and autocast
def f_no_grad(x, fail):
    y = x * 2
    with torch.no_grad():
        z = fails(y, fail) * 3
    return y + z, torch.is_grad_enabled()


def f_enable_grad(x, fail):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            z = fails(x, fail) * 3
        w = z + 1
    return y, z, w, torch.is_grad_enabled()


def f_set_grad_enabled(x, fail):
    with torch.set_grad_enabled(False):
        z = fails(x, fail) * 3
    return z, torch.is_grad_enabled()


def f_autocast(x, fail):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x.t()
        z = fails(y, fail) @ y
    return y.dtype, z.dtype, z.float(), torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("fn", [f_no_grad, f_enable_grad, f_set_grad_enabled])
def test_break_inside_grad_mode_blocks(fn):
    check(fn, (x3(True), False), (x3(True), True))


def test_grad_mode_restored_when_the_block_raises():
    compiled = capture_compile(f_no_grad)
    with pytest.raises(ValueError, match="boom"):
        compiled(x3(True), True)
    assert torch.is_grad_enabled()


def test_break_inside_autocast():
    m = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    check(f_autocast, (m, False), (m, True))
    assert not torch.is_autocast_enabled("cpu")


# ---------------------------------------------------------------------- try blocks
def f_try_except(x, fail):
    y = x * 2
    try:
        y = fails(y, fail)
    except (KeyError, ValueError) as e:
        y = y - len(str(e))
    else:
        y = y * 10
    return y + 1


def f_try_finally_nested(x, fail):
    y = x * 2
    try:
        with Ctx("outer"):
            try:
                y = fails(y, fail)
            finally:
                LOG.append("inner finally")
            y = y + 1
    except ValueError:
        LOG.append("caught")
        y = y * 0
    finally:
        LOG.append("outer finally")
    return y


def f_reraise(x, fail):
    try:
        return fails(x, fail)
    except ValueError:
        LOG.append("handler")
        raise


def f_key_error(x, d):
    try:
        v = d["k"]
    except KeyError:
        v = 5
    return x + v


@pytest.mark.parametrize("fn", [f_try_except, f_try_finally_nested, f_reraise])
def test_break_inside_try_blocks(fn):
    check(fn, (x3(), False), (x3(), True))


def test_exception_raised_at_a_break_reaches_its_handler():
    report = check(f_key_error, (x3(), {}), (x3(), {"k": 2}))
    assert report.break_count == 1   # d["k"] raised while tracing: a break, its KeyError caught in Python


# ---------------------------------------------------------------------- decorators
def merge_defaults(fn):
    """Like transformers' ``merge_with_config_defaults``: a try/finally around the call."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with Ctx("deco"):
            try:
                return fn(*args, **kwargs)
            finally:
                LOG.append("restored")
    return wrapper


@merge_defaults
def decorated(x, fail):
    y = x * 2
    y = fails(y, fail)
    return y.sin()


def test_break_inside_a_decorator_with_block():
    report = check(lambda x, fail: decorated(x, fail) + 1, (x3(), False), (x3(), True))
    assert report.break_count >= 1


def test_hasattr_of_none_in_a_decorated_forward_is_not_a_break():
    fn = minicompile.compile(lambda x, c=None: x + (2 if hasattr(c, "m") else 3))
    torch.testing.assert_close(fn(x3()), x3() + 3)
    assert fn.capture_report.break_count == 0 and not fn.capture_report.fallbacks


# ---------------------------------------------------------------------- what HF models needed
class Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(k * x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(1.702 * x)
        return grad * (s + 1.702 * x * s * (1 - s)), None


class Config:
    attribute_map = {"layers": "num_layers"}

    def __init__(self):
        self.num_layers, self.names, self.scale = 2, ["a", "b"], 1.5

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


CONFIG = Config()
ACT = functools.partial(torch.nn.functional.gelu, approximate="tanh")


def f_hf_constructs(x, n):
    c = copy.deepcopy(CONFIG)
    c.scale = c.scale * 2
    delattr(c, "names")
    y = Gelu.apply(x, 1.702) + ACT(x) * c.layers * c.scale
    return (y if Sized(n) else -y), hasattr(c, "names"), CONFIG.scale


def test_constructs_hf_models_needed_are_traced():
    report = check(f_hf_constructs, (x3(), 0), (x3(), 2))
    assert report.break_count == 0, report
    compiled = capture_compile(f_hf_constructs)
    compiled(x3(), 1)
    CONFIG.num_layers = 3   # the copy depends on the config's state: guarded
    try:
        torch.testing.assert_close(compiled(x3(), 1)[0], f_hf_constructs(x3(), 1)[0])
    finally:
        CONFIG.num_layers = 2
    assert len(compiled.capture_report.recompiles) == 1


def test_autograd_function_with_inputs_that_require_grad_runs_its_backward():
    compiled = capture_compile(lambda x: Gelu.apply(x, 1.702).sum())
    x = x3(True)
    compiled(x).backward()
    expected = x.detach().clone().requires_grad_()
    Gelu.apply(expected, 1.702).sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


# ---------------------------------------------------------------------- the 16 HF architectures
@pytest.mark.slow   # 16 models traced (about 2 minutes on the 2-core machine)
@pytest.mark.parametrize("name", ["gpt2", "gptj", "opt", "bloom", "gpt_neo", "llama", "mistral", "phi", "gemma",
                                  "mixtral", "t5", "bart", "whisper", "bert", "albert", "deberta_v2"])
def test_hf_architecture_in_one_graph(name):
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import hf_models
    model, kwargs = hf_models.make(name)
    with torch.no_grad():
        expected = hf_models.tensors(model(**kwargs))
        compiled = capture_compile(model)
        for _ in range(2):
            got = hf_models.tensors(compiled(**kwargs))
            assert len(got) == len(expected)
            for a, b in zip(expected, got):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    report = compiled.capture_report
    assert len(report.graphs) == 1 and report.break_count == 0 and not report.fallbacks, report
