"""Horizontal groups (scheduler/groups.py, spelled by codegen/cpp.py): consecutive independent C++ kernels run as one call
with one parallel region and no barrier between them; kernels that depend on each other never
share a group. Every case compares the mutated inputs and outputs with eager."""
import pytest
import torch

from minicompile.config import patch
from tests.helpers import assert_matches_eager, compile_fn

pytestmark = pytest.mark.two_threads   # parallel code under test: two threads on a test worker too (conftest.py)


def momentum_steps(*tensors):
    """SGD with momentum on each (p, buf, grad) triple: one independent kernel per triple."""
    for p, b, g in zip(tensors[0::3], tensors[1::3], tensors[2::3]):
        b.mul_(0.9).add_(g)
        p.add_(b, alpha=-0.1)


def run_both(fn, inputs, **knobs):
    """(compiled graph, its results, eager's): results are the inputs after the call and the output."""
    with patch(**knobs):
        c = compile_fn(fn, *inputs, trace="fake")
    ours, ref = [x.clone() for x in inputs], [x.clone() for x in inputs]
    out, expected = c(*ours), fn(*ref)
    return c, [*ours, out], [*ref, expected]


# odd sizes: a thread's share of a loop ends mid-vector, and tiny tensors go to single threads
SIZES = [(301, 133), (7,), (1000,), (40001,), (1,), (65, 65)]


@pytest.mark.parametrize("threshold", [1, 1000, 1 << 40], ids=["all threaded", "mixed", "no region"])
def test_independent_updates_are_one_call_and_match_eager(threshold):
    torch.manual_seed(0)
    inputs = [torch.randn(s) for s in SIZES for _ in range(3)]
    c, ours, ref = run_both(momentum_steps, inputs, parallel_threshold=threshold)
    assert_matches_eager(ours, ref)
    assert c.num_kernels == len(SIZES) and "group0(" in c.wrapper_source and "kernel0" not in c.wrapper_source
    regions = c.kernel_source.count("#pragma omp parallel\n")
    assert regions == (0 if threshold > 1e12 else 1), c.kernel_source
    threaded = c.kernel_source.count("schedule(static) nowait")
    # (a one-element tensor's kernel has no loop: one thread runs it)
    assert threaded == sum(threshold <= torch.Size(s).numel() > 1 for s in SIZES), c.kernel_source


@pytest.mark.parametrize("fn", [
    lambda p, q: (p.mul_(2), q.add_(p.t()))[0],   # the second reads what the first wrote
    lambda p, q: (q.add_(p.t()), p.mul_(2))[0],   # the second writes what the first read
], ids=["read after write", "write after read"])
def test_dependent_kernels_stay_apart(fn):
    torch.manual_seed(0)
    inputs = [torch.randn(300, 300), torch.randn(300, 300)]
    c, ours, ref = run_both(fn, inputs, parallel_threshold=1)
    assert_matches_eager(ours, ref)
    assert c.num_kernels == 2 and "group" not in c.wrapper_source, c.kernel_source


def test_the_knob_turns_groups_off():
    inputs = [torch.randn(s) for s in SIZES[:3] for _ in range(3)]
    c, ours, ref = run_both(momentum_steps, inputs, horizontal_groups=False)
    assert_matches_eager(ours, ref)
    assert "group" not in c.wrapper_source and c.wrapper_source.count("kernel") >= 3


def test_a_group_is_one_profiler_event():
    inputs = [torch.randn(s) for s in SIZES[:3] for _ in range(3)]
    c = compile_fn(momentum_steps, *inputs, trace="fake")
    with torch.profiler.profile() as prof:
        c(*inputs)
    names = [e.name for e in prof.events()]
    assert names.count("group0") == 1, names


def test_the_schedule_shows_the_groups_and_codegen_follows_it():
    """The groups are the scheduler's (scheduler/groups.py), printed with the fusion stage; the C++
    code generator and the wrapper only spell them. Two independent updates, then one that reads
    what the first wrote: one group of two kernels, the third apart."""
    def fn(p, q, r):
        p.mul_(2)
        q.add_(1)
        r.add_(p.t())   # a transposed read: its own kernel
    inputs = [torch.randn(300, 300) for _ in range(3)]
    c, ours, ref = run_both(fn, inputs, parallel_threshold=1)
    assert_matches_eager(ours, ref)
    names = [k.name for k in c.schedule.kernels]
    (group,) = c.schedule.groups
    (apart,) = set(names) - set(group.kernels)
    assert len(names) == 3 and ", ".join(group.kernels) in ", ".join(names)   # consecutive, in order
    assert f"horizontal groups:\n    group0: one call, no barrier between {', '.join(group.kernels)}" in str(c.schedule)
    assert "group0(" in c.wrapper_source and f"{apart}(" in c.wrapper_source, c.wrapper_source
    assert group.kernels[0] not in c.wrapper_source and f"static void {group.kernels[0]}(" in c.kernel_source
    with patch(horizontal_groups=False):
        c = compile_fn(fn, *inputs, trace="fake")
    assert c.schedule.groups == [] and "horizontal groups" not in str(c.schedule)
