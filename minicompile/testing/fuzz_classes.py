"""The fuzzer aimed at issue 23's bug classes: each class grows programs around the construct
that broke, with the fuzzer's generator, comparison and shrinking (testing/fuzz.py)::

    layout     as_strided / as_strided_scatter / view / unfold over intermediates whose layout
               our passes choose (convolutions, pads, permutes, strided slices), channels-last
    random     dropout, bernoulli, rand_like, ... on transposed, permuted, strided intermediates
    attention  scaled_dot_product_attention with fewer key/value heads than query heads, masks,
               packed (B, L, H*D) projections; CPU attention choice auto/math/flash
    unbacked   nonzero, boolean masks, masked_select and .item() sizes feeding views, cat,
               scatter and reductions (torch.compile with capture_scalar_outputs /
               capture_dynamic_output_shape_ops); one build called at three inputs
    text       the fuzzer's programs written to a module file with backslash continuations,
               ``*/``, trigraph-like ``??=``, quotes, non-ASCII, very long names and lines
    convbn     conv / norm / activation stacks trained channels-last, judged against float64
    concat     torch.cat / torch.stack of values and slices among the fuzzer's ops, read whole or sliced
    gather     embedding / index_select / x[idx] at indices from memory, out of range at some calls (fuzz_gather.py)

(docs/testing.md has each class.) Training or not, and the attention form, come from a program's
seed, a shrunk program keeps them; a batch compiles one graph per (training, form) group. With ``MINICOMPILE_FALLBACK=0``::

    python -m minicompile.testing.fuzz_classes --class layout --seed 0 -n 2000 --batch 32
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import sys
import tempfile
from dataclasses import dataclass, replace

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.backend import minicompile_backend
from minicompile.config import patch
from minicompile.pipeline import compile_graph
from minicompile.testing import fuzz, fuzz_convbn, fuzz_gather
from minicompile.testing.compare import copy_preserving_strides, mismatch
from minicompile.testing.fuzz import Input, Program, Value
from minicompile.testing.fuzz_train import CLASS_REPRO_TEMPLATE, batched_programs, check_inputs, training_inputs
from minicompile.testing.grad_sweep import compare_training, run_with_grads

CALLS, ATTENTION_FORMS = 3, ["auto", "math", "flash"]   # the unbacked class: inputs of seeds seed, +1009, +2018


@dataclass
class ClassProgram(Program):
    kind: str = "layout"
    train: bool = False
    mode: str = ""        # the attention class's MINICOMPILE_CPU_ATTENTION

    def function(self):
        return (_load_module if self.kind == "text" else _exec)(self.function_source())

    def function_source(self, name="program") -> str:
        src = super().function_source(name)
        return decorate(src, self.seed) if self.kind == "text" else src

    def reproducer(self, message: str = "", template: str = "") -> str:
        inputs = ",\n        ".join(i.source().replace(f"seed={i.seed})", f"seed={i.seed} + 1009 * k)")
                                    for i in self.inputs)
        call = f"check_function({self.kind!r}, program, inputs, train={self.train}, mode={self.mode!r})"
        return CLASS_REPRO_TEMPLATE.format(
            what="bug-class", module="fuzz_classes", call=call, inputs=inputs, program=self.function_source(),
            message="\n".join(f"# {line}" for line in message.splitlines()), make_input=fuzz.MAKE_INPUT_SOURCE)

    def inputs_at(self, k: int) -> list:
        return [fuzz.to_device(fuzz.make_input(i.shape, i.dtype, i.layout, seed=i.seed + 1009 * k), fuzz.DEVICE)
                for i in self.inputs]




def _exec(source: str):
    exec(source, ns := {"torch": torch})  # noqa: S102 - our own generated program
    return ns["program"]


_MODULE_DIR = tempfile.mkdtemp(prefix="minicompile-fuzz-text-")


def _load_module(source: str):
    """``program`` from a module file (a non-ASCII file name): tracebacks and Dynamo quote its lines."""
    name = f"fuzz_m\u00f6dule_{abs(hash(source)) % 10**12}"
    path = os.path.join(_MODULE_DIR, name + ".py")
    with open(path, "w", encoding="utf-8") as f:
        f.write("import torch\n\n\n" + source + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module        # Dynamo looks a function's module up by name
    spec.loader.exec_module(module)
    return module.program


# -- class 1: layout-sensitive ops over intermediates -------------------------------------------

def layout_inputs(rng, seed, dtypes):
    """An image batch and convolution weights: a full one, a depthwise one, a 1x1 one."""
    n, c, c2 = rng.choice([1, 2]), rng.choice([2, 3, 4, 8]), rng.choice([2, 4, 5, 8])
    h, w = rng.randint(3, 9), rng.randint(3, 9)
    dt = torch.float64 if rng.random() < 0.1 else torch.float32
    k = rng.choice([1, 3])
    return [Input((n, c, h, w), dt, rng.choice(["contiguous", "contiguous", "strided", "offset"]), seed * 7),
            Input((c2, c, k, k), dt, "contiguous", seed * 7 + 1),
            Input((c2, 1, 3, 3), dt, "contiguous", seed * 7 + 2),
            Input((rng.choice([3, 4, 6]), c2, 1, 1), dt, "contiguous", seed * 7 + 3)]


def _images(vals):
    return [v for v in fuzz._floats(vals) if v.tensor.dim() == 4 and v.name not in ("v1", "v2", "v3")]


def op_conv(rng, vals):
    v = rng.choice(_images(vals) or [None])
    if v is None:
        return None
    c = v.tensor.shape[1]
    weights = [(w, 1) for w in vals[1:4] if w.tensor.shape[1] == c] + \
              [(w, c) for w in vals[1:4] if w.tensor.shape[1] == 1 and w.tensor.shape[0] == c]
    if not weights:
        return None
    w, groups = rng.choice(weights)
    pad, stride = rng.choice([0, 1]), rng.choice([1, 1, 2])
    return f"torch.nn.functional.conv2d({v.name}, {w.name}, padding={pad}, stride={stride}, groups={groups})"


def op_pad(rng, vals):
    v = rng.choice(_images(vals) or [None])
    if v is None:
        return None
    pads = [rng.randint(0, 2) for _ in range(4)]
    mode = rng.choice(["", "", ", mode='reflect'", ", mode='replicate'"])
    return f"torch.nn.functional.pad({v.name}, {pads}{mode})"


def op_relayout(rng, vals):
    v = rng.choice(_images(vals) or [None])
    if v is None:
        return None
    return rng.choice([f"{v.name}.permute(0, 2, 3, 1)", f"{v.name}.transpose(1, 3)", f"{v.name}[:, :, ::2]",
                       f"{v.name}[:, 1:]", f"{v.name}[..., 1:]", f"{v.name}.contiguous(memory_format=torch.channels_last)",
                       f"torch.relu({v.name}) + {v.name}", f"torch.nn.functional.max_pool2d({v.name}, 2)",
                       f"{v.name}.mean((2, 3), keepdim=True) * {v.name}"])


def _storage_size(t) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _intermediates(vals):
    """Values whose storage no input shares: what reads their storage reads what the graph computed."""
    inputs = {v.tensor.untyped_storage().data_ptr() for v in vals if v.is_input}
    return [v for v in vals if not v.is_input and v.tensor.dtype in fuzz.FLOATS and v.tensor.numel()
            and v.tensor.untyped_storage().data_ptr() not in inputs]


def _window(rng, t):
    """(size, stride, offset) of a random in-bounds window over ``t``'s storage."""
    total = _storage_size(t)
    size = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
    stride = [rng.choice([0, 1, 2, 3, 5, rng.randint(1, total)] + [s for s in t.stride() if s > 0])
              for _ in size]
    while sum((n - 1) * s for n, s in zip(size, stride)) >= total:
        k = rng.randrange(len(size))
        size[k], stride[k] = max(1, size[k] - 1), stride[k] // 2
    span = sum((n - 1) * s for n, s in zip(size, stride)) + 1
    return tuple(size), tuple(stride), rng.randrange(total - span + 1)


def op_storage_read(rng, vals):
    candidates = _intermediates(vals)
    if not candidates:
        return None
    v = candidates[-1] if rng.random() < 0.5 else rng.choice(candidates)   # mostly the latest value
    size, stride, offset = _window(rng, v.tensor)
    kind = rng.choice(["as_strided", "as_strided", "as_strided_default", "method", "scatter", "view", "unfold"])
    if kind == "as_strided":
        return f"torch.as_strided({v.name}, {size}, {stride}, {offset})"
    if kind == "as_strided_default":     # the view's own storage offset
        return f"torch.as_strided({v.name}, {size}, {stride})"
    if kind == "method":
        return f"{v.name}.as_strided({size}, {stride}, {offset}) * 2"
    if kind == "scatter" and v.tensor.is_contiguous():   # eager's backward takes contiguous inputs only
        n = 1
        for s in size:
            n *= s
        src = rng.choice([f"torch.linspace(-1, 1, {n}, dtype={v.tensor.dtype}).view({size})",
                          f"{v.name}.reshape(-1)[:{n}].view({size}).sin()" if v.tensor.numel() >= n else "None"])
        return None if src == "None" else f"torch.as_strided_scatter({v.name}, {src}, {size}, {stride}, {offset})"
    if kind == "view":
        return f"{v.name}.view(-1)" if rng.random() < 0.5 else f"{v.name}.view({v.tensor.shape[0]}, -1)"
    d = rng.randrange(v.tensor.dim()) if v.tensor.dim() else 0
    return f"{v.name}.unfold({d}, {rng.randint(1, 3)}, {rng.randint(1, 2)})" if v.tensor.dim() else None


LAYOUT_OPS = [(op_conv, 4), (op_pad, 2), (op_relayout, 3), (op_storage_read, 5), (fuzz.op_unary, 1),
              (fuzz.op_binary, 1)]


# -- class 2: random ops on non-contiguous intermediates --------------------------------------------

RANDOM_OPS = ["torch.nn.functional.dropout({0}, {p}, True)", "torch.bernoulli(torch.sigmoid({0}))",
              "torch.bernoulli({0}, p={p})", "torch.rand_like({0})", "torch.randn_like({0}) * {0}",
              "torch.empty_like({0}).uniform_(-1, 1)", "torch.empty_like({0}).normal_(0, 2)",
              "torch.empty_like({0}).bernoulli_({p})", "torch.nn.functional.alpha_dropout({0}, {p}, True)",
              "torch.nn.functional.dropout({0} * 2, {p}, True) + {0}", "torch.rand({0}.shape, device={0}.device) + {0}",
              "torch.randint_like({0}, 0, 7)"]
# Not rrelu(training=True): on a non-contiguous input eager returns a contiguous result where the
# fake kernel says input-like strides, and we keep the fake's (an xfail in tests/test_fuzz_classes.py)


def op_noncontiguous(rng, vals):
    v = rng.choice(fuzz._floats(vals) or [None])
    if v is None or v.tensor.dim() < 2:
        return None
    n = v.tensor.dim()
    perm = list(range(n))
    rng.shuffle(perm)
    return rng.choice([f"{v.name}.t()" if n == 2 else f"{v.name}.transpose(0, {n - 1})",
                       f"{v.name}.permute({', '.join(map(str, perm))})", f"{v.name}[..., ::2]",
                       f"{v.name}.transpose(-1, -2) * 2", f"{v.name}[1:]", f"torch.sin({v.name}.transpose(0, 1))"])


def op_random(rng, vals):
    fl = fuzz._floats(vals)
    strided = [v for v in fl if not v.tensor.is_contiguous()] or fl
    v = rng.choice(strided or [None])
    if v is None:
        return None
    return rng.choice(RANDOM_OPS).format(v.name, p=rng.choice([0.2, 0.5, 0.7]))


NONCONTIGUOUS_OPS = [(op_noncontiguous, 4), (op_random, 5), (fuzz.op_unary, 2), (fuzz.op_binary, 2),
                     (fuzz.op_reduce, 1)]


def random_inputs(rng, seed, dtypes):
    shape = tuple(rng.randint(2, 8) for _ in range(rng.choice([2, 2, 3, 4])))
    layouts = ["contiguous", "transposed", "strided", "offset"]
    return [Input(shape, rng.choice([torch.float32] * 4 + [torch.float64]), rng.choice(layouts), seed * 7 + k)
            for k in range(rng.randint(1, 2))]


# -- class 3: grouped-head attention --------------------------------------------------------------

def generate_attention(seed: int) -> ClassProgram:
    rng = random.Random(seed)
    b, lq, s = rng.choice([1, 2]), rng.randint(1, 9), rng.randint(1, 9)
    kv = rng.choice([1, 1, 2, 3])
    hq, d, dv = kv * rng.choice([1, 2, 4]), rng.choice([4, 8, 16]), rng.choice([4, 8, 16])
    dt = torch.float64 if rng.random() < 0.1 else torch.float32
    packed = rng.random() < 0.4
    inputs = [Input((b, lq, hq * d) if packed else (b, hq, lq, d), dt, "contiguous", seed * 7),
              Input((b, s, kv * d) if packed else (b, kv, s, d), dt, "contiguous", seed * 7 + 1),
              Input((b, s, kv * dv) if packed else (b, kv, s, dv), dt, rng.choice(["contiguous", "offset"]),
                    seed * 7 + 2)]
    steps = []
    names = ["v0", "v1", "v2"]
    if packed:
        for k, (h, e) in enumerate([(hq, d), (kv, d), (kv, dv)]):
            steps.append(f"v{3 + k} = v{k}.view({b}, {lq if k == 0 else s}, {h}, {e}).transpose(1, 2)")
        names = ["v3", "v4", "v5"]
    mask_kind = rng.choice([None, None, "causal", "bool", "bool_2d", "float", "float_heads"])
    mask = "None"
    if mask_kind in ("bool", "bool_2d", "float", "float_heads"):
        shape = {"bool": (b, 1, lq, s), "bool_2d": (lq, s), "float": (b, 1, lq, s), "float_heads": (1, hq, lq, s)}
        inputs.append(Input(shape[mask_kind], torch.bool if mask_kind.startswith("bool") else dt,
                            rng.choice(["contiguous", "expanded"]), seed * 7 + 3))
        mask = f"v{len(inputs) - 1}"
        steps = [re.sub(r"\bv(\d+)\b", lambda m: f"v{int(m.group(1)) + 1}" if int(m.group(1)) >= 3 else m.group(0), st)
                 for st in steps]
        names = [re.sub(r"\bv(\d+)\b", lambda m: f"v{int(m.group(1)) + 1}" if int(m.group(1)) >= 3 else m.group(0), n)
                 for n in names]
    q, k, v = names
    sharing = rng.choice(["enable_gqa", "enable_gqa", "repeat_interleave", "expand"]) if kv < hq else "none"
    nxt = len(inputs) + len(steps)
    if sharing == "repeat_interleave":
        steps += [f"v{nxt} = {k}.repeat_interleave({hq // kv}, 1)", f"v{nxt + 1} = {v}.repeat_interleave({hq // kv}, 1)"]
        k, v, nxt = f"v{nxt}", f"v{nxt + 1}", nxt + 2
    elif sharing == "expand":
        steps += [f"v{nxt} = {k}[:, :, None].expand({b}, {kv}, {hq // kv}, {s}, {d}).reshape({b}, {hq}, {s}, {d})",
                  f"v{nxt + 1} = {v}[:, :, None].expand({b}, {kv}, {hq // kv}, {s}, {dv}).reshape({b}, {hq}, {s}, {dv})"]
        k, v, nxt = f"v{nxt}", f"v{nxt + 1}", nxt + 2
    scale = rng.choice(["", "", ", scale=0.3"])
    dropout = ", dropout_p=0.3" if rng.random() < 0.1 else ""
    steps.append(f"v{nxt} = torch.nn.functional.scaled_dot_product_attention({q}, {k}, {v}, attn_mask={mask}"
                 f"{dropout}, is_causal={mask_kind == 'causal'}{scale}, enable_gqa={sharing == 'enable_gqa'})")
    out = f"v{nxt}"
    if rng.random() < 0.5:
        steps.append(f"v{nxt + 1} = {out}.transpose(1, 2).reshape({b}, {lq}, {hq * dv}) * 2")
        out = f"v{nxt + 1}"
    train = (seed // 32) % 2 == 1
    mode = ATTENTION_FORMS[(seed // 64) % 3]
    return ClassProgram(inputs, steps, [out], seed, kind="attention", train=train, mode=mode)


# -- class 4: data-dependent (unbacked) sizes -------------------------------------------------------

UNBACKED_PRODUCERS = ["{0}[{0} > 0]", "torch.masked_select({0}, {0} < 0.3)", "torch.nonzero({0} > 0)",
                      "{0}[torch.nonzero({0}.sum(-1) > 0)[:, 0]]", "{0}.flatten()[({0}.flatten() > 0).nonzero()[:, 0]]",
                      "torch.zeros(({0} > 0).sum().item(), device={0}.device) + {0}.sum()",
                      "torch.arange(({0} > 0.5).sum().item(), device={0}.device) * {0}.mean()",
                      "{0}.scatter(-1, ({0}.abs() * 0).long(), {0}.amax().item())",
                      "{0}.reshape(-1)[:({0} > 0).sum().item()]",
                      "torch.zeros({0}.shape[0], device={0}.device).index_add(0, torch.nonzero({0}.reshape({0}.shape[0], -1)[:, 0] > 0)[:, 0],"
                      " torch.ones(({0}.reshape({0}.shape[0], -1)[:, 0] > 0).sum().item(), device={0}.device))",
                      "{0} * ({0} > 0).sum().item() + {0}.max().item()"]
UNBACKED_CONSUMERS = ["{0}.sin() * 2 + 1", "{0}.sum()", "{0}.mean()", "torch.cat([{0}, {0}.cos()])",
                      "torch.cat([{0}.reshape(-1), {0}.reshape(-1) * 3])", "{0}.view(-1, 1) * 2",
                      "{0}.reshape(-1).cumsum(0)", "torch.softmax({0}.reshape(-1), 0)",
                      "{0}.unsqueeze(0).expand(2, *{0}.shape)", "{0}.float().exp()", "{0}.flip(0)",
                      "({0} - {0}.float().mean()).abs() + 0.75", "torch.nn.functional.pad({0}, [1, 2])"]
# (+ 0.75: x - mean is zero up to rounding where x is constant or symmetric (a row of zeros plus a sum,
# an arange's middle), and a later size (v > 0).sum() or (v > 0.5).sum() would count rounding noise,
# different in eager's reduction and ours: unbacked seeds 300462, 301368; 0.75 is above every threshold)


def op_unbacked(rng, vals):
    v = rng.choice([v for v in vals if v.tensor.dtype == torch.float32 and v.tensor.dim() >= 1 and v.tensor.numel()]
                   or [None])
    return None if v is None else rng.choice(UNBACKED_PRODUCERS).format(v.name)


def op_consume(rng, vals):
    v = rng.choice([v for v in vals if not v.is_input] or vals)
    return rng.choice(UNBACKED_CONSUMERS).format(v.name)


UNBACKED_OPS = [(op_unbacked, 4), (op_consume, 4), (fuzz.op_unary, 1), (fuzz.op_binary, 1)]


def unbacked_inputs(rng, seed, dtypes):
    shape = tuple(rng.randint(2, 7) for _ in range(rng.choice([1, 2, 2, 3])))
    return [Input(shape, torch.float32, rng.choice(["contiguous", "transposed", "strided"]), seed * 7 + k)
            for k in range(rng.randint(1, 2))]


# -- class 5: user source text --------------------------------------------------------------------

NASTY_COMMENTS = ["# */ closes, /* opens", "# a trailing backslash \\", "# ??= ??/ ??' trigraphs ??!", "# caf\u00e9 \u2615 \u03c0",
                  "# quotes ''' \"\"\" ' \"", "# \\\\ two backslashes \\", "# tab\there", "# line\u2028separator",
                  "# */ /* */ ??/", "# \u0645\u0631\u062d\u0628\u0627 \u4f60\u597d"]


def decorate(source: str, seed: int) -> str:
    """``source`` with hard-to-quote text: comments, continuations, long lines, non-ASCII and long names."""
    rng = random.Random(seed ^ 0x5EED)
    stem = rng.choice(["v\u00e9", "\u00fcber_", "v_" + "long" * rng.randint(10, 40) + "_", "\u03b4\u03b5\u03bb\u03c4\u03b1_", "v"])
    src = re.sub(r"\bv(\d+)\b", lambda m: f"{stem}{m.group(1)}", source)
    lines = src.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        r = rng.random()
        if r < 0.3 and " = " in line:
            lhs, rhs = line.split(" = ", 1)
            line = f"{lhs} = \\\n        {rhs}"
        elif r < 0.4 and line.rstrip().endswith(")") and "(" in line:
            cut = line.index("(") + 1
            line = f"{line[:cut]}  \\\n            {line[cut:]}"
        if rng.random() < 0.5:
            line += "  " + rng.choice(NASTY_COMMENTS) + (" x" * rng.randint(100, 200) if rng.random() < 0.2 else "")
        if rng.random() < 0.15:
            out.append("    _text = len('*/ caf\u00e9 \\\\ ??= \"\"\"')  # a string the program reads: \\")
            line = line.replace("return (", "return (_text * 0 + ", 1) if "return (" in line else line
        out.append(line)
    return "\n".join(out)


def generate_for(kind: str):
    def make(seed: int) -> ClassProgram:
        if kind == "attention":
            return generate_attention(seed)
        train = (seed // 32) % 2 == 1 and kind != "unbacked"
        # training: float32/float64 (bf16 gradient noise needs fuzz_train's float64 second opinion)
        dtypes = [torch.float32, torch.float32, torch.float64] if train else fuzz.FIRST_DTYPES
        args = {"layout": dict(ops=LAYOUT_OPS, make_inputs=layout_inputs, max_steps=7),
                "random": dict(ops=NONCONTIGUOUS_OPS, make_inputs=random_inputs, max_steps=6),
                "unbacked": dict(ops=UNBACKED_OPS, make_inputs=unbacked_inputs, max_steps=5),
                "text": dict(dtypes=dtypes), "concat": dict(ops=fuzz.CONCAT_OPS, max_steps=7, dtypes=dtypes)}[kind]
        prog = fuzz.generate(seed, **args)
        prog = ClassProgram(prog.inputs, prog.steps, prog.outputs, seed, kind=kind, train=train)
        return prog if not train or _eager_trains(prog) else replace(prog, train=False)
    return {"convbn": fuzz_convbn.generate, "gather": fuzz_gather.generate}.get(kind, make)


def _eager_trains(prog: ClassProgram) -> bool:
    """Whether eager runs ``prog``'s backward (as_strided_scatter's wants contiguous inputs)."""
    try:
        run_with_grads(_cloned_outputs(prog.function()), training_inputs(prog.make_inputs()), 0)
        return True
    except RuntimeError:
        return False


# -- compiling and comparing -----------------------------------------------------------------------

def _cloned_outputs(fn):
    """``fn`` with its outputs cloned: an output viewing an input would send training to eager."""
    def cloned(*args):
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in fn(*args))
    return cloned


def _crash(e: Exception) -> str:
    return f"crash: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def _check_traced(fn, flat, train, tolerances) -> str | None:
    """make_fx + compile_graph (inference) or the training path, both seeded alike before each run."""
    if train:
        return check_inputs(fn, flat, tolerances)
    torch.manual_seed(0)
    expected = fn(*[copy_preserving_strides(t) for t in flat])
    try:
        gm = make_fx(fn, tracing_mode="fake")(*[copy_preserving_strides(t) for t in flat])
        compiled = compile_graph(gm, [copy_preserving_strides(t) for t in flat])
        torch.manual_seed(0)
        actual = compiled(*[copy_preserving_strides(t) for t in flat])
    except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
        return _crash(e)
    return mismatch(expected, actual, tolerances=tolerances)


STATS = {"dynamo graphs": 0, "calls": 0, "calls skipped (eager rejects the data)": 0,
         "calls failing torch's run-time check (Dynamo's graph too)": 0,
         "programs rechecked alone (their batch failed torch's check)": 0}
UNCHECKED: list = []             # calls a batch could not compare: torch's own check failed there


def _check_dynamo(fn, inputs_at, calls, train, tolerances) -> str | None:
    """torch.compile(backend=minicompile) once, called at ``inputs_at(k)`` for k < ``calls``."""
    def counting(gm, example_inputs):
        STATS["dynamo graphs"] += 1
        return minicompile_backend(gm, example_inputs)
    torch._dynamo.reset()
    fn = _cloned_outputs(fn)     # inside the compiled region, as the training fuzzer does
    compiled = torch.compile(fn, backend=counting)
    checks = []                  # calls where a run-time check torch made while tracing failed
    try:
        for k in range(calls):
            flat = inputs_at(k)
            try:
                expected = run_with_grads(fn, training_inputs(flat) if train else flat, 0)
            except Exception:  # noqa: BLE001 - other data, a size eager rejects (an empty max)
                STATS["calls skipped (eager rejects the data)"] += 1
                continue
            STATS["calls"] += 1
            try:
                actual = run_with_grads(compiled, training_inputs(flat) if train else flat, 0)
            except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
                if "Runtime assertion failed" in str(e):
                    checks.append((k, _crash(e)))
                    continue
                return f"at call {k}: " + _crash(e)
            found = compare_training(expected, actual, random=False, tolerances=tolerances)
            if found:
                return f"at call {k}: {found}"
        for k, crash in checks:
            if not _torch_check_fails(fn, inputs_at, k, train):
                return f"at call {k}: {crash} (Dynamo's graph runs it)"
            STATS["calls failing torch's run-time check (Dynamo's graph too)"] += 1
            UNCHECKED.append(k)
    finally:
        torch._dynamo.reset()
    return None


def _torch_check_fails(fn, inputs_at, k, train) -> bool:
    """Whether the graph Dynamo captures, run as it is (backend "eager"), raises at call ``k`` too:
    broadcasting a size from data against a size n, torch assumes it is not 1 and checks it is n
    when the graph runs (Inductor raises there too); data where it is 1 runs in eager. (aot_eager
    is no judge: its trace folds the check away, and eager's ops broadcast the 1.)"""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    for j in range(k + 1):
        flat = inputs_at(j)
        try:
            run_with_grads(compiled, training_inputs(flat) if train else flat, 0)
        except RuntimeError as e:
            if j == k:
                return "Runtime assertion failed" in str(e)
    return False


def check_function(kind: str, fn, inputs_at, train: bool = False, mode: str = "", tolerances=None,
                   calls: int = CALLS) -> str | None:
    """``fn`` (returning a tuple) of ``inputs_at(k)`` compiled as class ``kind`` compiles it; None if
    it matches eager. The unbacked class calls one build at ``calls`` inputs."""
    floor = fuzz._precision_floor(inputs_at(0))
    tolerances = tolerances or fuzz._tolerances(floor)
    with patch(fallback_on_error=False, conv_layout="channels_last", cpu_attention=mode or "math"):
        if kind == "unbacked":
            with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True), \
                    torch.no_grad():
                return _check_dynamo(fn, inputs_at, calls, False, tolerances)
        if kind == "text" or (kind == "layout" and train):
            # layout: the check that keeps eager's layout under a storage reader looks at the
            # captured graph's nodes (aot/layout_readers.py), which a single opaque call hides
            return _check_dynamo(fn, inputs_at, 1, train, tolerances)
        return _check_traced(fn, inputs_at(0), train, tolerances)


def check_batch(programs: list) -> str | None:
    """Each (training, attention form) group of ``programs`` compiled as one graph. An unbacked
    program that eager rejects at another call's data (the max of an empty selection) goes to a
    group called once: in the batch it would skip that call for all the others."""
    groups: dict = {}
    for p in programs:
        calls = CALLS if p.kind != "unbacked" or _eager_accepts(p) else 1
        groups.setdefault((p.kind, p.train, p.mode, calls), []).append(p)
    for (kind, train, mode, calls), group in groups.items():
        found = _check_group(kind, group, train, mode, calls)
        if found:
            return found
    return None


def _check_group(kind, group, train, mode, calls) -> str | None:
    """``group`` as one graph; where torch's own check failed at a call (one program's selection
    of 1 where torch assumed n), none was compared there, so each program is checked alone."""
    fn = batched_programs([p.function() for p in group], [len(p.inputs) for p in group])
    UNCHECKED.clear()
    found = check_function(kind, fn, lambda k: [t for p in group for t in p.inputs_at(k)], train, mode,
                           calls=calls)
    if found or not UNCHECKED or len(group) == 1:
        return found
    STATS["programs rechecked alone (their batch failed torch's check)"] += len(group)
    return next(filter(None, (_check_group(kind, [p], train, mode, calls) for p in group)), None)


def _eager_accepts(p: ClassProgram) -> bool:
    """Whether eager runs ``p`` at every call's inputs."""
    fn = p.function()
    try:
        with torch.no_grad():
            for k in range(CALLS):
                fn(*p.inputs_at(k))
        return True
    except Exception:  # noqa: BLE001 - eager's error on other data
        return False


KINDS = ["layout", "random", "attention", "unbacked", "text", "convbn", "concat", "gather"]


def run(kind: str, seed: int, n: int, batch: int = 32, repro_dir: str = "fuzz-repros", log=print) -> list:
    """Fuzz ``n`` programs of class ``kind`` from ``seed``; returns the reproducers written for failures."""
    if kind in ("convbn", "gather"):   # whole models judged against float64; gathers at three inputs
        return {"convbn": fuzz_convbn, "gather": fuzz_gather}[kind].run(seed, n, batch, repro_dir, log)
    failures = fuzz.run(seed, n, batch, repro_dir, log, make=generate_for(kind), check=check_batch)
    if kind in ("unbacked", "text"):
        log(f"[fuzz --class {kind}] " + ", ".join(f"{k}: {v}" for k, v in STATS.items()))
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Fuzz minicompile on issue 23's bug classes, compared with eager.")
    p.add_argument("--class", dest="kind", choices=KINDS, required=True, help="the bug class")
    p.add_argument("--seed", type=int, default=0, help="first program's seed (program k uses seed+k)")
    p.add_argument("-n", type=int, default=200, help="number of programs")
    p.add_argument("--batch", type=int, default=32, help="programs compiled together (per training/form group)")
    p.add_argument("--repro-dir", default="fuzz-repros", help="where minimal reproducers are written")
    p.add_argument("--show", type=int, help="print program SEED as a standalone file and exit")
    fuzz.add_device_argument(p)
    args = p.parse_args(argv)
    fuzz.use_device(args.device)
    if args.show is not None:
        print(generate_for(args.kind)(args.show).reproducer(f"{args.kind} fuzzer seed {args.show}"))
        return 0
    return 1 if run(args.kind, args.seed, args.n, args.batch, args.repro_dir) else 0


if __name__ == "__main__":
    sys.exit(main())
