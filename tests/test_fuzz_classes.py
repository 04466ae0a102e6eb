"""CI slice of the bug-class fuzzer (testing/fuzz_classes.py; the long runs: docs/testing.md).

A few programs per class, each class in the mode its bugs showed up in (layouts and attention
in training, random ops on strided intermediates, unbacked sizes and user text through
torch.compile); the checks must be able to fail, and the generators are deterministic."""
from __future__ import annotations

import copy

import pytest
import torch

from minicompile.testing import fuzz_classes, fuzz_gather
from minicompile.testing.fuzz_classes import KINDS, check_batch, check_function, decorate, generate_for, run

# (class, first seed, programs): seeds chosen in the group (training or not, attention form) shown
SLICES = [("layout", 32, 3), ("random", 0, 4), ("attention", 160, 3), ("unbacked", 0, 3), ("text", 0, 4),
          ("convbn", 401018, 2), ("concat", 30, 4), ("gather", 45, 8)]


@pytest.mark.parametrize("kind,seed,n", SLICES, ids=[s[0] for s in SLICES])
def test_fuzzed_class_programs_match_eager(kind, seed, n, tmp_path):
    failures = run(kind, seed, n, batch=n, repro_dir=str(tmp_path), log=lambda *a: None)
    assert not failures, f"{kind} programs disagree with eager; reproducers:\n" + "\n".join(
        open(p).read() for p in failures[:2])


def test_slices_cover_the_modes_they_name():
    assert all(generate_for("layout")(32 + k).train for k in range(3))
    assert {generate_for("attention")(160 + k).mode for k in range(3)} == {"flash"}
    assert all(generate_for("attention")(160 + k).train for k in range(3))
    concat = [generate_for("concat")(30 + k) for k in range(4)]
    assert [p.train for p in concat] == [False, False, True, True]
    assert all(any("torch.cat(" in s or "torch.stack(" in s for s in p.steps) for p in concat)
    assert fuzz_gather.raising_programs(45, 8) == [45, 48, 51, 52]   # out of range at some call: raise as eager


def test_a_gather_that_does_not_raise_is_reported(monkeypatch):
    from minicompile.runtime import index_faults
    monkeypatch.setattr(index_faults, "raise_index_fault", lambda record: record.fill(0))
    found = fuzz_gather.check([generate_for("gather")(45)])
    assert found is not None and "compiled did not" in found, found


def test_a_wrong_compiled_value_is_reported(monkeypatch):
    prog = generate_for("layout")(3)
    assert not prog.train

    def wrong(gm, inputs):
        return lambda *args: tuple(o + 1 if isinstance(o, torch.Tensor) and o.dtype.is_floating_point else o
                                   for o in gm(*args))
    monkeypatch.setattr(fuzz_classes, "compile_graph", wrong)
    found = check_batch([prog])
    assert found is not None and "differ" in found


@pytest.mark.parametrize("kind", KINDS)
def test_generation_is_deterministic_and_reproducers_are_python(kind):
    a, b = generate_for(kind)(41), generate_for(kind)(41)
    assert a.reproducer("x") == b.reproducer("x")
    compile(a.reproducer("x"), "repro.py", "exec")


def test_user_text_programs_carry_the_hard_text():
    sources = [decorate(generate_for("layout")(s).function_source(), s) for s in range(60)]
    text = "\n".join(sources)
    for piece in ("\\\n", "*/", "/*", "??=", '"""', "caf\u00e9", "longlonglong"):
        assert piece in text, piece
    assert max(len(line) for line in text.splitlines()) > 300


def test_a_reproducer_runs_its_class_check(tmp_path):
    prog = generate_for("random")(5)
    namespace: dict = {}
    exec(compile(prog.reproducer("x"), "repro.py", "exec"), namespace)
    assert check_function("random", namespace["program"], namespace["inputs"]) is None


@pytest.mark.xfail(reason="rrelu_with_noise's fake kernel gives an input-like layout where eager's result is "
                          "contiguous; the wrapper conforms eager's result to the fake's strides (values agree)",
                   strict=True)
def test_rrelu_of_a_transposed_value_has_eagers_strides():
    from tests.helpers import compile_fn
    fn = lambda x: torch.nn.functional.rrelu(torch.sin(x.t()), training=True)  # noqa: E731
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    expected = fn(x)
    compiled = compile_fn(fn, x, trace="fake")
    torch.manual_seed(0)
    actual = compiled(x)
    torch.testing.assert_close(actual, expected)
    assert actual.stride() == expected.stride()


def test_a_batch_that_fails_torchs_own_check_rechecks_each_program_alone(monkeypatch):
    # torch's run-time check failing at a call (one program's selection of 1 where torch assumed
    # n) leaves that call compared for none of the batch: each program is then checked alone,
    # so a wrong value in another program of the batch is still found
    progs = [generate_for("unbacked")(s) for s in (0, 1)]
    seen = []

    def fake_check(kind, fn, inputs_at, train, mode, calls):
        n = len(inputs_at(0))
        seen.append(n)
        if n == sum(len(p.inputs) for p in progs):       # the batch: the check failed at call 1
            fuzz_classes.UNCHECKED.append(1)
            return None
        return "differ" if n == len(progs[1].inputs) and len(seen) == 3 else None
    monkeypatch.setattr(fuzz_classes, "check_function", fake_check)
    monkeypatch.setattr(fuzz_classes, "_eager_accepts", lambda p: True)
    assert fuzz_classes.check_batch(progs) == "differ"
    assert len(seen) == 3


def test_convbn_programs_cover_the_strided_1x1_crash_and_a_wrong_gradient_is_reported(monkeypatch):
    from minicompile.testing import fuzz_convbn
    assert fuzz_convbn.generate(401019).strided_1x1() and not fuzz_convbn.generate(401019).channels_last
    assert not any(p.channels_last and p.strided_1x1() for p in map(fuzz_convbn.generate, range(400000, 400200)))
    prog = fuzz_convbn.generate(401016)
    real = fuzz_convbn._step

    def wrong(models, run, xs, cotangents, dtype):   # the compiled run's input gradient off by 1%
        found = real(models, run, xs, cotangents, dtype)
        if not hasattr(run, "_orig_mod"):          # eager and float64 runs stay right
            return found
        return [[t * 1.01 if k == 1 else t for k, t in enumerate(ts)] for ts in found]
    monkeypatch.setattr(fuzz_convbn, "_step", wrong)
    found = fuzz_convbn.check([prog])
    assert found is not None and "input grad" in found


def test_convbn_judges_a_running_mean_that_is_zero_in_exact_arithmetic_by_the_buffers_scale():
    # convbn seed 402442: a BatchNorm after a 1x1 convolution of BatchNorm-centred values keeps a
    # running mean that is rounding noise in eager and ours alike (float64's is 1e-17): relative
    # to itself ours was "1.6e9 from float64, eager's 4.7e8"; it is measured against 1% of the
    # buffers' norm, as a cancelled gradient is against 1% of the gradients'
    from minicompile.testing.fuzz_convbn import ConvBnProgram, judge
    prog = ConvBnProgram(0, ["nn.Conv2d(1, 2, 1, bias=False)", "nn.BatchNorm2d(2)"], (2, 1, 4, 4), 0.0, False)
    d = torch.float64
    f64 = [torch.ones(2, 2, 4, 4, dtype=d), torch.ones(2, 1, 4, 4, dtype=d), torch.ones(2, 1, 1, 1, dtype=d),
           torch.ones(2, dtype=d), torch.ones(2, dtype=d), torch.full((2,), 1e-17, dtype=d), torch.ones(2, dtype=d)]
    eager = [t.clone() for t in f64]
    eager[5] = torch.full((2,), 1e-9, dtype=d)
    ours = [t.clone() for t in eager]
    ours[5] = torch.full((2,), 5e-9, dtype=d)
    assert judge(prog, ours, eager, eager, f64) is None
    ours[6] = torch.full((2,), 1.5, dtype=d)             # a running variance off: still found
    assert "running_var" in judge(prog, ours, eager, eager, f64)


def test_convbn_seed_403562_is_judged_against_more_than_one_draw_of_eagers_error():
    # convbn seed 403562: a one-channel image through 1x1 convolutions and BatchNorms, so every
    # channel is nearly a multiple of one normalised image and the second convolution's weight
    # gradient exists only through BatchNorm's eps. Ours was 3.7e-4 from float64 there, eager
    # 9.2e-5: 4x, over the judge's 3x. Over 24 draws of the same architecture ours and eager are
    # as far from float64 (medians 2.9e-4 and 2.6e-4, each 0.4-3.7x the other); eager float32 on
    # the input nudged by one float32 step lands 1.3e-4 to 3.0e-4 away: its 9.2e-5 was a lucky
    # draw. The judge now draws eager's error more than once (testing/rounding.py).
    from minicompile.testing import fuzz_convbn
    prog = fuzz_convbn.generate(403562)
    k = 2 + [n for n, _ in prog.build().named_parameters()].index("3.weight")
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    f64 = fuzz_convbn._run_all([prog], torch.float64)[0]
    f64_nudged = fuzz_convbn._run_all([prog], torch.float64, nudge=0)[0]
    eager_nudged = fuzz_convbn._run_all([prog], torch.float32, nudge=0)[0]
    assert rel(f64_nudged[k], f64[k]) < 1e-5           # the nudge barely moves the exact result
    assert rel(eager_nudged[k], f64_nudged[k]) > 1e-4  # but eager's rounding lands elsewhere
    assert fuzz_convbn.check([prog]) is None


def test_eagers_draws_excuse_nothing_on_a_well_conditioned_model():
    # eager float32 on nudged inputs stays within float32's resolution of float64 where the model
    # is well conditioned, so a real error (the 1% gradient above) is still reported
    from minicompile.testing import rounding
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    for seed in range(3):
        x1 = rounding.nudge(x, seed)
        assert 0 < int((x1 != x).sum()) < x.numel()
        model.zero_grad()
        model(x1).sum().backward()
        grads = [p.grad.double() for p in model.parameters()]
        m64 = copy.deepcopy(model).double()
        m64(x1.double()).sum().backward()
        assert all(float((g - p.grad).norm() / p.grad.norm()) < 1e-6 for g, p in zip(grads, m64.parameters()))