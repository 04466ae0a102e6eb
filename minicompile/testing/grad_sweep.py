"""The OpInfo sweep's gradient mode: each differentiable OpInfo compiled for training, grads vs eager.

For every OpInfo with float32 CPU support and ``supports_autograd``, the first few float32 CPU
samples (inputs requiring grad, as the OpInfo makes them) are batched into one function, as the
forward sweep does (opinfo_sweep.build_function). That function is the one node of an FX graph,
which goes through the training path of ``torch.compile(..., backend="minicompile")``: the joint
trace (aot/joint.py), the partitioner (config.partitioner) and the training runtime, with the
forward and backward graphs compiled by ``compile_aten``. The compiled and the eager function
then run on copies of the same inputs; their outputs are compared, then the gradients of every
input that requires grad under the same random cotangents (``torch.autograd.grad`` of all
differentiable outputs).

Each op ends in one status (opinfo_sweep's, plus two):

    native         forward and backward graphs have no extern call; outputs and grads match
    partial        some nodes ran as extern ATen calls (reasons recorded); outputs and grads match
    extern         every node ran as an extern call; outputs and grads match
    eager-fallback the training path refuses the graph (aot/joint.TrainingUnsupported, reason
                   recorded) and the backend runs it eagerly; its grads must still match eager's
    mismatch       an output or a gradient differs from eager (a bug: fix it)
    crash          tracing, partitioning, compiling or running raised (a bug: fix it)
    untraceable    make_fx cannot trace the samples to one static graph
    eager-error    eager itself raises on the samples (forward or backward)
    no-samples     no float32 CPU sample has an input that requires grad

Gradients are compared with float32 tolerances a little looser than the forward's (rtol 1e-4,
atol 1e-4: a backward sums products in another order than eager's kernels). Random ops compare
dtype, shape and strides only, for outputs and grads.

The full gradient sweep, writing docs/opinfo-grad-report.md::

    python -m minicompile.testing.grad_sweep --jobs 2 --report docs/opinfo-grad-report.md
"""
from __future__ import annotations

import sys
import time
import traceback

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from minicompile.aot.joint import TrainingUnsupported, trace_joint
from minicompile.aot.partition import partition
from minicompile.aot.runtime import TrainingGraph
from minicompile.backend import compile_training
from minicompile.config import config, patch
from minicompile.cpu import CPU
from minicompile.cpu.timing import measured_first
from minicompile.pipeline import compile_aten
from minicompile.testing import opinfo_sweep as sweep
from minicompile.testing.compare import TOLERANCES, copy_preserving_strides, mismatch

GRAD_TOLERANCES = {**TOLERANCES, torch.float32: (1e-4, 1e-4)}
MODULE = "minicompile.testing.grad_sweep"   # what workers run (__name__ is __main__ under -m)


def grad_ops():
    """The float32 OpInfos whose samples can be differentiated, keyed by name[.variant]."""
    return {k: op for k, op in sweep.float32_ops().items() if op.supports_autograd}


def _grad_samples(op):
    out = []
    for s in op.sample_inputs("cpu", torch.float32, requires_grad=True):
        leaves = [x for x in pytree.tree_leaves((s.input, s.args, s.kwargs)) if isinstance(x, torch.Tensor)]
        if sum(x.numel() for x in leaves) <= sweep.MAX_SAMPLE_NUMEL and any(x.requires_grad for x in leaves):
            out.append(s)
        if len(out) == sweep.MAX_SAMPLES:
            break
    return out


def sweep_grad_op(op, samples=None) -> sweep.OpResult:
    """Compile ``op`` for training on its float32 CPU samples; compare outputs and grads with eager."""
    t0 = time.perf_counter()
    key = sweep.op_key(op)
    try:
        samples = _grad_samples(op) if samples is None else samples
    except Exception as e:  # noqa: BLE001 - an OpInfo's own sample generator failing
        return sweep.OpResult(key, "eager-error", detail=f"sample_inputs raised {sweep._short(e)}")
    if not samples:
        return sweep.OpResult(key, "no-samples")
    result = _sweep_grad_samples(key, *sweep.build_function(op, samples), len(samples))
    if result.status in sweep.BAD and len(samples) > 1:
        for k, s in enumerate(samples):   # name the first sample that fails on its own
            single = _sweep_grad_samples(key, *sweep.build_function(op, [s]), 1)
            if single.status in sweep.BAD:
                result.detail = f"sample {k} ({sweep._describe(s)}): {single.detail}"
                break
    result.seconds = time.perf_counter() - t0
    return result


def graph_of(fn, num_inputs: int) -> torch.fx.GraphModule:
    """An FX graph calling ``fn`` once: the shape of graph Dynamo hands the backend."""
    graph = torch.fx.Graph()
    args = [graph.placeholder(f"x{k}") for k in range(num_inputs)]
    graph.output(graph.call_function(fn, tuple(args)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def run_with_grads(fn, inputs: list, seed: int, cotangent_dtypes=None):
    """``fn`` on fresh copies of ``inputs``: (flat outputs, grads of the inputs requiring grad,
    number of differentiable outputs). Cotangents are rounded to ``cotangent_dtypes`` (default:
    each output's dtype), so a float64 rerun can take exactly the cotangents of a bf16 one."""
    args = [copy_preserving_strides(x) for x in inputs]
    torch.manual_seed(seed)
    with torch.enable_grad():
        outs = pytree.tree_leaves(fn(*args))
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]
    g = torch.Generator().manual_seed(1234)
    dtypes = cotangent_dtypes or [o.dtype for o in diff]
    cotangents = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(dt).to(o.dtype).to(o.device)
                  for o, dt in zip(diff, dtypes)]
    grads = torch.autograd.grad(diff, wrt, cotangents, allow_unused=True) if diff else [None] * len(wrt)
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], list(grads), len(diff)


def compare_training(expected, actual, random: bool, tolerances=None) -> str | None:
    """None when the outputs, the number of differentiable outputs and the grads all match
    (``tolerances``: compare's for outputs and GRAD_TOLERANCES for grads, unless given)."""
    (e_out, e_grads, e_diff), (a_out, a_grads, a_diff) = expected, actual
    found = mismatch(e_out, a_out, values=not random, tolerances=tolerances or TOLERANCES)
    if found:
        return "forward " + found
    if e_diff != a_diff:
        return f"eager has {e_diff} differentiable output(s), compiled {a_diff}"
    for k, (e, a) in enumerate(zip(e_grads, a_grads)):
        if e is None and a is None:
            continue
        if e is None or a is None:   # autograd's None and zeros mean the same gradient
            e, a = (torch.zeros_like(a) if e is None else e), (torch.zeros_like(e) if a is None else a)
        found = mismatch(e, a, values=not random, strides=False, tolerances=tolerances or GRAD_TOLERANCES)
        if found:
            return f"grad of input {k}: {found}"
    return None


def _sweep_grad_samples(key, fn, inputs, num_samples) -> sweep.OpResult:
    res = sweep.OpResult(key, "crash", samples=num_samples)
    try:
        expected = run_with_grads(fn, inputs, 0)
        res.random = mismatch(expected[0], run_with_grads(fn, inputs, 1)[0]) is not None
    except Exception as e:  # noqa: BLE001
        res.status, res.detail = "eager-error", sweep._short(e)
        return res
    try:
        traced = make_fx(fn, tracing_mode="fake")(*[copy_preserving_strides(x).detach() for x in inputs])
    except Exception as e:  # noqa: BLE001
        res.status, res.detail = "untraceable", sweep._short(e)
        return res
    res.random = res.random or any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                                   or sweep._uninitialized(n.target) for n in traced.graph.nodes
                                   if n.op == "call_function")
    unbacked = sweep._data_dependent(traced)
    if unbacked:
        res.status = "untraceable"
        res.detail = f"{unbacked} has a data-dependent shape (Dynamo graph-breaks there; not one static graph)"
        return res
    try:
        with patch(fallback_on_error=False):   # a failed compile is a crash here, not a quiet fallback
            compiled, res.status, res.detail = compile_for_training(graph_of(fn, len(inputs)), inputs)
            actual = run_with_grads(compiled, inputs, 0)
        if isinstance(compiled, TrainingGraph):
            parts = [compiled.forward, compiled.backward]
            res.kernels = sum(p.num_kernels for p in parts if p is not None)
            res.externs = [line for p in parts if p is not None for line in sweep._externs(p)]
            res.externs = list(dict.fromkeys(res.externs))
    except Exception as e:  # noqa: BLE001
        res.status = "crash"
        res.detail = sweep._short(e) + " | " + traceback.format_exc().strip().splitlines()[-3].strip()
        return res
    diff = compare_training(expected, actual, res.random)
    if diff:
        res.status, res.detail = "mismatch", (res.detail + "; " if res.detail else "") + diff
    elif res.status != "eager-fallback":
        res.status = "native" if not res.externs else "extern" if res.kernels == 0 else "partial"
    return res


def compile_for_training(gm, inputs):
    """(callable, status, detail): a TrainingGraph, or the backend's eager fallback and its reason."""
    example = [copy_preserving_strides(x) for x in inputs]
    try:
        joint = measured_first(lambda: trace_joint(gm, example, CPU))   # as the backend traces it
        part = partition(joint, config.partitioner)
        return TrainingGraph(part, joint, compile_aten, example), "compiled", ""
    except TrainingUnsupported as e:
        return compile_training(gm, example, {}), "eager-fallback", f"runs eagerly: {e}"



HEADER = [
    "# OpInfo gradient sweep report",
    "",
    "Every PyTorch OpInfo with float32 CPU samples that supports autograd (torch " + torch.__version__ + "),",
    "compiled by minicompile for training (joint forward/backward trace, partitioner "
    f"`{config.partitioner}`,",
    "compiled forward and backward graphs) and compared with eager: the outputs, then the gradients",
    "of every input that requires grad under the same random cotangents. An eager fallback (the",
    "training path refuses the graph; reason listed) is compared too. Regenerate with:",
    "",
    "    python -m minicompile.testing.grad_sweep --jobs 2 --report docs/opinfo-grad-report.md",
    "",
]


def main(argv=None) -> int:
    return sweep.cli(argv, "Compile every differentiable float32 OpInfo for training and compare grads with eager.",
                     grad_ops, sweep_grad_op, MODULE, HEADER, "opinfo-grad-sweep")


if __name__ == "__main__":
    sys.exit(main())
