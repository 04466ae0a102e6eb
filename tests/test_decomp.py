"""Every decomposition, run directly and through trace_inference, matches eager."""
from __future__ import annotations

import pytest
import torch

from minicompile.aot import trace_inference
from minicompile.decomp import CORE_OPS, DECOMPOSITIONS, EXTERN_COMPUTE_OPS, register_decomposition
from tests.samples import Sample, samples

aten = torch.ops.aten

DTYPES = [torch.float32, torch.bfloat16]
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _cases():
    torch.manual_seed(0)
    return [pytest.param(s, d, id=f"{s.name}-{str(d).split('.')[-1]}") for d in DTYPES for s in samples(d)]


CASES = _cases()


def assert_same(actual, expected, dtype):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, dtype)
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.numel() == 0:
        return
    tol = TOLERANCE[torch.bfloat16 if expected.dtype in (torch.bfloat16, torch.float16) else torch.float32]
    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


def _eager(sample):
    out = sample.op(*sample.args, **sample.kwargs)
    if sample.op is aten.nll_loss_forward.default and sample.args[3] == 0:
        # total_weight is unspecified without reduction; compare the loss only.
        return out[0]
    return out


def _comparable(sample, out):
    if sample.op is aten.nll_loss_forward.default and sample.args[3] == 0:
        return out[0]
    if sample.op is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return out[0]  # logsumexp: only shape and dtype are checked (below)
    return out


@pytest.mark.parametrize("sample,dtype", CASES)
def test_decomposition_matches_eager(sample: Sample, dtype):
    decomp = DECOMPOSITIONS[sample.op]
    out = decomp(*sample.args, **sample.kwargs)
    if out is NotImplemented:
        return  # the op stays as it is (e.g. pow with a general exponent): nothing to compare
    expected = sample.op(*sample.args, **sample.kwargs)
    if isinstance(expected, tuple):
        for a, e in zip(out, expected):
            assert (a.dtype, a.shape) == (e.dtype, e.shape)
    assert_same(_comparable(sample, out), _comparable(sample, expected), dtype)


def _as_graph_module(sample: Sample):
    """An FX graph calling the op on the sample's tensors (the non-tensor args are baked in)."""
    flat, spec = torch.utils._pytree.tree_flatten((sample.args, sample.kwargs))
    tensor_pos = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    graph = torch.fx.Graph()
    placeholders = {i: graph.placeholder(f"t{i}") for i in tensor_pos}
    values = [placeholders.get(i, a) for i, a in enumerate(flat)]
    args, kwargs = torch.utils._pytree.tree_unflatten(values, spec)
    graph.output(graph.call_function(sample.op, tuple(args), kwargs))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [flat[i] for i in tensor_pos]


@pytest.mark.parametrize("sample,dtype", CASES)
def test_traced_graph_matches_eager(sample: Sample, dtype):
    gm, inputs = _as_graph_module(sample)
    traced = trace_inference(gm, inputs)
    assert_same(_comparable(sample, traced(*inputs)), _comparable(sample, sample.op(*sample.args, **sample.kwargs)), dtype)
    if DECOMPOSITIONS[sample.op](*sample.args, **sample.kwargs) is not NotImplemented:
        leftover = [n.target for n in traced.graph.nodes if n.op == "call_function"
                    and n.target not in CORE_OPS and n.target not in EXTERN_COMPUTE_OPS]
        assert not leftover, f"{sample.name}: non-core ops left after tracing: {leftover}\n{traced.code}"


def test_every_decomposition_has_a_sample():
    covered = {s.op for s in samples(torch.float32)}
    assert set(DECOMPOSITIONS) <= covered, f"no sample for {set(DECOMPOSITIONS) - covered}"


def test_register_decomposition_rejects_packets_and_duplicates():
    with pytest.raises(TypeError, match="overload packet"):
        register_decomposition(aten.addmm)(lambda *a: None)
    with pytest.raises(ValueError, match="already has a decomposition"):
        register_decomposition(aten.addmm.default)(lambda *a: None)


def test_training_batch_norm_is_left_alone():
    x, rm, rv = torch.randn(2, 3), torch.zeros(3), torch.ones(3)
    assert DECOMPOSITIONS[aten.native_batch_norm.default](x, None, None, rm, rv, True, 0.1, 1e-5) is NotImplemented
    assert DECOMPOSITIONS[aten.native_dropout.default](x, 0.5, True) is NotImplemented
