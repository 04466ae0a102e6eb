"""`minicompile bench` says when its numbers cannot be trusted: wide spreads, impossible ratios,
a busy machine. Pure functions on made-up results: no timing here."""
from minicompile.tools.bench import format_table, load_note, row_flags
from minicompile.tools.bench_worker import interleaved_samples, timing

INFO = {"cpu": "test CPU", "cores": 2, "torch": "2.13", "torch_threads": 2, "size": "quick", "reps": 7}


def _row(eager=1e-3, mc=5e-4, spread=0.02, min_bytes=None, copy=None):
    r = {"workload": "pointwise", "shape": "4x4", "eager": {"median_s": eager, "spread": spread},
         "minicompile": {"median_s": mc, "spread": spread, "compile_s": 1.0}}
    if min_bytes:
        r.update(min_bytes=min_bytes, copy_bytes_per_s=copy)
    return r


def test_a_quiet_plausible_row_has_no_flag():
    assert row_flags(_row()) == []
    assert "not to be trusted" not in format_table([_row()], INFO)


def test_wide_spread_implausible_ratio_and_bandwidth_above_copy_are_flagged():
    assert any("spread 25%" in f for f in row_flags(_row(spread=0.25)))
    assert any("0.01x eager is implausible" in f for f in row_flags(_row(eager=1e-5, mc=1e-3)))
    # 10 MB in 0.5 ms is 20 GB/s, above a copy measured at 10 GB/s: impossible
    flags = row_flags(_row(min_bytes=10e6, copy=10e9))
    assert any("minicompile above copy bandwidth" in f for f in flags)
    table = format_table([_row(spread=0.25)], INFO)
    assert "! not to be trusted as measured:" in table and "pointwise: eager samples spread 25%" in table


def test_a_busy_machine_is_a_warning_in_the_header():
    assert "WARNING" not in load_note(0.3, 1.9, 2)
    assert "WARNING: the machine was busy before the run (load 6.0 on 2 cores)" in load_note(6.0, 7.0, 2)
    assert "WARNING" in format_table([_row()], dict(INFO, load=(6.0, 7.0)))


def test_samples_are_taken_in_turns_and_summarised_with_their_spread():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    samples = interleaved_samples(fns, (), reps=4, device="cpu", min_sample=0.0)
    assert [len(s) for s in samples.values()] == [4, 4]
    t = timing([1.0, 1.0, 2.0, 1.0, 1.0])
    assert t["median_s"] == 1.0 and t["spread"] >= 0.0
    assert timing([2.0])["median_s"] == 2.0
