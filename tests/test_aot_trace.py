"""trace_inference: functional, decomposed ATen graphs that match eager."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from minicompile.aot import trace_inference
from minicompile.decomp import CORE_OPS, EXTERN_COMPUTE_OPS
from tests.helpers import assert_matches_eager
from tests.models import model_cases

aten = torch.ops.aten
MODELS = model_cases()


def call_targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def assert_core_only(gm):
    offenders = sorted({str(t) for t in call_targets(gm) if t not in CORE_OPS and t not in EXTERN_COMPUTE_OPS})
    assert not offenders, f"non-core ops after tracing: {offenders}\n{gm.code}"


def assert_meta_everywhere(gm):
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function", "get_attr"):
            assert "val" in node.meta, f"no meta['val'] on {node.format_node()}"


@pytest.mark.parametrize("name,model,inputs", MODELS, ids=[m[0] for m in MODELS])
def test_models_trace_to_core_ops_and_match_eager(name, model, inputs):
    model.eval()
    traced = trace_inference(torch.fx.symbolic_trace(model), inputs).gm
    assert_core_only(traced)
    assert_meta_everywhere(traced)
    with torch.no_grad():
        assert_matches_eager(traced(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


def _dynamo_capture(fn, inputs, dynamic=False):
    """Run fn under torch.compile with a backend that traces with trace_inference."""
    traced = []

    def backend(gm, example_inputs):
        traced.append(trace_inference(gm, example_inputs).gm)
        return traced[-1]

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)
    with torch.no_grad():
        out = compiled(*inputs)
    return traced, out


def test_dynamo_graph_of_transformer_block():
    name, model, inputs = MODELS[1]
    model.eval()
    traced, out = _dynamo_capture(model, inputs)
    assert len(traced) == 1
    assert_core_only(traced[0])
    assert_meta_everywhere(traced[0])
    with torch.no_grad():
        assert_matches_eager(out, model(*inputs), atol=1e-5, rtol=1e-5)


def test_dynamo_dynamic_shapes_keep_symbolic_meta():
    def f(x):
        return F.layer_norm(x, (x.shape[-1],)) * 2

    x = torch.randn(4, 8)
    traced, out = _dynamo_capture(f, [x], dynamic=True)
    torch.testing.assert_close(out, f(x))
    vals = [n.meta["val"] for n in traced[0].graph.nodes if n.op == "placeholder"]
    assert any(isinstance(v, torch.SymInt) for v in vals) or any(
        isinstance(s, torch.SymInt) for v in vals if isinstance(v, torch.Tensor) for s in v.shape
    )
    assert_meta_everywhere(traced[0])


def test_rms_norm_inplace_leftover_is_functionalized():
    # In torch 2.13 rms_norm's composite kernel reaches make_fx as ... .add_(eps).
    gm = torch.fx.symbolic_trace(lambda x: F.rms_norm(x, (8,)))
    traced = trace_inference(gm, [torch.randn(3, 8)]).gm
    mutating = [t for t in call_targets(traced) if isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable]
    assert not mutating, traced.code


def test_label_smoothing_masked_fill_leftover_is_decomposed():
    # cross_entropy(label_smoothing=...) reaches make_fx with masked_fill_ on an intermediate.
    def f(x, t):
        return F.cross_entropy(x, t, label_smoothing=0.1)

    x, t = torch.randn(4, 5), torch.tensor([1, -100, 3, 0])
    traced = trace_inference(torch.fx.symbolic_trace(f), [x, t]).gm
    assert_core_only(traced)
    torch.testing.assert_close(traced(x, t), f(x, t))


def test_input_mutation_is_a_trailing_copy_into_the_placeholder():
    def f(x, y):
        x.add_(1)
        y[0].mul_(2)
        return x * 3

    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(3), torch.randn(2, 3)
    traced = trace_inference(gm, [x.clone(), y.clone()]).gm
    nodes = [n for n in traced.graph.nodes if n.op == "call_function"]
    copies = [n for n in nodes if n.target is aten.copy_.default]
    assert len(copies) == 2
    assert {c.args[0].op for c in copies} == {"placeholder"}
    assert nodes[-2:] == copies, "copy_ nodes must be the last call_function nodes"
    xe, ye, xt, yt = x.clone(), y.clone(), x.clone(), y.clone()
    expected = f(xe, ye)
    torch.testing.assert_close(traced(xt, yt), expected)
    torch.testing.assert_close((xt, yt), (xe, ye))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sin(),
        lambda x: (x.sin(),),
        lambda x: [x.sin(), x.cos()],
        lambda x: (x.sin(), None, x.cos()),
    ],
    ids=["single_tensor", "tuple1", "list", "tuple_with_none"],
)
def test_output_structure_matches_the_captured_graph(fn):
    x = torch.randn(3)
    traced = trace_inference(torch.fx.symbolic_trace(fn), [x]).gm
    out, expected = traced(x), fn(x)
    assert type(out) is type(expected)
    torch.testing.assert_close(out, expected)


def test_meta_val_matches_eager_size_stride_dtype():
    def f(x, w):
        return F.linear(x, w).transpose(0, 1), x.to(torch.bfloat16).softmax(-1)

    x, w = torch.randn(4, 6), torch.randn(5, 6)
    traced = trace_inference(torch.fx.symbolic_trace(f), [x, w]).gm
    out_node = next(n for n in traced.graph.nodes if n.op == "output")
    vals = [a.meta["val"] for a in out_node.args[0]]
    for val, real in zip(vals, f(x, w)):
        assert isinstance(val, FakeTensor)
        assert (val.shape, val.stride(), val.dtype) == (real.shape, real.stride(), real.dtype)


def test_fake_inputs_from_an_existing_fake_mode_and_int_inputs():
    def f(x, n):
        return x * n

    mode = FakeTensorMode()
    fake_x = mode.from_tensor(torch.randn(2, 3))
    traced = trace_inference(torch.fx.symbolic_trace(f), [fake_x, 3]).gm
    assert next(iter(traced.graph.nodes)).meta["val"].fake_mode is mode
    x = torch.randn(2, 3)
    torch.testing.assert_close(traced(x, 3), x * 3)


def test_composite_ops_are_decomposed_by_the_dispatcher_first():
    """Documents torch 2.13's behaviour: CompositeImplicitAutograd ops (linear, sdpa) never
    reach the table; what they decompose into (addmm, flash-attention-for-cpu) does."""
    seen = []
    from minicompile.decomp import DECOMPOSITIONS

    def spy(op):
        original = DECOMPOSITIONS[op]

        def wrapped(*args, **kwargs):
            seen.append(op)
            return original(*args, **kwargs)

        return wrapped

    watched = [aten.linear.default, aten.addmm.default, aten.scaled_dot_product_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default]
    saved = {op: DECOMPOSITIONS[op] for op in watched}
    try:
        for op in watched:
            DECOMPOSITIONS[op] = spy(op)

        def f(x, w, b, q):
            return F.linear(x, w, b), F.scaled_dot_product_attention(q, q, q)

        # device-neutral (no policy handed in): no CPU claim takes addmm before the table sees it
        trace_inference(torch.fx.symbolic_trace(f), [torch.randn(2, 4), torch.randn(3, 4), torch.randn(3), torch.randn(1, 2, 3, 4)])
    finally:
        DECOMPOSITIONS.update(saved)
    assert aten.linear.default not in seen and aten.scaled_dot_product_attention.default not in seen
    assert aten.addmm.default in seen and aten._scaled_dot_product_flash_attention_for_cpu.default in seen
