"""Every sample in the shared table, compiled with torch.compile(backend="minicompile"), matches
eager on every code generator (the `backend` fixture: C++, and Triton in its interpreter)."""
import pytest

from tests.helpers import run_sample
from tests.op_table import SAMPLES


def test_table_is_large_enough():
    assert len(SAMPLES) >= 60
    assert len({s.name for s in SAMPLES}) == len(SAMPLES)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_matches_eager(sample, backend):
    run_sample(sample, backend=backend)
