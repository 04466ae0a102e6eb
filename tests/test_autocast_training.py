"""Mixed-precision training (``torch.autocast``) compiled, compared with eager autocast.

Each model trains 3 AdamW steps under ``torch.autocast("cpu", dtype=torch.bfloat16)``, compiled
through torch.compile(backend="minicompile") and eagerly from the same parameters and RNG seed;
losses and gradients match within bfloat16 tolerance (BF16), and every graph Dynamo hands the
backend is a compiled TrainingGraph whose forward and backward both ran each step (nothing runs
eagerly: the conftest sets MINICOMPILE_FALLBACK=0, and a refused graph would come back as the
captured graph's forward). Autocast reaches the graph from outside (the caller's ``with``
block: Dynamo guards on the global state) or from inside (``_enter_autocast`` nodes).
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from minicompile.aot.global_state import autocast_nesting, kept_global_state
from minicompile.aot.joint import trace_joint
from minicompile.aot.passes import trace_inference
from minicompile.aot.runtime import TrainingGraph
from minicompile.config import patch
from minicompile.cpu.claims import NARROW_FLAGS
from minicompile.cpu.timing import cpu_flags
from minicompile.pipeline import compile_aten, compile_graph
from tests.helpers import Recorder, assert_matches_eager
from tests.test_training_models import CNN, _hf

BF16 = dict(rtol=3e-2, atol=3e-3)    # one bfloat16 rounding is 2**-8 relative; a few of them add up
ADAMW_LR = 1e-3
STEPS = 3


class AttentionBlock(nn.Module):
    """An MLP, LayerNorm and a softmax attention: products in bf16, LayerNorm/softmax as autocast says."""

    def __init__(self, dim=32, inner=False):
        super().__init__()
        self.inner = inner
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, y):
        if self.inner:        # autocast entered inside the compiled function
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self._loss(x, y)
        return self._loss(x, y)

    def _loss(self, x, y):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        h = x + self.proj(att @ v)
        h = h + self.mlp(self.ln(h))
        return F.mse_loss(h.float(), y)


MODELS = {
    "attention_block": (AttentionBlock, lambda: (torch.randn(2, 8, 32), torch.randn(2, 8, 32))),
    "attention_block_inner_autocast": (lambda: AttentionBlock(inner=True),
                                       lambda: (torch.randn(2, 8, 32), torch.randn(2, 8, 32))),
    "cnn": (CNN, lambda: (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))),
    "hf_gpt2": (lambda: _hf("gpt2"), lambda: (torch.randint(0, 100, (2, 16)),) * 2),
}


def _train(model, step_fn, inputs, outside: bool):
    """STEPS AdamW steps; the loss under autocast (``outside``: the caller's block), backward after it."""
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)
    history = []
    for seed in range(STEPS):
        opt.zero_grad()
        torch.manual_seed(seed)              # the same dropout masks, compiled and eager
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=outside):
            loss = step_fn(*inputs)
        loss.backward()
        history.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        opt.step()
    return history


def _max_differences(got, want) -> tuple:
    loss = max((g[0].float() - w[0].float()).abs().item() for g, w in zip(got, want))
    grad = max((g[1][n] - w[1][n]).abs().max().item() / max(w[1][n].abs().max().item(), 1e-12)
               for g, w in zip(got, want) for n in w[1])
    return loss, grad


@pytest.mark.parametrize("name", list(MODELS))
def test_autocast_training_compiles_and_matches_eager_autocast(name, caplog, fresh_dynamo):
    make_model, make_data = MODELS[name]
    torch.manual_seed(0)
    model, inputs = make_model(), make_data()
    model.train()
    reference = copy.deepcopy(model)
    outside = not name.endswith("inner_autocast")
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        got = _train(model, torch.compile(model, backend=rec), inputs, outside)
    want = _train(reference, reference, inputs, outside)
    print(name, "max |loss - eager's|, max |grad - eager's| / max |eager's grad|:", _max_differences(got, want))
    for g, w in zip(got, want):
        assert g[0].dtype == w[0].dtype
        assert_matches_eager(g, w, **BF16)
    assert "runs eagerly" not in caplog.text, caplog.text
    assert rec.graphs and all(isinstance(g, TrainingGraph) for g in rec.graphs), rec.graphs
    for graph in rec.graphs:
        assert graph.forward_calls == graph.backward_calls == STEPS
        assert graph.backward is not graph.partition.backward    # the backward was compiled too
    casts = [n for g in rec.graphs for n in g.joint.graph.graph.nodes
             if n.target is torch.ops.aten._to_copy.default and n.kwargs.get("dtype") == torch.bfloat16]
    assert casts, "autocast's casts to bfloat16 are in the joint graph"


# -- the rules the joint trace follows under autocast -----------------------------------------------

def _float32_region(x, w):
    """A float32 product inside an autocast graph: its backward product is float32 too (eager's
    backward() runs after the autocast block, with autocast off)."""
    with torch.autocast("cpu", enabled=False):
        return (x.float() @ w).sum()


def _dynamo_graph(fn, *inputs):
    """Dynamo's graph of ``fn`` (it records ``with torch.autocast`` as _enter/_exit_autocast calls)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=keep)(*inputs)
    torch._dynamo.reset()
    return graphs[0]


def test_the_backward_is_traced_with_autocast_off():
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gm, example_inputs = _dynamo_graph(_float32_region, x, w)
        assert any("_enter_autocast" in str(n.target) for n in gm.graph.nodes)
        joint = trace_joint(gm, example_inputs)
    products = [n for n in joint.graph.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert len(products) == 2 and all(n.meta["val"].dtype == torch.float32 for n in products), \
        [(n.name, n.meta["val"].dtype) for n in products]


def _mixed(x, w, v):
    a = torch.addmv(v, w, x[0])                 # autocast leaves addmv float32; it decomposes to mm
    with torch.autocast("cpu", enabled=False):
        b = x @ w                               # float32, inside the compiled graph
        d = torch.conv_tbc(x[None], w[None], v)  # a float32 extern call that autocast would cast again
    c = x @ w                                   # bfloat16
    return a.sum() + b.sum() + d.sum() + c.float().square().sum(), c


@pytest.mark.parametrize("grad", [True, False])
def test_float32_products_in_an_autocast_graph_stay_float32(grad, fresh_dynamo):
    """The compiled graph runs with autocast off: its extern ATen products are not cast again."""
    x, w, v = torch.randn(4, 8), torch.randn(8, 8, requires_grad=grad), torch.randn(8, requires_grad=grad)
    rec = Recorder()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.compile(_mixed, backend=rec)(x, w, v)
        want = _mixed(x, w, v)
    assert_matches_eager(got, want, rtol=1e-5, atol=1e-5)
    assert len(rec.graphs) == 1 and isinstance(rec.graphs[0], TrainingGraph) == grad
    if grad:
        assert_matches_eager(torch.autograd.grad(got[0], [w, v]), torch.autograd.grad(want[0], [w, v]),
                             rtol=1e-5, atol=1e-5)


def test_passes_after_the_trace_do_not_apply_autocast_again():
    """The joint graph's halves are compiled under the caller's autocast (the backward's on the
    first backward call); a pass that runs fake kernels again (new strides of a size-1 dimension:
    compile_aten's aten_inputs) must not turn the float32 product into a bfloat16 one."""
    x, w = torch.randn(1, 8), torch.randn(8, 4)
    aten_gm = trace_inference(torch.fx.symbolic_trace(lambda x, w: (x @ w).relu()), [x, w]).gm   # float32
    x_other = torch.randn(8, 1).t()                  # strides (1, 1), traced with (8, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compile_aten(aten_gm, [x_other, w])(x_other, w)
    assert_matches_eager(out, (x_other @ w).relu(), rtol=1e-5, atol=1e-5)


def test_a_failed_compile_leaves_the_autocast_state_as_it_found_it():
    """A trace that stops inside the graph's own ``with torch.autocast(dtype=float16)`` (before its
    _exit_autocast) leaves neither autocast on nor its dtype changed (Dynamo checks its guards on
    the global state right after the backend returns)."""
    dtype, cache = torch.get_autocast_dtype("cpu"), torch.is_autocast_cache_enabled()
    with pytest.raises(RuntimeError, match="a trace that failed"):
        with kept_global_state():
            torch.amp.autocast_mode._enter_autocast("cpu", torch.float16, True, False)
            raise RuntimeError("a trace that failed")
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == dtype and torch.is_autocast_cache_enabled() == cache
    assert autocast_nesting() == 0
    # eager autocast afterwards casts a weight again after an update (its cache was cleared)
    lin, x = nn.Linear(4, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x)
    with torch.no_grad():
        lin.weight.add_(1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = lin(x)
    assert_matches_eager(got.float(), lin(x), atol=0.1, rtol=0.02)


# -- bfloat16/float16 products on the CPU: the library's kernel, or float32 on converted operands ----

def _products(a, b, c, d):
    return (a @ b).relu(), torch.bmm(c, d) * 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["library", "float32", "auto"])
def test_narrow_products_run_as_the_library_or_in_float32(mode, dtype):
    """Both forms accumulate in float32 and round once: eager's values up to the order of the sum
    (one bfloat16 step at most). ``auto`` converts on a CPU without instructions for the dtype."""
    torch.manual_seed(0)
    args = [torch.randn(*s).to(dtype) for s in ((16, 64), (64, 24), (3, 8, 32), (3, 32, 5))]
    with patch(cpu_narrow_gemm=mode):
        compiled = compile_graph(torch.fx.symbolic_trace(_products), args)
    assert_matches_eager(compiled(*args), _products(*args), rtol=1e-2, atol=1e-2)
    wide = [n for n in compiled.aten.gm.graph.nodes if n.op == "call_function"
            and n.target in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default, torch.ops.mkldnn._linear_pointwise.default)
            and n.meta["val"].dtype == torch.float32]
    has_instructions = any(f in cpu_flags() for f in NARROW_FLAGS[dtype])
    assert len(wide) == (2 if mode == "float32" or (mode == "auto" and not has_instructions) else 0), wide
    assert any("cpu: " in line and " mm -> " in line for line in compiled.aten.choices) == (mode == "auto")


@pytest.mark.parametrize("mode", ["library", "float32"])
def test_narrow_convolutions_and_their_backward_run_as_the_library_or_in_float32(mode, fresh_dynamo):
    """bfloat16 convolutions (autocast's) and their backward: eager's values either way (10-50x
    faster in float32 on a CPU without bfloat16 instructions, docs/training.md)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    fn = lambda x: conv(x).float().square().mean()  # noqa: E731
    rec = Recorder()
    with patch(cpu_narrow_gemm=mode):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = torch.compile(fn, backend=rec)(x), fn(x)
        assert_matches_eager(torch.autograd.grad(got, list(conv.parameters())),
                             torch.autograd.grad(want, list(conv.parameters())), **BF16)
    assert_matches_eager(got, want, **BF16)
    convs = [n for n in rec.training[0].joint.graph.graph.nodes if "convolution" in str(n.target)]
    dtypes = {v.dtype for n in convs for v in pytree.tree_leaves(n.meta["val"]) if v is not None}
    assert len(convs) == 2 and dtypes == {torch.float32 if mode == "float32" else torch.bfloat16}, convs


@pytest.mark.parametrize("op", ["linear", "addmm"])
def test_a_narrow_linear_rounds_once_as_eager(op):
    """Eager's bfloat16 linear/addmm adds the bias before its one rounding; mm then add rounded
    29% of these elements differently."""
    torch.manual_seed(0)
    x, w, b = (torch.randn(*s).bfloat16() for s in ((16, 32), (96, 32), (96,)))
    fn = (lambda x, w, b: F.linear(x, w, b)) if op == "linear" else (lambda x, w, b: torch.addmm(b, x, w.t()))
    with patch(cpu_narrow_gemm="float32"):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w, b])
    assert torch.equal(compiled(x, w, b), fn(x, w, b))


def test_a_cast_to_bfloat16_rounds_once_in_the_kernel():
    """Autocast's casts are _to_copy kernels: the cast's rounding, and the rounding of the narrow
    value it stores, were both emitted (mc_round_bf16(mc_round_bf16(x))); one is enough."""
    x = torch.randn(64)
    compiled = compile_graph(torch.fx.symbolic_trace(lambda x: x.bfloat16()), [x])
    assert compiled.kernel_source.count("mc_round_bf16(") == 1, compiled.kernel_source
    assert torch.equal(compiled(x), x.bfloat16())


# -- torch.amp.GradScaler: the scaler's step compiled beside the model ------------------------------

def _scaled_training(model, compile_fn, init_scale: float) -> tuple:
    """Four float16-autocast AdamW steps through a GradScaler, with the model's forward and the
    scaler's ``step`` + ``update`` each passed through ``compile_fn``: losses and the final scale."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    forward = compile_fn(model)

    def step(opt, scaler):
        scaler.step(opt)         # unscales, skips the step where a gradient is inf/nan
        scaler.update()
    step = compile_fn(step)
    losses = []
    for seed in range(4):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
        with torch.autocast("cpu", dtype=torch.float16):
            loss = forward(x).float().square().mean()
        scaler.scale(loss).backward()
        step(opt, scaler)
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), scaler.get_scale()


@pytest.mark.parametrize("init_scale", [2.0 ** 8, 1e12])   # 1e12: float16 gradients overflow, steps skipped
def test_grad_scaler_steps_compile_and_match_eager(init_scale, caplog, fresh_dynamo):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="minicompile"):
        losses, scale = _scaled_training(model, lambda f: torch.compile(f, backend=rec), init_scale)
    want_losses, want_scale = _scaled_training(reference, lambda f: f, init_scale)
    assert scale == want_scale                     # the same steps skipped, the same growth
    assert_matches_eager(losses, want_losses, atol=1e-4, rtol=1e-3)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_matches_eager(p, q, atol=1e-4, rtol=1e-3)
    assert "runs eagerly" not in caplog.text, caplog.text
    assert any(isinstance(g, TrainingGraph) for g in rec.graphs)
    if init_scale < 1e6:   # steps taken: AdamW's update inside scaler.step compiled (Dynamo breaks at its .item())
        assert any(not isinstance(g, TrainingGraph) and hasattr(g, "aten") for g in rec.graphs), rec.graphs
