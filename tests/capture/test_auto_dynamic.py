"""Automatic dynamic sizes in our front end (capture/dynamic.py): ``minicompile.compile`` over
changing sizes compiles a static graph first, then one symbolic graph for the sizes that changed;
where a size must specialise, it compiles per size. Every result is compared with eager, and
pipeline compiles are counted (conftest ``compiles``)."""
import os

import pytest
import torch
from torch import nn

import minicompile
from minicompile.capture import compile as capture_compile

F = nn.functional


def _run_sizes(fn, compiled, sizes, make):
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            torch.testing.assert_close(compiled(*args), fn(*args), msg=f"size {n}")


def _records(compiled, what):
    return [r for r in compiled.capture_report.dynamic if r.what == what]


def test_mlp_batch_sizes_2_to_64_compile_twice(compiles):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    compiled = minicompile.compile(mlp)
    _run_sizes(mlp, compiled, range(2, 65), lambda b: (torch.randn(b, 16),))
    assert len(compiles) <= 2, len(compiles)
    assert any("L[1].shape[0]" in r.detail for r in _records(compiled, "dynamic"))
    assert len(compiled.capture_report.recompiles) == 1


def test_dynamic_true_and_mark_dynamic_compile_once_dynamic_false_per_size(compiles):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    _run_sizes(mlp, minicompile.compile(mlp, dynamic=True), range(2, 20), lambda b: (torch.randn(b, 16),))
    assert len(compiles) == 1, len(compiles)

    def marked(b):
        x = torch.randn(b, 16)
        torch._dynamo.mark_dynamic(x, 0)
        return (x,)
    _run_sizes(mlp, minicompile.compile(mlp), range(2, 20), marked)
    assert len(compiles) == 2, len(compiles)
    _run_sizes(mlp, minicompile.compile(mlp, dynamic=False), range(2, 6), lambda b: (torch.randn(b, 16),))
    assert len(compiles) == 2 + 4, len(compiles)


def softmax_norm(x, w):
    b = x.shape[0]
    h = torch.softmax(x.view(b, 4, -1), -1).reshape(b, -1) * 2
    return F.layer_norm(h, (x.shape[-1],), w) + x


def test_softmax_layer_norm_batch_sizes_2_to_64_compile_twice(compiles):
    w = torch.randn(32)
    compiled = minicompile.compile(softmax_norm)
    _run_sizes(softmax_norm, compiled, range(2, 65), lambda b: (torch.randn(b, 32), w))
    assert len(compiles) <= 2, len(compiles)
    entry = compiled.capture_report.entries[-1]
    shape_guard = [g.check for g in entry.guards if g.kind == "SHAPE_ENV"]
    assert shape_guard and "2 <= L[0].size()[0]" in shape_guard[0], entry.guards


def branch_on_size(x):
    if x.shape[0] > 10:
        return x.sin() * x.shape[1]
    return x.cos()


def test_branch_on_a_size_is_a_guard_not_a_wrong_result(compiles):
    compiled = minicompile.compile(branch_on_size)
    _run_sizes(branch_on_size, compiled, [2, 3, 5, 10, 11, 12, 40, 4], lambda b: (torch.randn(b, 6),))
    assert len(compiles) <= 3, len(compiles)   # b=2 static, then symbolic for b <= 10 and b > 10
    guards = [g.check for e in compiled.capture_report.entries for g in e.guards if g.kind == "SHAPE_ENV"]
    assert any("10" in g for g in guards), guards


def loop_over_rows(x):
    acc = x[0]
    for i in range(1, x.shape[0]):   # range() needs an int: the size specialises
        acc = acc + x[i] * i
    return acc


def test_size_used_as_python_int_specialises_per_size():
    compiled = capture_compile(loop_over_rows)
    _run_sizes(loop_over_rows, compiled, [2, 3, 4, 5, 3], lambda b: (torch.randn(b, 5),))
    assert any("specialised" in r.detail for r in _records(compiled, "static")), compiled.capture_report.dynamic


def returns_its_size(x):
    return x * 2, x.shape[0], f"rows={x.shape[0]}"


def test_a_size_returned_to_python_is_its_value():
    compiled = capture_compile(returns_its_size)
    for b in (2, 3, 4, 7):
        x = torch.randn(b, 3)
        got, expected = compiled(x), returns_its_size(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:], (got, expected)


def _formatted(x):
    n = x.shape[0]
    return x * len("{}".format(n * 100) + str(n) + f"{n:>5}")


def _arithmetic(x):
    n, m = x.shape
    return x[: n // 2 + 1].sum(0) * (m - n) + max(n, 3) * x.mean(0) + x.size(0) / x.numel()


def _sized_ops(x):
    n = x.shape[0]
    return torch.zeros(n, 2) + x.new_ones(n, 2) + x.reshape(n * 2).view(n, 2) + isinstance(n, int)


def _size_as_dict_key(x):
    return x + len({x.shape[0]: 1})


@pytest.mark.parametrize("fn", [_formatted, _arithmetic, _sized_ops, _size_as_dict_key])
def test_python_on_symbolic_sizes_matches_eager(fn):
    compiled = capture_compile(fn)
    _run_sizes(fn, compiled, [2, 3, 4, 5, 6, 1, 10, 3], lambda b: (torch.randn(b, 2),))


def add_two(x, y):
    return x + y


def test_sizes_0_and_1_and_relations_between_inputs_stay_guarded():
    compiled = capture_compile(add_two)
    cases = [((2, 8), (2, 8)), ((3, 8), (3, 8)), ((5, 8), (5, 8)), ((5, 8), (1, 8)), ((1, 8), (1, 8)),
             ((0, 8), (0, 8)), ((6, 8), (6, 8)), ((4, 8), (4, 8))]
    for a, b in cases:   # (5, 8) + (1, 8) broadcasts: the symbolic graph assumed equal sizes
        x, y = torch.randn(a), torch.randn(b)
        torch.testing.assert_close(compiled(x, y), x + y)
    guards = [g.check for e in compiled.capture_report.entries for g in e.guards if g.kind == "SHAPE_ENV"]
    assert any("L[1].size()[0] == L[0].size()[0]" in g for g in guards), guards


def test_non_contiguous_inputs_stay_static():
    compiled = capture_compile(add_two)
    for b in (2, 3, 4):
        x, y = torch.randn(8, b).t(), torch.randn(b, 8)
        torch.testing.assert_close(compiled(x, y), x + y)


def bias_broadcast_in_a_meta_function(bias, q, k, x):
    # baddbmm's and addcmul's meta functions expand their input to symbolic sizes (Bloom's alibi);
    # constant_pad_nd's read them as ints, specialising the size (MobileBERT's trigram embeddings)
    y = bias.baddbmm(q, k, beta=1.0, alpha=0.5) + torch.addcmul(bias, q.sum(2, keepdim=True), x)
    return y + F.pad(x[:, :, 1:], [0, 1])


def test_meta_functions_that_expand_symbolic_sizes_trace_without_a_break():
    compiled = capture_compile(bias_broadcast_in_a_meta_function)
    _run_sizes(bias_broadcast_in_a_meta_function, compiled, [16, 24, 32, 20],
               lambda s: (torch.randn(8, 1, s), torch.randn(8, s, 4), torch.randn(8, 4, s), torch.randn(8, 1, s)))
    assert compiled.capture_report.break_count == 0, compiled.capture_report.breaks
    assert compiled.capture_report.compile_count == 2


def data_dependent(x):
    return x[x > 0].sum() + x.nonzero().shape[0] * x


def test_data_dependent_sizes_still_break_after_a_recompile():
    compiled = capture_compile(data_dependent)
    _run_sizes(data_dependent, compiled, [2, 3, 4, 5], lambda b: (torch.randn(b, 3),))
    assert compiled.capture_report.break_count > 0


# ---------------------------------------------------------------- HF generate (issues 13, 14)
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("name,tokens", [("gpt2", 32), ("llama", 32), ("gpt2", 8), ("llama", 8)])
def test_hf_generate_through_the_pipeline_compiles_at_most_3_times(name, tokens, compiles):
    from tests.capture.test_hf_models import VOCAB, _make
    model = _make(name)
    ids = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=1)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        compiled = minicompile.compile(model)
        model.forward = compiled
        try:
            got = model.generate(ids, **kwargs)
        finally:
            del model.forward
    assert torch.equal(got, expected), (got, expected)
    assert got.shape[1] == 5 + tokens
    report = compiled.capture_report
    assert not report.fallbacks and report.break_count == 0, report
    # the prompt (static), the first one-token step (static), then one symbolic graph for the rest
    assert len(compiles) <= 3, len(compiles)
