"""Epilogues fused into oneDNN's products (inference): activation and residual add as post-ops.

After the trace a float32 product is a library call (``mkldnn._linear_pointwise`` with its bias
inside, ``aten.mm`` (+ its bias), or ``aten.convolution``) and what follows it is pointwise ATen
that our kernels compute in one more pass over the product. oneDNN applies some of that while the
product is still in registers (its post-ops):

    linear          unary: relu, gelu (erf, "none"), gelu (tanh), silu ("swish"), hardtanh (clamp)
                    ``_linear_pointwise.default(x, W, b, attr, scalars, algorithm)``
                    residual add: ``_linear_pointwise.binary(x, other, W, b, "add")``
    convolution     the same unary ones: ``_convolution_pointwise.default``; residual add, then
                    an optional relu: ``_convolution_pointwise.binary`` (2-d, not transposed)

An epilogue is fused only where its result is the only use of the product (views of the product
in between are kept, after the fused call: an elementwise op commutes with them), where the
residual has the product's shape, dtype and layout, and only for float32 (oneDNN's bfloat16
post-ops need AVX-512 BF16 or AVX-NE-CONVERT; numerics checked in tests/test_epilogues.py:
each post-op differs from eager by float rounding only). The activation is recognised as our
decomposition writes it (decomp/activations.py, traced once into a template).

Whether it pays is measured per shape (cpu/timing.py, cached like the other choices): the fused
call against the product as the graph has it plus one eager pass for the epilogue, which stands
for our fused pointwise kernel. The choice is printed in the ATen graph's header;
``MINICOMPILE_CPU_EPILOGUE`` pins it (``fused``/``separate``). Training graphs never see it:
backend.py compiles their halves with it pinned ``separate``, which makes this pass a no-op.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.config import config
from minicompile.cpu.claims import ONEDNN_MARGIN, onednn_available, onednn_can_run, pinned_mode, size_hint
from minicompile.cpu.prepare import Emitter
from minicompile.cpu.timing import Decision, choose, cpu_name, real_tensors, recorded_times
from minicompile.decomp import activations
from minicompile.runtime import cache

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default)
# our pointwise kernel after the product, as eager computes it in one pass (the timing's stand-in)
_EAGER = {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
          "silu": F.silu}
_ONEDNN = {"relu": ("relu", [], ""), "gelu": ("gelu", [], "none"), "gelu_tanh": ("gelu", [], "tanh"),
           "silu": ("swish", [], "")}
# unary ops oneDNN's convolution applies after its residual add (others: the add only)
_AFTER_ADD = ("relu",)


@dataclass
class Match:
    """One product with an epilogue to fuse: the nodes it replaces and what they compute."""
    kind: str                 # "linear" (oneDNN's already), "mm" (MKL's now), "conv"
    product: torch.fx.Node    # the library call
    bias: tuple               # ("node", b) for mm's bias add: the add node and the bias
    out: torch.fx.Node        # the product's value (its bias added)
    views: list               # views of ``out`` the epilogue reads through
    unary: tuple | None       # (name, attr, scalars, algorithm)
    residual: torch.fx.Node | None
    exit: torch.fx.Node       # the epilogue's result
    region: set               # the epilogue's nodes

    @property
    def name(self) -> str:
        parts = (["add"] if self.residual is not None else []) + ([self.unary[0]] if self.unary else [])
        return "+".join(parts)


def fuse_epilogues(gm: torch.fx.GraphModule, ctx) -> int:
    """The ATen pass: each epilogue that measured (or is pinned) faster fused; returns how many."""
    mode, pinned = pinned_mode("cpu_epilogue", "MINICOMPILE_CPU_EPILOGUE", eager="separate")
    if mode == "separate" or ctx.symbolic or not onednn_available():
        return 0
    fused = 0
    for node in list(gm.graph.nodes):
        if getattr(node, "_erased", False):      # erased by an earlier fusion
            continue
        match = _match(node)
        if match is None:
            continue
        decision = Decision(mode, pinned) if pinned else _measure(match)
        if decision.choice == "fused":
            _rewrite(gm, match, ctx.fake_mode, decision)
            fused += 1
    if fused:
        gm.recompile()
    return fused


# -- matching ---------------------------------------------------------------------------------

def _match(node) -> Match | None:
    kind = _product_kind(node)
    if kind is None:
        return None
    out, bias = node, ()
    if kind == "mm":
        add = _only_user(node)
        if add is not None and add.target is aten.add.Tensor and not add.kwargs and _is_bias(add, node):
            out, bias = add, (add, add.args[0] if add.args[1] is node else add.args[1])
    y, views = out, []
    while (v := _only_user(y)) is not None and v.target in (*_VIEWS, aten.permute.default) and v.args[0] is y:
        views.append(v)
        y = v
    if _bias_after_views(node, kind, bias, views):    # a linear of >2-d input: matmul, then its bias
        add = _only_user(y)
        out, bias, y = node, (add, add.args[0] if add.args[1] is y else add.args[1]), add
    unary = _activation_of(y)
    if unary is not None:
        return Match(kind, node, bias, out, views, unary[0], None, unary[1], unary[2])
    add = _only_user(y)
    if add is None or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
        return None
    residual = add.args[1] if add.args[0] is y else add.args[0]
    if not _residual_fits(residual, y, kind, views):
        return None
    after = _activation_of(add) if kind == "conv" else None
    if after is not None and after[0][0] in _AFTER_ADD:
        return Match(kind, node, bias, out, views, after[0], residual, after[1], {add, *after[2]})
    return Match(kind, node, bias, out, views, None, residual, add, {add})


def _product_kind(node) -> str | None:
    if node.op != "call_function":
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or val.device.type != "cpu":
        return None
    if node.target is torch.ops.mkldnn._linear_pointwise.default and tuple(node.args[3:]) == ("none", [], ""):
        return "linear"
    if node.target is aten.mm.default and pinned_mode("cpu_gemm", "MINICOMPILE_CPU_GEMM", eager="mkl")[0] == "auto":
        a, b = (n.meta.get("val") for n in node.args)
        return "mm" if onednn_can_run(a, b) else None
    if node.target is aten.convolution.default and _conv_fits(node):
        return "conv"
    return None


def _conv_fits(conv) -> bool:
    """A 2-d convolution, not transposed, whose input and weight share a layout (oneDNN's result
    then has the layout aten.convolution's has), every size known."""
    x, w = (conv.args[k].meta.get("val") for k in (0, 1))
    if x.dim() != 4 or conv.args[6] or not all(isinstance(s, int) for s in (*x.shape, *x.stride(), *w.shape)):
        return False
    cl = torch.channels_last
    same = (x.is_contiguous() and w.is_contiguous()) or (x.is_contiguous(memory_format=cl)
                                                         and w.is_contiguous(memory_format=cl))
    return same and w.dtype == torch.float32


def _is_bias(add, y) -> bool:
    """``add`` is ``y`` plus a vector along its last dimension (a linear's bias)."""
    other = add.args[0] if add.args[1] is y else add.args[1]
    val, out = (other.meta.get("val") if isinstance(other, torch.fx.Node) else None), y.meta["val"]
    return isinstance(val, torch.Tensor) and val.dim() == 1 and val.shape[0] == out.shape[-1] and val.dtype == out.dtype \
        and val.stride() == (1,) and other is not y


def _bias_after_views(product, kind: str, bias: tuple, views: list) -> bool:
    """The product has no bias of its own and its views (no permute: the last dimension stays the
    product's columns) are followed by a bias add only."""
    if kind == "conv" or bias or (kind == "linear" and product.args[2] is not None) or not views \
            or any(v.target is aten.permute.default for v in views):
        return False
    add = _only_user(views[-1])
    return add is not None and add.target is aten.add.Tensor and not add.kwargs and len(add.args) == 2 \
        and _is_bias(add, views[-1])


def _residual_fits(residual, y, kind: str, views: list) -> bool:
    """The residual has the product's shape, dtype and strides: oneDNN adds it element by element."""
    r, v = (residual.meta.get("val") if isinstance(residual, torch.fx.Node) else None), y.meta["val"]
    if not isinstance(r, torch.Tensor) or residual is y or r.shape != v.shape or r.dtype != v.dtype:
        return False
    if kind == "conv":
        return not views and r.stride() == v.stride()
    return r.is_contiguous() and v.is_contiguous()


def _only_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _activation_of(y):
    """((name, oneDNN attr, scalars, algorithm), result node, its nodes) when every use of ``y`` is
    inside one activation of ``y`` written as our decomposition writes it, else None. A clamp is
    oneDNN's hardtanh, with its bounds."""
    region, order, node = set(), [], y.next
    for _ in range(64):
        if node.op == "output" or len(order) >= 16:
            break
        inputs = node.all_input_nodes
        if node.op == "call_function" and inputs and all(i is y or i in region for i in inputs):
            region.add(node)
            order.append(node)
        node = node.next
    for exit in order:
        nodes = _ancestors_within(exit, region)
        if not all(u in nodes for u in y.users) or any(u not in nodes for n in nodes - {exit} for u in n.users):
            continue
        if nodes == {exit} and exit.target is aten.clamp.default and len(exit.args) == 3 \
                and all(isinstance(a, (int, float)) for a in exit.args[1:]) and not exit.kwargs:
            return ("hardtanh", "hardtanh", [float(a) for a in exit.args[1:]], ""), exit, nodes
        name = _templates().get(_expr(exit, y))
        if name is not None:
            return (name, *_ONEDNN[name]), exit, nodes
    return None


def _ancestors_within(exit, region: set) -> set:
    seen, stack = set(), [exit]
    while stack:
        n = stack.pop()
        if n in region and n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


_COMMUTATIVE = (aten.add.Tensor, aten.mul.Tensor)
# a number times a tensor is one product whichever overload wrote it (HF's GELU writes ``x * 0.5``,
# which traces as mul.Tensor; our decomposition's mul.Scalar)
_SAME = {aten.mul.Scalar: aten.mul.Tensor, aten.add.Scalar: aten.add.Tensor}


def _expr(a, y) -> str:
    """A node's computation from ``y`` as text, operands of + and * sorted."""
    if a is y:
        return "y"
    if isinstance(a, torch.fx.Node):
        target = _SAME.get(a.target, a.target)
        args = [_expr(x, y) for x in a.args]
        if target in _COMMUTATIVE:
            args.sort()
        kwargs = [f"{k}={_expr(v, y)}" for k, v in sorted(a.kwargs.items())]
        return f"{target}({', '.join(args + kwargs)})"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_expr(x, y) for x in a) + "]"
    return repr(a)


@functools.cache
def _templates() -> dict:
    """Each activation as our decomposition writes it (decomp/activations.py) -> its name."""
    forms = {"relu": aten.relu.default, "gelu": activations.gelu, "silu": activations.silu,
             "gelu_tanh": lambda x: activations.gelu(x, approximate="tanh")}
    out = {}
    with real_tensors():
        for name, fn in forms.items():
            g = make_fx(fn)(torch.empty(4)).graph
            y = next(n for n in g.nodes if n.op == "placeholder")
            result = next(n for n in g.nodes if n.op == "output").args[0]
            out[_expr(result, y)] = name
    return out


# -- measuring ----------------------------------------------------------------------------------

def _measure(m: Match) -> Decision:
    """Fused or separate for this product and epilogue, timed once per machine, threads and shape."""
    shapes = [_shape_text(n) for n in _operands(m)]
    what = f"{m.kind} {' '.join(shapes)} + {m.name}"
    margin = ONEDNN_MARGIN if m.kind == "mm" else EPILOGUE_MARGIN
    reps = _repeats(m)
    key = cache.digest("epilogue", torch.__version__, cpu_name(), str(torch.get_num_threads()), what,
                       f"separate unless fused {margin} faster", f"{reps} calls a run")
    rule = f"separate kept unless fused is {margin:.0%} faster; {reps} calls a run"
    measured = lambda choice: Decision(choice, times=recorded_times(key), note=rule)  # noqa: E731
    with real_tensors():
        choice = choose(key, _candidates(m, reps), what, prefer="separate", margin=margin, otherwise="separate",
                        line=lambda c: measured(c).line(f"epilogue {what}"))
    return measured(choice or "separate")


# fused must win by this much: timed alone on a shared machine the two differ by noise where the
# post-op costs what our kernel costs (oneDNN's erf GELU on AVX2, single-threaded: 1.07-1.62 ms
# against 1.27-1.60 ms for the product and eager's GELU; its tanh GELU 2.0-4.9 ms, ReLU free)
EPILOGUE_MARGIN = 0.05
_RUN_FLOPS = 4e7     # each timed run repeats the call up to this much work (a few ms): short calls
                     # timed once each measured the scheduler more than the post-op


def _repeats(m: Match) -> int:
    x, w = (n.meta["val"] for n in m.product.args[:2])
    out = m.out.meta["val"]
    flops = 2 * out.numel() * (w.shape[1] * w.shape[2] * w.shape[3] if m.kind == "conv" else x.shape[1])
    return max(1, min(50, int(_RUN_FLOPS // max(1, int(flops)))))


def _operands(m: Match) -> list:
    """The product's tensor operands (input, weight, bias), then the residual."""
    args = m.product.args
    tensors = [args[0], args[1]] + ([args[2]] if m.kind != "mm" and args[2] is not None else [])
    if m.bias:
        tensors.append(m.bias[1])   # mm's, or one added after the product's views
    return tensors + ([m.residual] if m.residual is not None else [])


def _shape_text(n) -> str:
    v = n.meta["val"]
    return "x".join(str(size_hint(s)) for s in v.shape) + "/" + ",".join(str(size_hint(s)) for s in v.stride())


def _real(v) -> torch.Tensor:
    size, stride = [size_hint(s) for s in v.shape], [size_hint(s) for s in v.stride()]
    return torch.empty_strided(size, stride, dtype=v.dtype).normal_()


def _candidates(m: Match, reps: int) -> dict:
    """The fused call and the separate pair, on random operands laid out as the traced ones, each
    run ``reps`` times a call."""
    made = functools.cache(lambda: [_real(n.meta["val"]) for n in _operands(m)])
    fused = _fused_call(m, [size_hint(s) for s in m.out.meta["val"].shape])

    def separate():
        ops = made()
        y = _product_call(m)(*ops)
        if m.residual is not None:
            r = ops[-1]
            y = torch.add(y, r.view(y.shape) if m.kind != "conv" else r)
            return torch.relu(y) if m.unary else y
        name = m.unary[0]
        return torch.clamp(y, *m.unary[2]) if name == "hardtanh" else _EAGER[name](y)

    def repeated(call):
        return lambda: [call() for _ in range(reps)]
    return {"fused": repeated(lambda: fused(*made())), "separate": repeated(separate)}


def _product_call(m: Match):
    args = m.product.args
    if m.kind == "conv":
        return lambda x, w, *rest: torch.convolution(x, w, *(rest[:1] if args[2] is not None else [None]), *args[3:])
    if m.kind == "linear":
        return lambda x, w, *rest: torch.ops.mkldnn._linear_pointwise(x, w, rest[0] if args[2] is not None else None,
                                                                     "none", [], "")
    return lambda x, w, *rest: torch.addmm(rest[0], x, w) if m.bias else torch.mm(x, w)


def _fused_call(m: Match, rows_cols: list):
    """The fused oneDNN call as a function of ``_operands(m)`` (an mm's operand is W transposed)."""
    unary = m.unary or ("none", "none", [], "")
    has_bias = (m.kind != "mm" and m.product.args[2] is not None) or bool(m.bias)
    if m.kind == "conv":
        stride, padding, dilation, groups = (m.product.args[k] for k in (3, 4, 5, 8))
        conv = torch.ops.mkldnn._convolution_pointwise
        if m.residual is None:
            return lambda x, w, *rest: conv(x, w, rest[0] if has_bias else None, padding, stride, dilation, groups,
                                            *unary[1:])
        return lambda x, w, *rest: conv.binary(x, rest[-1], w, rest[0] if has_bias else None, padding, stride,
                                               dilation, groups, "add", None, unary[1] if m.unary else None,
                                               unary[2], unary[3] or None)
    linear = torch.ops.mkldnn._linear_pointwise
    weight = (lambda w: w.t()) if m.kind == "mm" else (lambda w: w)
    if m.residual is None:
        return lambda x, w, *rest: linear(x, weight(w), rest[0] if has_bias else None, *unary[1:])
    return lambda x, w, *rest: linear.binary(x, rest[-1].view(rows_cols), weight(w),
                                             rest[0] if has_bias else None, "add")


# -- rewriting ----------------------------------------------------------------------------------

def _rewrite(gm: torch.fx.GraphModule, m: Match, fake_mode, decision: Decision) -> None:
    """The fused call before the epilogue's result, the views after it; the old nodes erased."""
    g, args = gm.graph, m.product.args
    emit = Emitter(g, fake_mode)
    unary = m.unary or ("none", "none", [], "")
    with g.inserting_before(m.exit):
        if m.kind == "conv":
            x, w, b, stride, padding, dilation, _, _, groups = args
            if m.residual is None:
                fused = g.call_function(torch.ops.mkldnn._convolution_pointwise.default,
                                        (x, w, b, padding, stride, dilation, groups, *unary[1:]))
            else:
                fused = g.call_function(torch.ops.mkldnn._convolution_pointwise.binary,
                                        (x, m.residual, w, b, padding, stride, dilation, groups, "add", None,
                                         unary[1] if m.unary else None, unary[2], unary[3] or None))
        else:
            x, w = args[0], (args[1] if m.kind == "linear" else emit(aten.t.default, args[1]))
            b = m.bias[1] if m.bias else args[2] if m.kind == "linear" else None
            if m.residual is None:
                fused = g.call_function(torch.ops.mkldnn._linear_pointwise.default, (x, w, b, *unary[1:]))
            else:
                other = m.residual if not m.views else emit(aten.view.default, m.residual, list(m.out.meta["val"].shape))
                fused = g.call_function(torch.ops.mkldnn._linear_pointwise.binary, (x, other, w, b, "add"))
        fused.meta = {**m.out.meta, "val": m.out.meta["val"], "extern_reason": _reason(m, decision)}
        result = fused
        for v in m.views:
            result = g.call_function(v.target, (result, *v.args[1:]), dict(v.kwargs))
            result.meta = dict(v.meta)
    m.exit.replace_all_uses_with(result)
    position = {n: k for k, n in enumerate(g.nodes)}
    old = {*m.region, *m.views, m.out, m.product} | ({m.bias[0]} if m.bias else set())
    for n in sorted(old, key=position.get, reverse=True):
        if not n.users:
            g.erase_node(n)


def _reason(m: Match, decision: Decision) -> str:
    library = "convolution" if m.kind == "conv" else "linear"
    why = (f"pinned by {decision.pinned}" if decision.pinned else
           f"measured faster than the product and a separate pass ({decision.timings()}; "
           "MINICOMPILE_CPU_EPILOGUE=separate keeps them apart)")
    return f"oneDNN's {library} with {m.name} as its post-op: {why}"
