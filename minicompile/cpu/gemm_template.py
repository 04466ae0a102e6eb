"""Inference: a float32 product of a weight as our packed-weight template (runtime/packed_gemm.py).

Where weights are prepared (cpu/prepare.py: inference, static sizes, MINICOMPILE_PREPARE_WEIGHTS or
``options={"freezing": True}``), ``mm(a, t(W))`` (its bias add fused in) or oneDNN's linear without a
post-op, W from parameters alone, becomes ``packed_mm(a, pack_weight(t(W)), bias, n)``. split_prepared
moves ``pack_weight`` into the prepare graph (computed once per version of W); each call runs AVX2
6x16 tiles over the packed panels, the bias added in their store, ``a`` read in place row- or
column-major (other layouts keep the library). It is timed per shape, layout and thread count
against the library call the trace chose (cpu/timing.py, cached) and kept where ``TEMPLATE_MARGIN``
faster, printed in the ATen graph's header; ``MINICOMPILE_CPU_GEMM=template`` pins it, ``mkl`` or
``onednn`` rule it out. Its OpenMP threads share out the 16-column panels. Without AVX2 and FMA, and
in training graphs (which never prepare weights), the library stays.
"""
from __future__ import annotations

import functools

import torch

from minicompile.cpu.claims import matrix_layout, onednn_can_run, pinned_mode
from minicompile.cpu.prepare import Emitter, prepares_weights, static_nodes
from minicompile.cpu.timing import Decision, choose, cpu_flags, cpu_name, real_tensors, recorded_times
from minicompile.runtime import cache, packed_gemm

aten = torch.ops.aten
_LINEAR = torch.ops.mkldnn._linear_pointwise.default
# the template must win by this much: timed alone, a few percent is the shared machine's noise
TEMPLATE_MARGIN = 0.05
_RUN_FLOPS = 4e7    # each timed run repeats the call up to this much work (as cpu/epilogues.py)


def packed_products(gm: torch.fx.GraphModule, ctx) -> int:
    """The ATen pass: each product measured (or pinned) faster as the template rewritten; how many."""
    mode, pinned = pinned_mode("cpu_gemm", "MINICOMPILE_CPU_GEMM", eager="mkl")
    if mode in ("mkl", "onednn") or not prepares_weights(ctx) or not {"avx2", "fma"} <= cpu_flags():
        return 0
    static = static_nodes(gm, ctx.static)
    rewritten = 0
    for node in list(gm.graph.nodes):
        match = _match(node, static)
        if match is None:
            continue
        decision = Decision("template", pinned) if pinned else _measure(*match)
        if decision.choice == "template":
            _rewrite(gm, *match, ctx.fake_mode, decision)
            rewritten += 1
    if rewritten:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rewritten


def _match(node, static: set):
    """(product, a, weight, bias or None, the node whose value it replaces) or None. ``weight`` is
    W (n x k) for oneDNN's linear, the k x n operand for mm; both from static inputs alone."""
    if node.op != "call_function":
        return None
    if node.target is _LINEAR and tuple(node.args[3:]) == ("none", [], ""):
        a, w, bias = node.args[:3]
        b_val = w.meta["val"].t()
        if bias is not None and not _is_vector(bias, b_val.shape[1]):
            return None
        out = node
    elif node.target is aten.mm.default:
        a, w = node.args
        b_val = w.meta["val"]
        bias, out = _bias_add(node, b_val.shape[1])
    else:
        return None
    a_val = a.meta["val"]
    if w not in static or a in static or not onednn_can_run(a_val, b_val) or matrix_layout(a_val) == "strided":
        return None
    return node, a, w, bias, out


def _bias_add(mm, n: int):
    """(bias, add) when the product's only use is ``add(bias, product)`` with a float32 vector of n."""
    users = list(mm.users)
    add = users[0] if len(users) == 1 else None
    if add is None or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
        return None, mm
    bias = add.args[0] if add.args[1] is mm else add.args[1]
    return (bias, add) if bias is not mm and _is_vector(bias, n) else (None, mm)


def _is_vector(bias, n: int) -> bool:
    val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 1 and val.shape[0] == n and val.dtype == torch.float32 \
        and val.stride() == (1,) and val.device.type == "cpu"


def _measure(product, a, w, bias, out) -> Decision:
    """The template against the library call the trace chose, once per machine, threads and shape."""
    library = "onednn" if product.target is _LINEAR else "mkl"
    (m, k), n = a.meta["val"].shape, product.meta["val"].shape[1]
    what = f"packed mm {m}x{k}x{n} ({matrix_layout(a.meta['val'])} @ weight){' + bias' if bias is not None else ''}"
    reps = max(1, min(50, int(_RUN_FLOPS // (2 * m * n * k))))
    key = cache.digest("packed gemm", torch.__version__, cpu_name(), str(torch.get_num_threads()), what, library,
                       f"{library} unless template {TEMPLATE_MARGIN} faster", f"{reps} calls a run")
    rule = f"{library} kept unless template is {TEMPLATE_MARGIN:.0%} faster; {reps} calls a run"
    measured = lambda choice: Decision(choice, times=recorded_times(key), note=rule)  # noqa: E731
    with real_tensors():
        choice = choose(key, _candidates(library, a.meta["val"], m, k, n, bias is not None, reps), what,
                        prefer=library, margin=TEMPLATE_MARGIN, otherwise=library, line=lambda c: measured(c).line(what))
    return measured(choice or library)


def _candidates(library: str, a_val, m: int, k: int, n: int, has_bias: bool, reps: int) -> dict:
    """The library's call and the template's, on random operands (``a`` laid out as traced)."""
    @functools.cache
    def made():
        a = torch.randn(k, m).t() if matrix_layout(a_val) == "column" else torch.randn(m, k)
        w, bias = torch.randn(n, k), torch.randn(n) if has_bias else None
        return a, w, bias, packed_gemm.pack_weight(w.t()), torch.empty(m, n)

    def product():
        a, w, bias, _, out = made()
        return _LINEAR(a, w, bias, "none", [], "") if library == "onednn" else \
            torch.addmm(bias, a, w.t(), out=out) if has_bias else torch.mm(a, w.t(), out=out)

    def template():
        a, _, bias, packed, out = made()
        return packed_gemm.packed_mm_into(a, packed, bias, n, out)

    def repeated(call):
        return lambda: [call() for _ in range(reps)]
    return {library: repeated(product), "template": repeated(template)}


def _rewrite(gm, product, a, w, bias, out, fake_mode, decision: Decision) -> None:
    g, emit = gm.graph, Emitter(gm.graph, fake_mode)
    n = product.meta["val"].shape[1]     # sizes are static where weights are prepared
    with g.inserting_before(out):
        b = emit(aten.t.default, w) if product.target is _LINEAR else w
        packed = emit(torch.ops.minicompile.pack_weight.default, b)
        node = emit(torch.ops.minicompile.packed_mm.default, a, packed, bias, n)
    why = (f"pinned by {decision.pinned}" if decision.pinned else
           f"measured faster than the library for this shape on this machine ({decision.timings()}; "
           "MINICOMPILE_CPU_GEMM=mkl or onednn keeps the library)")
    node.meta = {**out.meta, "val": node.meta["val"],
                 "extern_reason": f"the packed-weight template{' with its bias' if bias is not None else ''}: {why}"}
    out.replace_all_uses_with(node)
    for old in dict.fromkeys((out, product)):   # out is the product itself where no bias add follows
        if not old.users:
            g.erase_node(old)
