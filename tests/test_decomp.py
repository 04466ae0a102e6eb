"""Every decomposition, run directly and through trace_inference, matches eager."""
from __future__ import annotations

import pytest
import torch

from minicompile.aot import trace_inference
from minicompile.decomp import CORE_OPS, DECOMPOSITIONS, EXTERN_COMPUTE_OPS, register_decomposition
from minicompile.testing.compare import same_tolerance
from tests.helpers import assert_matches_eager
from tests.op_table import Sample
from tests.samples import samples

aten = torch.ops.aten

DTYPES = [torch.float32, torch.bfloat16]
# Per output dtype: 16-bit floats get a bf16 ulp or two, every other float 1e-5. Values only:
# layouts are the compiler's job after tracing (tests/test_pipeline.py checks eager's strides).
TOLERANCES = {**same_tolerance(1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-2, 2e-2)}


def _cases():
    torch.manual_seed(0)
    return [pytest.param(s, d, id=f"{s.name}-{str(d).split('.')[-1]}") for d in DTYPES for s in samples(d)]


CASES = _cases()


def _comparable(sample, out):
    if sample.fn is aten.nll_loss_forward.default and sample.inputs()[3] == 0:
        return out[0]  # total_weight is unspecified without reduction; compare the loss only
    if sample.fn is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return out[0]  # logsumexp: only shape and dtype are checked (below)
    return out


def _call(fn, sample: Sample):
    return fn(*sample.inputs(), **sample.kwargs)


@pytest.mark.parametrize("sample,dtype", CASES)
def test_decomposition_matches_eager(sample: Sample, dtype):
    out = _call(DECOMPOSITIONS[sample.fn], sample)
    if out is NotImplemented:
        return  # the op stays as it is (e.g. pow with a general exponent): nothing to compare
    expected = _call(sample.fn, sample)
    if isinstance(expected, tuple):
        for a, e in zip(out, expected):  # None: an output the op's mask switched off
            assert (a is None and e is None) or (a.dtype, a.shape) == (e.dtype, e.shape)
    assert_matches_eager(_comparable(sample, out), _comparable(sample, expected), tolerances=TOLERANCES,
                         strides=False)


def _as_graph_module(sample: Sample):
    """An FX graph calling the op on the sample's tensors (the non-tensor args are baked in)."""
    flat, spec = torch.utils._pytree.tree_flatten((sample.inputs(), sample.kwargs))
    tensor_pos = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    graph = torch.fx.Graph()
    placeholders = {i: graph.placeholder(f"t{i}") for i in tensor_pos}
    values = [placeholders.get(i, a) for i, a in enumerate(flat)]
    args, kwargs = torch.utils._pytree.tree_unflatten(values, spec)
    graph.output(graph.call_function(sample.fn, tuple(args), kwargs))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [flat[i] for i in tensor_pos]


@pytest.mark.parametrize("sample,dtype", CASES)
def test_traced_graph_matches_eager(sample: Sample, dtype):
    gm, inputs = _as_graph_module(sample)
    traced = trace_inference(gm, inputs).gm
    assert_matches_eager(_comparable(sample, traced(*inputs)), _comparable(sample, _call(sample.fn, sample)),
                         tolerances=TOLERANCES, strides=False)
    if _call(DECOMPOSITIONS[sample.fn], sample) is not NotImplemented:
        leftover = [n.target for n in traced.graph.nodes if n.op == "call_function"
                    and n.target not in CORE_OPS and n.target not in EXTERN_COMPUTE_OPS
                    and torch.Tag.nondeterministic_seeded not in getattr(n.target, "tags", ())]  # random: eager's
        assert not leftover, f"{sample.name}: non-core ops left after tracing: {leftover}\n{traced.code}"


def test_every_decomposition_has_a_sample():
    covered = {s.fn for s in samples(torch.float32)}
    assert set(DECOMPOSITIONS) <= covered, f"no sample for {set(DECOMPOSITIONS) - covered}"


def test_register_decomposition_rejects_packets_and_duplicates():
    with pytest.raises(TypeError, match="overload packet"):
        register_decomposition(aten.addmm)(lambda *a: None)
    with pytest.raises(ValueError, match="already has a decomposition"):
        register_decomposition(aten.addmm.default)(lambda *a: None)


def test_training_batch_norm_updates_running_stats_and_dropout_is_left_alone():
    """Training batch norm decomposes, writing the running statistics in place as eager does;
    a random op (training dropout) stays the eager op, so it draws from torch's generator."""
    x, stats = torch.randn(2, 3), [torch.zeros(3), torch.ones(3)]
    ours, eager = [s.clone() for s in stats], [s.clone() for s in stats]
    got = DECOMPOSITIONS[aten.native_batch_norm.default](x, None, None, *ours, True, 0.1, 1e-5)
    want = aten.native_batch_norm.default(x, None, None, *eager, True, 0.1, 1e-5)
    torch.testing.assert_close((got, ours), (want, eager))
    assert not torch.equal(ours[0], stats[0])
    assert DECOMPOSITIONS[aten.native_dropout.default](x, 0.5, True) is NotImplemented
