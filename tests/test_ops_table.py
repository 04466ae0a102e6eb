"""Every sample in the shared table, compiled with torch.compile(backend="minicompile"), matches eager."""
import pytest
import torch

from tests.conftest import assert_close_like_eager
from tests.op_table import SAMPLES


def run_sample(sample, backend="minicompile"):
    torch._dynamo.reset()
    compiled = torch.compile(sample.fn, backend=backend, fullgraph=False)
    with torch.no_grad():
        ref = sample.fn(*sample.inputs())
        out = compiled(*sample.inputs())
    assert_close_like_eager(out, ref, sample.atol, sample.rtol)


def test_table_is_large_enough():
    assert len(SAMPLES) >= 60
    assert len({s.name for s in SAMPLES}) == len(SAMPLES)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_matches_eager_cpp(sample):
    run_sample(sample)
