"""A seeded random-program fuzzer: programs run eagerly and compiled must agree.

A program is a straight-line DAG of tensor ops (pointwise, reductions, views, broadcasting,
matmul, normalization, casts) over random inputs: random shapes with size-1 and size-0
dimensions, non-contiguous layouts (transposed, strided slices, offsets, expanded), and
dtypes float32, float64, bfloat16, int64 and bool. It is built by trying random ops on eager
values and keeping the ones eager accepts, so every program is valid eager code. A program
prints as a standalone Python file (the reproducer).

Several programs are compiled as one graph to share a C++ build; a batch that disagrees with
eager is split to find the failing programs, and each is shrunk (outputs, then steps, then
input layouts) to a minimal reproducer written under ``--repro-dir``::

    python -m minicompile.testing.fuzz --seed 0 -n 10000
"""
from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field, replace

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.pipeline import compile_graph
from minicompile.testing import compare
from minicompile.testing.compare import copy_preserving_strides, mismatch, to_device

FLOATS = [torch.float32, torch.float64, torch.bfloat16]
DTYPES = FLOATS + [torch.int64, torch.bool]
LAYOUTS = ["contiguous", "transposed", "strided", "offset", "expanded"]
# Where programs' inputs live (``--device``): inputs are made on the CPU from their seeds, so a
# program is the same on every device, then moved with their layouts kept.
DEVICE = "cpu"
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-9, 1e-9), torch.bfloat16: (5e-2, 5e-2)}


@dataclass
class Input:
    shape: tuple
    dtype: torch.dtype
    layout: str
    seed: int

    def source(self) -> str:
        return f"make_input({self.shape}, {self.dtype}, {self.layout!r}, seed={self.seed})"


@dataclass
class Program:
    inputs: list                       # Input
    steps: list                        # "v3 = torch.add(v0, v1)" (value k is named vk)
    outputs: list                      # value names returned
    seed: int = 0

    def function_source(self, name="program") -> str:
        args = ", ".join(f"v{k}" for k in range(len(self.inputs)))
        body = [f"    {s}" for s in self.steps] + [f"    return ({', '.join(self.outputs)},)"]
        return "\n".join([f"def {name}({args}):"] + body)

    def function(self):
        ns = {"torch": torch}
        exec(self.function_source(), ns)
        return ns["program"]

    def make_inputs(self):
        return [to_device(make_input(i.shape, i.dtype, i.layout, seed=i.seed), DEVICE) for i in self.inputs]

    def reproducer(self, message: str = "", template: str = "") -> str:
        return (template or REPRO_TEMPLATE).format(
            message="\n".join(f"# {line}" for line in message.splitlines()), make_input=MAKE_INPUT_SOURCE,
            program=self.function_source(), inputs=",\n        ".join(i.source() for i in self.inputs))


MAKE_INPUT_SOURCE = '''def make_input(shape, dtype, layout, seed):
    """A random tensor of ``shape``: contiguous or viewed non-contiguously as ``layout`` says."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        base = _values(shape[::-1], dtype, g)
        return base.permute(*reversed(range(len(shape))))
    if layout == "strided" and len(shape) >= 1:
        base = _values(shape[:-1] + (2 * shape[-1],), dtype, g)
        return base[..., ::2]
    if layout == "offset":
        return _values((1,) + shape, dtype, g).expand((2,) + shape).contiguous()[1]
    if layout == "expanded" and len(shape) >= 1:
        return _values(shape[:-1] + (1,), dtype, g).expand(shape)
    return _values(shape, dtype, g)


def _values(shape, dtype, g):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype == torch.int64:
        return torch.randint(-5, 6, shape, generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
'''

REPRO_TEMPLATE = '''"""A minicompile fuzzer reproducer: the compiled program disagrees with eager.

{message}
Run: python THIS_FILE
"""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.pipeline import compile_graph
from minicompile.testing.compare import copy_preserving_strides, mismatch


{make_input}

{program}


if __name__ == "__main__":
    inputs = [
        {inputs},
    ]
    expected = program(*[copy_preserving_strides(x) for x in inputs])
    compiled = compile_graph(make_fx(program, tracing_mode="fake")(*inputs), list(inputs))
    print(compiled.explain())
    print(mismatch(expected, compiled(*inputs)) or "matches eager")
'''

_ns: dict = {"torch": torch}
exec(MAKE_INPUT_SOURCE, _ns)
make_input = _ns["make_input"]


# -- the op table: each entry proposes one expression over existing values ----------------------

@dataclass
class Value:
    name: str
    tensor: torch.Tensor
    is_input: bool


def _floats(vals):
    return [v for v in vals if v.tensor.dtype in FLOATS]


def _dim(rng, t):
    return rng.randrange(t.dim()) if t.dim() else None


UNARY_FLOAT = ["torch.exp", "torch.sin", "torch.tanh", "torch.sigmoid", "torch.relu", "torch.neg", "torch.abs",
               "torch.sqrt(torch.abs({0}))", "torch.log1p(torch.abs({0}))", "torch.rsqrt(torch.abs({0}) + 1)",
               "torch.floor", "torch.erf", "torch.square", "torch.nn.functional.gelu", "torch.nn.functional.silu"]
UNARY_INT = ["torch.neg", "torch.abs", "torch.square", "torch.sign"]
BINARY = ["torch.add", "torch.sub", "torch.mul", "torch.maximum", "torch.minimum"]
COMPARE = ["torch.lt", "torch.ge", "torch.eq", "torch.ne"]


def op_unary(rng, vals):
    v = rng.choice(vals)
    t = v.tensor
    if t.dtype == torch.bool:
        return f"torch.logical_not({v.name})"
    table = UNARY_FLOAT if t.dtype.is_floating_point else UNARY_INT
    f = rng.choice(table)
    return f.format(v.name) if "{0}" in f else f"{f}({v.name})"


def op_binary(rng, vals):
    a = rng.choice(vals)
    b = _broadcast_partner(rng, vals, a)
    f = rng.choice(BINARY)
    if a.tensor.dtype == torch.bool and f in ("torch.sub",):
        f = "torch.logical_xor"
    if rng.random() < 0.2:
        return f"{f}({a.name}, {rng.choice([2, -1, 0.5, 3])})"
    return f"{f}({a.name}, {b.name})"


def _broadcast_partner(rng, vals, a):
    """A value whose shape broadcasts with ``a`` (same shape, trailing dims, or size-1 dims)."""
    shape = tuple(a.tensor.shape)
    fits = [v for v in vals if _broadcasts(tuple(v.tensor.shape), shape)]
    return rng.choice(fits) if fits else a


def _broadcasts(s, t):
    for x, y in zip(reversed(s), reversed(t)):
        if x != y and x != 1 and y != 1:
            return False
    return True


def op_compare(rng, vals):
    a = rng.choice(vals)
    b = _broadcast_partner(rng, vals, a)
    if torch.bfloat16 in (a.tensor.dtype, b.tensor.dtype) and not (a.is_input and b.is_input):
        return None  # compiled bf16 chains round once, eager per op: comparisons can flip
    return f"{rng.choice(COMPARE)}({a.name}, {b.name})"


def op_where(rng, vals):
    conds = [v for v in vals if v.tensor.dtype == torch.bool]
    a = rng.choice(vals)
    b = _broadcast_partner(rng, vals, a)
    if conds:
        c = rng.choice(conds)
        return f"torch.where({c.name}, {a.name}, {b.name})"
    if a.tensor.dtype == torch.bfloat16 and not a.is_input:
        return None
    return f"torch.where({a.name} > 0, {a.name}, {b.name})"


def op_reduce(rng, vals):
    v = rng.choice(vals)
    t = v.tensor
    d = _dim(rng, t)
    keep = rng.random() < 0.5
    kinds = ["sum", "amax", "amin"]
    if t.dtype.is_floating_point:
        kinds += ["mean", "var"]
    if t.dtype != torch.bool:
        kinds += ["argmax"]
    if t.dtype == torch.bool:
        kinds = ["any", "all", "sum"]
    kind = rng.choice(kinds)
    if t.dtype == torch.bfloat16 and not v.is_input and kind in ("argmax", "amax", "amin"):
        return None
    if d is None:
        return f"torch.{kind}({v.name})" if kind not in ("amax", "amin", "var") else f"{v.name}.sum()"
    if kind in ("amax", "amin", "argmax") and t.shape[d] == 0:
        return None
    return f"torch.{kind}({v.name}, {d}, keepdim={keep})"


def op_view(rng, vals):
    v = rng.choice(vals)
    t = v.tensor
    n = t.dim()
    choices = ["unsqueeze", "reshape"]
    if n >= 2:
        choices += ["permute", "transpose", "flatten"]
    if n >= 1:
        choices += ["slice", "select", "expand", "squeeze", "flip_step"]
    kind = rng.choice(choices)
    if kind == "unsqueeze":
        return f"{v.name}.unsqueeze({rng.randrange(n + 1)})"
    if kind == "reshape":
        return f"{v.name}.reshape(-1)" if n else f"{v.name}.reshape(1, 1)"
    if kind == "permute":
        perm = list(range(n))
        rng.shuffle(perm)
        return f"{v.name}.permute({', '.join(map(str, perm))})"
    if kind == "transpose":
        return f"{v.name}.transpose({rng.randrange(n)}, {rng.randrange(n)})"
    if kind == "flatten":
        return f"{v.name}.flatten(0, 1)"
    d = rng.randrange(n)
    size = t.shape[d]
    if kind == "slice":
        start = rng.randrange(size + 1)
        return f"{v.name}.narrow({d}, {start}, {rng.randrange(size - start + 1)})"
    if kind == "flip_step":
        return f"{v.name}[{'..., ' * 0}{':, ' * d}{rng.randrange(max(size, 1))}::{rng.choice([2, 3])}]"
    if kind == "select":
        return f"{v.name}.select({d}, {rng.randrange(size)})" if size else None
    if kind == "squeeze":
        return f"{v.name}.squeeze({d})"
    if kind == "expand":
        shape = list(t.shape)
        ones = [k for k, s in enumerate(shape) if s == 1]
        if not ones:
            return f"{v.name}.expand({rng.choice([2, 3])}, *{v.name}.shape)"
        shape[rng.choice(ones)] = rng.choice([2, 3, 5])
        return f"{v.name}.expand({', '.join(map(str, shape))})"
    return None


def op_matmul(rng, vals):
    fl = [v for v in _floats(vals) if v.tensor.dim() in (1, 2, 3)]
    if not fl:
        return None
    a = rng.choice(fl)
    k = a.tensor.shape[-1]
    partners = [v for v in fl if v.tensor.dtype == a.tensor.dtype and v.tensor.dim() >= 1 and
                (v.tensor.shape[0] == k if v.tensor.dim() <= 2 else False)]
    if partners:
        return f"torch.matmul({a.name}, {rng.choice(partners).name})"
    return f"torch.matmul({a.name}, {a.name}.transpose(-1, -2))" if a.tensor.dim() >= 2 else None


def op_norm(rng, vals):
    fl = [v for v in _floats(vals) if v.tensor.dim() >= 1]
    if not fl:
        return None
    v = rng.choice(fl)
    d = _dim(rng, v.tensor)
    kind = rng.choice(["softmax", "log_softmax", "layer_norm", "manual"])
    if kind == "softmax":
        return f"torch.softmax({v.name}, {d})"
    if kind == "log_softmax":
        return f"torch.log_softmax({v.name}, {d})"
    if kind == "layer_norm":
        return f"torch.nn.functional.layer_norm({v.name}, {v.name}.shape[-1:])"
    return (f"({v.name} - {v.name}.mean({d}, keepdim=True)) * torch.rsqrt({v.name}.var({d}, keepdim=True, "
            f"unbiased=False) + 1e-5)")


def op_cast(rng, vals):
    v = rng.choice(vals)
    target = rng.choice(DTYPES)
    if v.tensor.dtype == torch.bfloat16 and not v.is_input and target in (torch.int64, torch.bool):
        return None  # rounding differences would show up as different integers
    if v.tensor.dtype.is_floating_point and target == torch.int64:
        return f"({v.name} * 4).to(torch.int64)"
    return f"{v.name}.to({target})"


OPS = [(op_unary, 4), (op_binary, 4), (op_compare, 1), (op_where, 1), (op_reduce, 2), (op_view, 3),
       (op_matmul, 1), (op_norm, 1), (op_cast, 1)]


def op_cat(rng, vals):
    """torch.cat of 2-4 pieces along one dim (values of matching shape, slices of the first, the
    first again), or torch.stack of same-shaped ones: concatenation readers, sliced or not."""
    v = rng.choice([v for v in vals if v.tensor.dim() >= 1] or [None])
    if v is None:
        return None
    t, d = v.tensor, rng.randrange(v.tensor.dim())
    fits = [w for w in vals if w.tensor.dim() == t.dim() and all(
        a == b for k, (a, b) in enumerate(zip(w.tensor.shape, t.shape)) if k != d)]
    parts = [v.name]
    for _ in range(rng.randint(1, 3)):
        start = rng.randrange(t.shape[d] + 1)
        length = rng.randrange(t.shape[d] - start + 1)
        parts.append(rng.choice([rng.choice(fits).name, f"{v.name}.narrow({d}, {start}, {length})"]))
    rng.shuffle(parts)
    if rng.random() < 0.25:
        return f"torch.stack([{', '.join(p for p in parts if '.narrow' not in p)}], {rng.randrange(t.dim() + 1)})"
    return f"torch.cat([{', '.join(parts)}], {d})"


CONCAT_OPS = OPS + [(op_cat, 4)]   # testing/fuzz_classes.py's "concat" class (OPS itself fixes old seeds)


# -- generation -----------------------------------------------------------------------------

def _random_shape(rng):
    ndim = rng.choice([0, 1, 2, 2, 3, 3, 4])
    shape = []
    for _ in range(ndim):
        r = rng.random()
        shape.append(1 if r < 0.25 else 0 if r < 0.3 else rng.randint(2, 9))
    return tuple(shape)


# The first input's dtype: inference programs, and training programs (differentiable inputs).
FIRST_DTYPES = [torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]
TRAINING_DTYPES = [torch.float32, torch.float32, torch.float32, torch.float64, torch.bfloat16]


def random_inputs(rng, seed: int, dtypes: list) -> list:
    """One to three inputs of broadcast-compatible random shapes, the first of a dtype from ``dtypes``."""
    dtype = rng.choice(dtypes)
    base = _random_shape(rng)
    inputs = []
    for k in range(rng.randint(1, 3)):
        shape = base if k == 0 or rng.random() < 0.5 else _broadcast_shape(rng, base)
        dt = dtype if rng.random() < 0.8 else rng.choice(DTYPES)
        inputs.append(Input(shape, dt, rng.choice(LAYOUTS), seed * 7 + k))
    return inputs


def generate(seed: int, max_steps: int = 6, dtypes: list = FIRST_DTYPES, reject=None, ops: list = OPS,
             make_inputs=random_inputs) -> Program:
    """Program ``seed``; ``reject(expr, vals)`` may turn down a proposed step (another is tried).
    ``ops`` ((proposer, weight) pairs) and ``make_inputs(rng, seed, dtypes)`` let a bug class
    (testing/fuzz_classes.py) grow its own programs the same way."""
    rng = random.Random(seed)
    inputs = make_inputs(rng, seed, dtypes)
    prog = Program(inputs, [], [], seed)
    tensors = prog.make_inputs()
    vals = [Value(f"v{k}", t, True) for k, t in enumerate(tensors)]
    ns = {"torch": torch, **{v.name: v.tensor for v in vals}}
    for _ in range(rng.randint(1, max_steps)):
        for _attempt in range(10):
            make = rng.choices([f for f, _ in ops], [w for _, w in ops])[0]
            expr = make(rng, vals)
            if expr is None or (reject is not None and reject(expr, vals)):
                continue
            try:
                out = eval(expr, ns)  # noqa: S307 - our own generated expression
            except Exception:  # noqa: BLE001 - eager rejects it: try another op
                continue
            if not isinstance(out, torch.Tensor) or out.numel() > 4096:
                continue
            name = f"v{len(vals)}"
            prog.steps.append(f"{name} = {expr}")
            vals.append(Value(name, out, False))
            ns[name] = out
            break
    used = {n for s in prog.steps for n in _names(s.split(" = ", 1)[1])}
    prog.outputs = [v.name for v in vals if not v.is_input and v.name not in used] or [vals[-1].name]
    return prog


def _broadcast_shape(rng, shape):
    out = [1 if rng.random() < 0.4 else s for s in shape]
    return tuple(out[rng.randrange(len(out) + 1):]) if out else ()


def _names(expr: str) -> set:
    return set(re.findall(r"\bv\d+\b", expr))


# -- running and comparing --------------------------------------------------------------------

_PRECISION = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


def _precision_floor(inputs, fn=None):
    """The least precise float dtype a program reads (or, given ``fn``, computes: float64 inputs
    through a float32 erf): its results carry that dtype's rounding even after a cast to a wider
    type, so they are compared with that dtype's tolerance."""
    dtypes = {t.dtype for t in inputs} | (compare.dtypes_computed(fn, inputs) if fn is not None else set())
    floats = [d for d in dtypes if d in _PRECISION]
    return min(floats, key=_PRECISION.index) if floats else None


def _tolerances(floor=None) -> dict:
    """compare's tolerances, looser for fuzzed (cancellation-prone) chains, and for a program
    reading ``floor`` no tighter than that dtype's for any float result."""
    tolerances = {**compare.TOLERANCES, **TOLERANCES}
    if floor is not None:
        widest = tolerances[floor]
        for dt in _PRECISION:
            rtol, atol = tolerances.get(dt, widest)
            tolerances[dt] = (max(rtol, widest[0]), max(atol, widest[1]))
    return tolerances


def check_batch(programs: list) -> str | None:
    """Compile ``programs`` as one graph; None if every output matches eager, else the first difference."""
    fns = [p.function() for p in programs]
    inputs = [p.make_inputs() for p in programs]
    counts = [len(x) for x in inputs]
    flat = [t for x in inputs for t in x]

    def batched(*args):
        outs, k = [], 0
        for fn, n in zip(fns, counts):
            outs.append(fn(*args[k:k + n]))
            k += n
        return tuple(outs)
    expected = batched(*[copy_preserving_strides(t) for t in flat])
    try:
        gm = make_fx(batched, tracing_mode="fake")(*[copy_preserving_strides(t) for t in flat])
        compiled = compile_graph(gm, [copy_preserving_strides(t) for t in flat])
        actual = compiled(*[copy_preserving_strides(t) for t in flat])
    except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
        return f"crash: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    for exp, act, x, fn in zip(expected, actual, inputs, fns):
        found = mismatch(exp, act, tolerances=_tolerances(_precision_floor(x, fn)))
        if found:
            return found
    return None


def shrink(prog: Program, check=check_batch) -> tuple:
    """The smallest program (by outputs, steps and input layouts) that still fails ``check``, and its message."""
    msg = check([prog])
    if msg is None:
        return prog, None

    def fails(p):
        nonlocal msg
        try:
            m = check([p])
        except Exception:  # noqa: BLE001 - the candidate is not valid eager code
            return False
        if m is not None:
            msg = m
        return m is not None

    for out in prog.outputs:  # one output
        cand = _prune(replace(prog, outputs=[out]))
        if fails(cand):
            prog = cand
            break
    changed = True
    while changed:  # bypass steps: replace a step's result by one of its operands
        changed = False
        for k, step in enumerate(prog.steps):
            name, expr = step.split(" = ", 1)
            for operand in sorted(_names(expr)):
                cand = _prune(_substitute(prog, k, name, operand))
                if cand is not None and fails(cand):
                    prog, changed = cand, True
                    break
            if changed:
                break
    for k, inp in enumerate(prog.inputs):  # simpler layouts
        if inp.layout != "contiguous":
            cand = replace(prog, inputs=[replace(i, layout="contiguous") if j == k else i for j, i in enumerate(prog.inputs)])
            if fails(cand):
                prog = cand
    return prog, msg


def _substitute(prog, k, name, operand):
    """``prog`` with step ``k`` removed and its result ``name`` replaced by ``operand`` downstream."""
    pattern = re.compile(rf"\b{name}\b")
    steps = prog.steps[:k]
    for step in prog.steps[k + 1:]:
        lhs, expr = step.split(" = ", 1)
        steps.append(f"{lhs} = {pattern.sub(operand, expr)}")
    outputs = [operand if o == name else o for o in prog.outputs]
    if any(int(o[1:]) < len(prog.inputs) for o in outputs):
        return None  # returning an input unchanged tests nothing
    return replace(prog, steps=steps, outputs=outputs)


def _prune(prog):
    """Drop steps nothing returned depends on."""
    if prog is None:
        return None
    live = set(prog.outputs)
    kept = []
    for step in reversed(prog.steps):
        name, expr = step.split(" = ", 1)
        if name in live:
            kept.append(step)
            live |= _names(expr)
    return replace(prog, steps=list(reversed(kept)))


def run(seed: int, n: int, batch: int = 8, repro_dir: str = "fuzz-repros", log=print,
        make=generate, check=check_batch, template: str = "") -> list:
    """Fuzz ``n`` programs from ``seed`` (``make(seed)`` builds one, ``check(programs)`` compiles and
    compares a batch: this module's, fuzz_dynamic's or fuzz_train's); returns the paths of reproducers written for failures."""
    failures = []
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        programs = [make(seed + k) for k in range(start, min(n, start + batch))]
        if check(programs) is None:
            continue
        for p in programs:
            if check([p]) is None:
                continue
            small, msg = shrink(p, check)
            os.makedirs(repro_dir, exist_ok=True)
            path = os.path.join(repro_dir, f"repro_seed{p.seed}.py")
            with open(path, "w") as f:
                f.write(small.reproducer(f"fuzzer seed {p.seed}: {msg}", template))
            failures.append(path)
            log(f"[fuzz] program {p.seed} fails: {msg}\n       reproducer: {path}")
        log(f"[fuzz] {min(n, start + batch)}/{n} programs, {len(failures)} failing, {time.perf_counter() - t0:.0f} s")
    log(f"[fuzz] done: {n} programs from seed {seed}, {len(failures)} failing, {time.perf_counter() - t0:.0f} s")
    return failures


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu",
                   help="where inputs live: cpu (C++ kernels, or Triton's interpreter with "
                        "MINICOMPILE_CPU_BACKEND=triton) or cuda (Triton kernels on the GPU)")


def use_device(device: str) -> None:
    """Run programs on ``device``; a device torch cannot use is a clear error, not a crash per program."""
    global DEVICE
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"fuzz: --device {device}, but torch sees no CUDA device here")
    DEVICE = device


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Fuzz minicompile with random programs compared against eager.")
    p.add_argument("--seed", type=int, default=0, help="first program's seed (program k uses seed+k)")
    p.add_argument("-n", type=int, default=200, help="number of programs")
    p.add_argument("--batch", type=int, default=8, help="programs compiled together as one graph")
    p.add_argument("--repro-dir", default="fuzz-repros", help="where minimal reproducers are written")
    p.add_argument("--show", type=int, help="print program SEED as a standalone file and exit")
    p.add_argument("--dynamic", action="store_true",
                   help="compile with symbolic sizes and call at three sizes (testing/fuzz_dynamic.py)")
    add_device_argument(p)
    args = p.parse_args(argv)
    if args.show is not None:
        print(generate(args.show).reproducer(f"fuzzer seed {args.show}"))
        return 0
    use_device(args.device)
    check = check_batch
    if args.dynamic:
        from minicompile.testing.fuzz_dynamic import check_batch as check
    return 1 if run(args.seed, args.n, args.batch, args.repro_dir, check=check) else 0


if __name__ == "__main__":
    sys.exit(main())
