"""Data-dependent sizes and numbers computed at run time, compiled once and compared with eager;
the symbolic path's errors under MINICOMPILE_FALLBACK=0; higher-order ops (flex_attention,
cond, checkpoint), and compiling that leaves torch's global state as it was.

With ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops`` Dynamo keeps
``.item()``, ``nonzero`` and friends in the graph: their results are symbols (``u0``) that
only the run knows. The wrapper computes each one where the graph does (``u0 =
_local_scalar_dense(arg1)``, ``u1 = buf1.size(0)``) and hands it on as a value: to kernels as a
size argument, to extern calls as an argument. Each program here is called with data that
gives other sizes on every call, and one build must serve them all. (``.item()`` of a graph
input would be read by Dynamo itself and guarded on; the programs read computed tensors.)
"""
import logging
import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

import minicompile.backend as backend_module
import minicompile.pipeline as pipeline_module
from minicompile.backend import PerShapeGraph
from minicompile.config import patch
from minicompile.ir.expr import Expr, Sym
from minicompile.ir.graph import LoopGraph
from minicompile.ir.nodes import InputBuffer, Layout
from minicompile.pipeline import CompiledGraph
from tests.helpers import Recorder, assert_matches_eager


@pytest.fixture(autouse=True)
def capture_data_dependent():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        yield
    torch._dynamo.reset()


def run_calls(fn, calls) -> CompiledGraph:
    """``fn`` compiled once (fullgraph) and called with each argument tuple, every result against
    eager; returns the one compiled graph."""
    record = Recorder()
    compiled = torch.compile(fn, backend=record, fullgraph=True)
    for args in calls:
        assert_matches_eager(compiled(*args), fn(*args))
    assert len(record.graphs) == 1, "a new data-dependent size recompiled"
    (graph,) = record.graphs
    assert isinstance(graph, CompiledGraph), graph
    return graph


def seeded_randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- data-dependent sizes -------------------------------------------------------------------------

def test_nonzero_then_index_and_sum():
    def fn(x):
        idx = torch.nonzero(x > 0)
        return x[idx[:, 0], idx[:, 1]].sum() + idx.shape[0], idx * 2
    graph = run_calls(fn, [(seeded_randn(k, 5, 6),) for k in range(3)])
    assert ".size(0)  # a size computed from data" in graph.wrapper_source


def test_nonzero_rows_feed_a_kernel(backend):
    def fn(x):
        rows = torch.nonzero(x).float()
        return rows.sum(0) * 2 + rows.shape[0], (rows + 1).relu()
    graph = run_calls(fn, [(torch.randint(0, 3, (4, 7), generator=torch.Generator().manual_seed(k)),)
                           for k in range(3)])
    assert graph.num_kernels >= 1


def test_data_dependent_and_input_sizes_together():
    # dynamic=True: the input's sizes are symbols too (s0, s1), the selected count another (u0)
    def fn(x):
        picked = x[x > 0]
        return picked.exp().sum() / x.shape[0], torch.nonzero(x > 0.5) + x.shape[1]
    record = Recorder()
    compiled = torch.compile(fn, backend=record, fullgraph=True, dynamic=True)
    for n in (3, 5, 8):
        assert_matches_eager(compiled(seeded_randn(n, n, n + 2)), fn(seeded_randn(n, n, n + 2)))
    assert len(record.graphs) == 1 and isinstance(record.graphs[0], CompiledGraph)


def test_masked_select():
    run_calls(lambda x: torch.masked_select(x, x > 0.2) * 3, [(seeded_randn(k, 6, 5),) for k in range(3)])


def test_boolean_mask_then_cat():
    # the selected piece may be empty: cat of it runs as an extern call, never a kernel loading nothing
    def fn(x):
        picked = x[x > 0]
        return torch.cat([picked, picked * 2, x.flatten()])
    run_calls(fn, [(seeded_randn(k, 4, 5),) for k in range(3)] + [(-torch.ones(4, 5),)])


def test_repeat_interleave_with_tensor_repeats():
    fn = lambda x, r: torch.repeat_interleave(x, r, dim=0) + 1
    run_calls(fn, [(seeded_randn(0, 4, 3), torch.tensor([1, 0, 3, 2])), (seeded_randn(1, 4, 3), torch.tensor([2, 2, 0, 1])),
                   (seeded_randn(2, 4, 3), torch.tensor([0, 0, 0, 0]))])


def test_selected_rows_through_matmul_softmax_and_layer_norm():
    # a data-dependent row count may be 0: the product is aten.mm (no library timing, no oneDNN),
    # a softmax over a dim of data-dependent size stays eager's op
    w = seeded_randn(9, 6, 8)

    def fn(x):
        rows = x[x.sum(1) > 0]
        scores = rows @ rows.T
        return rows @ w, F.softmax(rows, -1), F.layer_norm(rows, (6,)), torch.softmax(scores, -1) @ rows
    with patch(cpu_gemm="auto", cpu_attention="auto"):
        run_calls(fn, [(seeded_randn(k, 7, 6),) for k in range(3)] + [(-torch.ones(7, 6),)])


def test_training_with_a_data_dependent_size_runs_eagerly_and_says_so(caplog):
    def fn(x):
        rows = x[x.sum(1) > 0]
        return (rows.sin() * 2).sum()
    x, y = seeded_randn(0, 6, 4).requires_grad_(), seeded_randn(0, 6, 4).requires_grad_()
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        torch.compile(fn, backend="minicompile")(x).backward()
    fn(y).backward()
    assert_matches_eager(x.grad, y.grad)
    assert "data-dependent sizes" in caplog.text


# -- .item() as a size -----------------------------------------------------------------------------

def test_item_as_the_size_of_zeros(backend):
    def fn(x, n):
        return torch.zeros((n * 1).item()) + x.sum()
    graph = run_calls(fn, [(seeded_randn(0, 3, 4), torch.tensor(k)) for k in (4, 9, 0, 1)])
    assert re.search(r"u\d+ = externs\[\d+\]\(", graph.wrapper_source)  # the size is read at run time


def test_item_as_a_narrow_length(backend):
    def fn(x, n):
        k = (n * 1).item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x.narrow(0, 0, k) * 2
    run_calls(fn, [(seeded_randn(0, 6, 5), torch.tensor(k)) for k in (3, 6, 0, 1)])


def test_item_as_the_end_of_arange():
    run_calls(lambda x, n: torch.arange((n * 1).item()) * x.sum(), [(seeded_randn(0, 3), torch.tensor(k)) for k in (7, 2, 12)])


def test_item_in_a_kernel_body(backend):
    # u0 is read only inside a kernel (not as a size): the kernel still takes it as an argument
    def fn(x, n):
        k = n.item()
        torch._check(k > 0)
        return x * k + 1
    graph = run_calls(fn, [(seeded_randn(0, 5, 6), torch.tensor(k)) for k in (3, 8)])
    assert graph.num_kernels == 1


# -- torch._check and numbers that are not sizes -----------------------------------------------------

def test_check_raises_when_it_fails_at_run_time():
    def fn(x, n):
        k = (n * 1).item()
        torch._check(k > 0)
        return x * k
    record = Recorder()
    compiled = torch.compile(fn, backend=record, fullgraph=True)
    assert_matches_eager(compiled(seeded_randn(0, 4), torch.tensor(2)), fn(seeded_randn(0, 4), torch.tensor(2)))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(seeded_randn(0, 4), torch.tensor(-1))
    assert len(record.graphs) == 1  # the wrapper's check raised, not a new trace


def test_scatter_with_a_float_from_item():
    def fn(x, idx, v):
        return x.scatter(1, idx, v.item())
    idx = torch.tensor([[0, 2], [1, 3], [0, 0], [4, 5], [1, 1]])
    graph = run_calls(fn, [(seeded_randn(0, 5, 6), idx, torch.tensor(2.5)), (seeded_randn(1, 5, 6), idx, torch.tensor(-7.0))])
    assert "None" not in graph.wrapper_source.split("def call(args)")[1].split("def call_profiled")[0]


def test_float_from_item_in_arithmetic():
    def fn(x, v):
        s = v.item()
        return (x * s).sin() + s
    run_calls(fn, [(seeded_randn(0, 4, 4), torch.tensor(0.5)), (seeded_randn(1, 4, 4), torch.tensor(3.0))])


def test_floor_division_of_a_possibly_negative_item():
    # k // 2 floors in Python and truncates in C++: -3 // 2 is -2, not -1
    def fn(x, n):
        k = (n * 1).item()
        return x * (k // 2) + k % 3
    run_calls(fn, [(seeded_randn(0, 3), torch.tensor(k)) for k in (5, -3, -8, 7)])


def test_float_from_item_as_a_divisor_and_a_fill_value():
    def fn(x):
        s = x.abs().max().item()
        return x / s, torch.full((3,), s)
    run_calls(fn, [(seeded_randn(k, 5, 3),) for k in range(3)])


def test_a_number_from_item_is_returned():
    def fn(x, a):
        n = a.item()
        return x + n, n * 2 + 1
    record = Recorder()
    compiled = torch.compile(fn, backend=record, fullgraph=True)
    for k in (3, 10):
        out, ref = compiled(seeded_randn(k, 3), torch.tensor(k)), fn(seeded_randn(k, 3), torch.tensor(k))
        assert_matches_eager(out[0], ref[0])
        assert out[1] == ref[1]


# -- the symbolic path obeys MINICOMPILE_FALLBACK ---------------------------------------------------

def _broken_for_symbols(compile_graph):
    def compile_or_raise(gm, example_inputs):
        if any(isinstance(s, torch.SymInt) for x in example_inputs if isinstance(x, torch.Tensor) for s in x.shape):
            raise RuntimeError("a bug of the symbolic path")
        return compile_graph(gm, example_inputs)
    return compile_or_raise


def test_symbolic_path_error_raises_with_fallback_off(monkeypatch):
    monkeypatch.setattr(backend_module, "compile_graph", _broken_for_symbols(backend_module.compile_graph))
    compiled = torch.compile(lambda x: x.sin() + 1, backend="minicompile", dynamic=True)
    with pytest.raises(Exception, match="a bug of the symbolic path"):
        compiled(seeded_randn(0, 5, 3))


def test_symbolic_path_error_compiles_per_shape_with_fallback_on(monkeypatch, caplog):
    monkeypatch.setattr(backend_module, "compile_graph", _broken_for_symbols(backend_module.compile_graph))
    record = Recorder()
    fn = lambda x: x.sin() + 1
    compiled = torch.compile(fn, backend=record, dynamic=True)
    with patch(fallback_on_error=True), caplog.at_level(logging.WARNING, logger="minicompile"):
        for n in (5, 7):
            assert_matches_eager(compiled(seeded_randn(n, n, 3)), fn(seeded_randn(n, n, 3)))
    assert isinstance(record.graphs[0], PerShapeGraph)
    assert "a bug of the symbolic path" in caplog.text and "per shape" in caplog.text


@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_upsampling_with_symbolic_sizes(align_corners):
    # the source index is clamped to s0 - 1: a symbolic bound inside the loop body
    fn = lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=align_corners)
    record = Recorder()
    compiled = torch.compile(fn, backend=record, dynamic=True)
    for n in (3, 5, 8):
        x = seeded_randn(n, 1, 2, n, n + 1)
        assert_matches_eager(compiled(x), fn(x))
    assert len(record.graphs) == 1 and isinstance(record.graphs[0], CompiledGraph)
    assert "int64_t s" in record.graphs[0].kernel_source


def test_an_input_sized_by_a_product_of_symbols_binds_no_symbol():
    # (s0*s1,) is no symbol's size; s0 and s1 come from the int inputs
    s0, s1 = Expr.of(Sym("s0")), Expr.of(Sym("s1"))
    flat = InputBuffer("arg0", Layout((s0 * s1,), (1,), 0, torch.float32, torch.device("cpu")), position=0)
    graph = LoopGraph((flat,), (flat, s0, s1), {}, (), (), (), {}, ())
    assert graph.symbols == {"s0": (1, None), "s1": (2, None)}


# -- higher-order ops, and compiling leaves no global state behind ------------------------------------

def _causal_score(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def _causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _qkv(seed):
    return tuple(seeded_randn(seed + k, 1, 2, 128, 16) for k in range(3))


def test_flex_attention_with_score_mod():
    # the default block mask is built with a vmap that Dynamo's graph enters and leaves itself
    run_calls(lambda q, k, v: flex_attention(q, k, v, score_mod=_causal_score), [_qkv(0), _qkv(3)])
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == 0


def test_flex_attention_with_block_mask():
    mask = create_block_mask(_causal_mask, 1, 1, 128, 128, device="cpu")
    run_calls(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), [_qkv(0), _qkv(3)])


def test_cond_takes_either_branch():
    fn = lambda x: torch.cond(x.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() - 1, (x,))
    run_calls(fn, [(seeded_randn(0, 4, 4).abs(),), (-seeded_randn(1, 4, 4).abs(),)])


def test_checkpointed_block():
    block = lambda x: torch.relu(x @ x.T).sum(0)
    fn = lambda x: checkpoint(block, x, use_reentrant=False) + 1
    run_calls(fn, [(seeded_randn(0, 6, 6),), (seeded_randn(1, 6, 6),)])


def test_checkpointed_block_trains():
    block = lambda x: torch.relu(x @ x.T).sum(0)
    fn = lambda x: (checkpoint(block, x, use_reentrant=False) + 1).sum()
    x, y = seeded_randn(0, 6, 6).requires_grad_(), seeded_randn(0, 6, 6).requires_grad_()
    torch.compile(fn, backend="minicompile")(x).backward()
    fn(y).backward()
    assert_matches_eager(x.grad, y.grad)


def test_a_failed_trace_leaves_no_functorch_layer(monkeypatch):
    # a trace that dies inside a transform it entered: the graph then runs eagerly, and Dynamo's
    # guard on the functorch stack (checked as the frame is compiled) still holds
    def dies_in_a_vmap(gm, example_inputs):
        torch._C._functorch._vmap_increment_nesting(1, "error")
        raise RuntimeError("a trace that failed half way")
    monkeypatch.setattr(pipeline_module, "_trace", dies_in_a_vmap)
    fn = lambda x: x.sin() + 1
    with patch(fallback_on_error=True):
        out = torch.compile(fn, backend="minicompile")(seeded_randn(0, 4))
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == 0
    assert_matches_eager(out, fn(seeded_randn(0, 4)))


def test_slice_to_a_length_from_item(backend):
    # x[:k] for k from .item() has length min(k, n): a new symbol that only running the slice gives
    # (the bug-class fuzzer's unbacked class found it bound from the slice's own lowered view)
    run_calls(lambda x: x.reshape(-1)[:(x > 0).sum().item()] * 2, [(seeded_randn(k, 3, 5),) for k in range(3)])


def test_two_data_dependent_sizes_checked_equal_at_run_time(backend):
    # v1 has u0 elements (a nonzero), v2 = v1[:k] min(k, u0): another symbol. Subtracting them,
    # torch's broadcasting checks at run time that the two are equal (_assert_scalar(Eq(u2, u0)));
    # the kernel takes them as one size, after the wrapper's check (the unbacked fuzzer's seed
    # 102450 raised NotSymbolic in the backend)
    def fn(x):
        v1 = x.flatten()[(x.flatten() > 0).nonzero()[:, 0]]
        v2 = v1[:(v1 > 0.5).sum().item()]
        return v2 - v1, v2 * v1.sin()
    calls = [(torch.where(x > 0, x + 0.5, x),) for x in (seeded_randn(k, 4, 5) for k in range(3))]
    record = Recorder()
    compiled = torch.compile(fn, backend=record, fullgraph=True)
    for args in calls:
        assert_matches_eager(compiled(*args), fn(*args))
    assert len(record.graphs) == 1 and isinstance(record.graphs[0], CompiledGraph)
    call = record.graphs[0].wrapper_source.split("def call(")[1].split("def call_profiled")[0]
    kernels = [m.start() for m in re.finditer(r"kernel\d+_\w+\(", call)]
    assert call.index("Eq(u") < kernels[-1]          # the check runs before the kernel that relies on it
    unequal = torch.tensor([[0.2, 0.9, -1.0, 0.7]])    # three positives, two over 0.5
    with pytest.raises(RuntimeError):
        fn(unequal)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(unequal)


def test_pad_of_a_data_dependent_size(backend):
    # torch's C++ constant_pad_nd reads sizes as ints: on a size from data it raised
    # GuardOnDataDependentSymNode (the unbacked fuzzer's seed 102406); the trace pads it itself
    def fn(x):
        rows = x[x.sum(1) > 0]
        return F.pad(torch.nonzero(x > 0).reshape(-1), [1, 2]), F.pad(rows.sin(), [2, 0, 1, 1], value=-3.0) * 2
    run_calls(fn, [(seeded_randn(k, 5, 3),) for k in range(3)] + [(-torch.ones(5, 3),)])


def test_a_slice_of_length_from_data_keeps_its_buffer_alive(backend):
    # x[:k] runs as an extern returning a view of the reshaped copy; the wrapper reused that
    # copy's memory for sin(x) while the view was still returned (unbacked fuzzer seeds 300118, 300167)
    def fn(x):
        picked = x.reshape(-1)[:(x > 0).sum().item()]
        y = torch.sin(x)
        return y[torch.nonzero(y.sum(-1) > 0)[:, 0]], picked
    run_calls(fn, [(seeded_randn(k, 5, 6).t(),) for k in range(3)])


def test_a_number_from_data_that_tracing_fixed_is_checked_at_run_time():
    # broadcasting arange(k) against 4 elements, torch assumes k is not 1 and checks k == 4,
    # replacing k by 4 in the trace; a k of 1 (eager broadcasts it) gave wrong values where
    # torch.compile raises (unbacked fuzzer seed 300111)
    def fn(x):
        return torch.maximum(x, torch.arange((x > 0.5).sum().item()) * x.mean())
    compiled = torch.compile(fn, backend="minicompile", fullgraph=True)
    x = torch.tensor([0.6, 0.7, 0.9, 0.8])
    assert_matches_eager(compiled(x), fn(x))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(torch.tensor([0.1, 0.7, -0.3, 0.2]))


def test_a_slice_to_a_bound_from_data_that_tracing_fixed_is_checked_at_run_time():
    # x[:k] - x: broadcasting the slice against x, torch assumes its length min(k, n) is n and
    # replaces it in the trace; the lowering read x[:n] whatever k was, so a k of 1 (eager
    # broadcasts x[:1]) returned zeros (unbacked fuzzer seed 500766). A slice bound read from
    # data runs eagerly and its length is checked, as torch.compile's own graph checks it
    def fn(x):
        return x - x.reshape(-1)[:(x > 0).sum().item()]
    compiled = torch.compile(fn, backend="minicompile", fullgraph=True)
    x = torch.tensor([0.5, 0.25])
    assert_matches_eager(compiled(x), fn(x))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(torch.tensor([0.75, -0.5]))


def test_an_extern_result_of_another_size_than_traced_raises():
    # v + masked_select(v, ...): torch assumes the selection is not of length 1 and checks it is
    # v's length, fixing it in the trace; a selection of 1 (eager broadcasts it) was read as 8
    # elements (unbacked fuzzer seed 300275). The wrapper checks an extern's result size
    def fn(x):
        return x + torch.masked_select(x, x < 0.3)
    compiled = torch.compile(fn, backend="minicompile", fullgraph=True)
    x = -torch.rand(8)
    assert_matches_eager(compiled(x), fn(x))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(torch.tensor([0.1, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]))


def test_expanded_rows_of_nonzero_are_copied(backend):
    # a copy of nonzero's rows expanded: its strides hold Max(1, u0) times 2 (unbacked fuzzer seed 300180)
    run_calls(lambda x: torch.nonzero(x > 0).unsqueeze(0).expand(2, -1, -1).clone(),
              [(seeded_randn(k, 7, 5),) for k in range(3)])
