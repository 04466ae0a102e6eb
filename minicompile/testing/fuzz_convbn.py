"""The bug-class fuzzer's conv+BN class: random convolution / normalisation / activation stacks
trained (mostly channels-last), ours judged against a float64 run as eager is.

Each program is a small ``nn.Sequential`` written as source (so its reproducer is the model):
convolutions (full, depthwise, 1x1, strided, padded), BatchNorm (affine or not, its momentum),
GroupNorm, ReLU/ReLU6/SiLU/GELU/Hardswish/LeakyReLU, residual blocks, squeeze-excite and
pooling, on an input of 1-8 images whose values may sit far from 0 (a sum's hard case). One
training step: forward, a fixed random cotangent, backward. Every output, input gradient,
parameter gradient and BatchNorm running statistic is compared, tensor by tensor:

- within 1e-4 (relative L2) of eager float32 in the same layout: passes;
- else ours must be at most F64_FACTOR times as far from float64 as the farther of eager
  NCHW and eager channels-last (both float32), or within NOISE of float64. A gradient below 1%
  of the step's whole gradient (zero in exact arithmetic: a weight that a later normalisation
  cancels) is measured against that 1%, as the real-model tryout does. A float64 run with one
  activation input that lies within rounding of a kink moved across it may stand in for
  float64 (``testing/kinks.py``): two float32 runs can put such an input on either side.
  Where the model is badly conditioned, eager's distance is one draw of float32's rounding
  noise: EAGER_DRAWS more draws (eager float32 against float64, both on the input nudged by a
  float32 step, ``testing/rounding.py``) count as eager's distance too.

A batch of programs compiles as one module (one training graph) with ``MINICOMPILE_FALLBACK=0``:

    python -m minicompile.testing.fuzz_classes --class convbn --seed 400000 -n 2000 --batch 16
"""
from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from minicompile.config import patch
from minicompile.testing import kinks, rounding

EAGER_RTOL = 1e-4
F64_FACTOR = 3.0
NOISE = 1e-6          # this close to float64 (relative L2) passes whatever eager's distance
EAGER_DRAWS = 3       # more draws of eager float32's error, on nudged inputs (testing/rounding.py)
FLOOR = 0.01          # of the step's whole gradient norm: smaller gradients are measured against it
ACTIVATIONS = ["nn.ReLU()", "nn.ReLU()", "nn.ReLU6()", "nn.SiLU()", "nn.GELU()", "nn.Hardswish()",
               "nn.LeakyReLU(0.1)", "nn.Identity()"]


class Residual(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.body(x)


class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, max(1, c // 4), 1), nn.Conv2d(max(1, c // 4), c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


@dataclass
class ConvBnProgram:
    seed: int
    layers: list            # constructor source of each layer
    shape: tuple            # the input's
    offset: float           # added to the input
    channels_last: bool

    def strided_1x1(self) -> bool:
        """Whether a 1x1 convolution has a stride (eager channels-last would crash: see _block)."""
        return any(re.search(r"Conv2d\(\d+, \d+, 1, stride=[2-9]", layer) for layer in self.layers)

    def model_source(self) -> str:
        return "nn.Sequential(\n" + "".join(f"    {layer},\n" for layer in self.layers) + ")"

    def build(self) -> nn.Module:
        torch.manual_seed(self.seed)
        model = eval(self.model_source(), {"nn": nn, "Residual": Residual, "SqueezeExcite": SqueezeExcite})
        return model.train().to(memory_format=self._format())

    def _format(self):
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def inputs(self) -> tuple:
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.shape, generator=g) + self.offset
        out_shape = self.build()(x).shape
        return x.contiguous(memory_format=self._format()), torch.randn(out_shape, generator=g, dtype=torch.float64)

    def reproducer(self, message: str = "") -> str:
        return (f"# {message}\n# python this_file.py: ours against float64, as eager is\n"
                "import torch, torch.nn as nn\n"
                "from minicompile.testing.fuzz_convbn import ConvBnProgram, Residual, SqueezeExcite, check\n\n"
                f"prog = ConvBnProgram({self.seed}, {self.layers!r}, {self.shape}, {self.offset}, {self.channels_last})\n"
                f"model = {self.model_source()}\n"
                "print(check([prog]) or 'matches')\n")


def _block(rng, c: int, hw: int, channels_last: bool) -> tuple[list, int, int]:
    """One block's layers, and the channels and size after it. A strided 1x1 convolution only in
    NCHW programs: eager channels-last crashes there (torch's CPU convolution_backward corrupts
    the heap; runtime/extern_args.py), and ours trains NCHW programs channels-last."""
    act = rng.choice(ACTIVATIONS)
    norm = lambda ch: rng.choice([f"nn.BatchNorm2d({ch})", f"nn.BatchNorm2d({ch})", f"nn.BatchNorm2d({ch}, affine=False)",  # noqa: E731
                                  f"nn.BatchNorm2d({ch}, momentum=0.3)", f"nn.GroupNorm(1, {ch})", "nn.Identity()"])
    kind = rng.choice(["conv", "conv", "conv", "depthwise", "pointwise", "residual", "se", "pool"])
    if kind == "pool" and hw >= 4:
        pool = rng.choice(["nn.MaxPool2d(2)", "nn.AvgPool2d(2)", "nn.MaxPool2d(3, 2, 1)"])
        return [pool], c, (hw - 1) // 2 + 1 if "3" in pool else hw // 2
    if kind == "se":
        return [f"SqueezeExcite({c})"], c, hw
    if kind == "residual":
        k = rng.choice([1, 3])
        return [f"Residual(nn.Conv2d({c}, {c}, {k}, padding={k // 2}, bias=False), {norm(c)}, {act})"], c, hw
    out = c if kind == "depthwise" else rng.choice([4, 8, 12, 16])
    k = 1 if kind == "pointwise" else rng.choice([1, 3, 3, 5])
    stride = rng.choice([1, 1, 2]) if hw >= 4 and not (k == 1 and channels_last) else 1
    normed = norm(out)
    bias = normed == "nn.Identity()" and rng.random() < 0.7    # a bias before a norm has no gradient
    groups = f", groups={c}" if kind == "depthwise" else ""
    conv = f"nn.Conv2d({c}, {out}, {k}, stride={stride}, padding={k // 2}{groups}, bias={bias})"
    return [conv, normed, act], out, (hw + 2 * (k // 2) - k) // stride + 1


def generate(seed: int) -> ConvBnProgram:
    rng = random.Random(seed)
    c, hw = rng.choice([1, 3, 4]), rng.choice([6, 8, 12, 16])
    shape = (rng.choice([1, 2, 4, 8]), c, hw, hw)
    channels_last = rng.random() < 0.75
    layers = []
    for _ in range(rng.randint(2, 5)):
        more, c, hw = _block(rng, c, hw, channels_last)
        layers += more
    return ConvBnProgram(seed, layers, shape, rng.choice([0.0, 0.0, 2.0, 5.0]), channels_last)


class _Batch(nn.Module):
    def __init__(self, models):
        super().__init__()
        self.models = nn.ModuleList(models)

    def forward(self, *xs):
        return tuple(m(x) for m, x in zip(self.models, xs))


def _step(models: list, run, xs: list, cotangents: list, dtype) -> list[list]:
    """One training step of each model: its output, input gradient, parameter gradients and
    buffers after the step, as float64 tensors (one list per model)."""
    xs = [x.to(dtype).detach().requires_grad_() for x in xs]
    outs = run(*xs)
    sum((o * g.to(o.dtype)).sum() for o, g in zip(outs, cotangents)).backward()
    return [[o.detach().double(), x.grad.double()] + [p.grad.double() for p in m.parameters()]
            + [b.double() for b in m.buffers() if b.is_floating_point()]
            for m, o, x in zip(models, outs, xs)]


def _run_all(progs: list, dtype, channels_last: bool | None = None, compiled: bool = False, flip=None,
             nudge: int | None = None) -> list:
    models = []
    for p in progs:
        m = p.build().to(dtype)
        if channels_last is not None:
            m = m.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        models.append(kinks.flip(m, flip) if flip else m)
    batch = _Batch(models)
    pairs = [p.inputs() for p in progs]
    if nudge is not None:     # another draw of float32's roundings (testing/rounding.py)
        pairs = [(rounding.nudge(x, nudge), g) for x, g in pairs]
    xs = [x if channels_last is None else x.contiguous(memory_format=torch.channels_last if channels_last
                                                         else torch.contiguous_format) for x, _ in pairs]
    if compiled:
        torch._dynamo.reset()
        with patch(fallback_on_error=False, conv_layout="channels_last"):
            return _step(models, torch.compile(batch, backend="minicompile"), xs, [g for _, g in pairs], dtype)
    return _step(models, batch, xs, [g for _, g in pairs], dtype)


def _ties(prog) -> list:
    m = prog.build().double()
    found = kinks.record(m)
    m(prog.inputs()[0].double())
    return found.ties()


def _rel(a, b, floor) -> float:
    return float((a - b).norm() / max(float(b.norm()), floor))


def judge(prog, ours: list, eager: list, eager_other: list, f64: list) -> str | None:
    """None if every tensor of ``ours`` is as eager's, or about as close to float64 as eager's."""
    model = prog.build()
    names = ["output", "input grad"] + [f"grad {n}" for n, _ in model.named_parameters()] + \
            [f"buffer {n}" for n, b in model.named_buffers() if b.is_floating_point()]
    grads = 2 + len(list(model.parameters()))
    # a gradient below FLOOR of the step's whole gradient (one that is zero in exact arithmetic,
    # such as a BatchNorm weight that a later normalisation cancels) is measured against that
    # (and a running mean of values a normalisation centred: the buffers' 1%, as for gradients)
    whole = FLOOR * float(torch.cat([t.flatten() for t in f64[1:grads]]).norm())
    buffers = FLOOR * float(torch.cat([t.flatten() for t in f64[grads:]] + [torch.zeros(1, dtype=torch.float64)]).norm())
    floors = [1e-30] + [whole] * (grads - 1) + [max(buffers, 1e-30)] * (len(names) - grads)

    def excused(k, reference, spread=0.0) -> bool:
        e = max(_rel(eager[k], f64[k], floors[k]), _rel(eager_other[k], f64[k], floors[k]), spread)
        return _rel(ours[k], reference[k], floors[k]) <= max(F64_FACTOR * e, NOISE)
    bad = [k for k in range(len(names)) if _rel(ours[k], eager[k], floors[k]) > EAGER_RTOL and not excused(k, f64)]
    if not bad:
        return None
    for tie in _ties(prog):          # a float64 run with a near-kink input on its other side
        flipped = _run_all([prog], torch.float64, flip=tie)[0]
        if all(excused(k, flipped) for k in bad):
            return None
    # eager float32's own error, drawn again on inputs nudged by a float32 step (eager's one
    # draw can be a lucky one where the step is badly conditioned)
    draws = [(_run_all([prog], torch.float32, nudge=seed)[0], _run_all([prog], torch.float64, nudge=seed)[0])
             for seed in range(EAGER_DRAWS)]
    spread = {k: max(_rel(e[k], f[k], floors[k]) for e, f in draws) for k in bad}
    if all(excused(k, f64, spread[k]) for k in bad):
        return None
    k = bad[0]
    return (f"{names[k]}: {_rel(ours[k], eager[k], floors[k]):.1e} from eager; float64 distance ours "
            f"{_rel(ours[k], f64[k], floors[k]):.1e}, eager's {_rel(eager[k], f64[k], floors[k]):.1e}, "
            f"eager's on {EAGER_DRAWS} nudged inputs up to {spread[k]:.1e}")


def check(progs: list) -> str | None:
    """Compile ``progs`` as one module and judge each; the first finding, or None."""
    try:
        ours = _run_all(progs, torch.float32, compiled=True)
    except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
        return f"crash: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    eager = _run_all(progs, torch.float32)
    f64 = _run_all(progs, torch.float64)
    found = []
    for k, p in enumerate(progs):
        other = eager[k] if p.strided_1x1() else _run_all([p], torch.float32, channels_last=not p.channels_last)[0]
        problem = judge(p, ours[k], eager[k], other, f64[k])
        if problem:
            found.append(f"seed {p.seed}: {problem}")
    return "; ".join(found) or None


def run(seed: int, n: int, batch: int, repro_dir: str, log=print) -> list:
    """Fuzz ``n`` programs from ``seed`` in batches; returns the reproducers written."""
    os.makedirs(repro_dir, exist_ok=True)
    failures, t0 = [], time.time()
    for start in range(seed, seed + n, batch):
        progs = [generate(s) for s in range(start, min(start + batch, seed + n))]
        found = check(progs)
        if found is None:
            continue
        alone = [(p, check([p])) for p in progs]     # which of the batch: each alone
        for p, problem in [a for a in alone if a[1]] or [(progs[0], f"{found} (in the batch from {start} only)")]:
            path = os.path.join(repro_dir, f"convbn_{p.seed}.py")
            with open(path, "w") as f:
                f.write(p.reproducer(f"convbn fuzzer seed {p.seed}: {problem}"))
            failures.append(path)
            log(f"[fuzz convbn] seed {p.seed}: {problem}")
    log(f"[fuzz] done: {n} programs from seed {seed}, {len(failures)} failing, {time.time() - t0:.0f} s")
    return failures
