"""Real architectures tried as a user would: timm and HF transformers models from small configs.

    python -m minicompile.testing.tryout_models [--models resnet18,gpt2] [--json FILE]

Each model (random init, batch 2, 64 px images or 16 tokens) runs in a process of its own with
one OpenMP thread, and goes through ``torch.compile(model, backend="minicompile")`` twice:

- inference: ``eval()`` under ``no_grad``, the output compared with eager's;
- training: two AdamW steps in train mode (dropout off, everything else as the model has it,
  channels-last convolutions on: the default), the losses and every gradient compared with
  eager's at the same point: eager float32 takes its steps first, and each compiled step starts
  from the model and optimizer state eager's step started from (loaded in place, the compiled
  model is not rebuilt). Left to run on, the compiled model's second step would be taken
  elsewhere: AdamW's first update is about lr * sign(gradient), so a gradient element that
  rounding noise puts on either side of zero moves by 2 * lr in one run and not the other, and
  the second step's gradients then differ by much more than the compiler's rounding. A float64
  copy of the model takes each step from the same point too; where ours is not within OUT_RTOL
  (losses) or GRAD_RTOL (gradients) of eager float32, it must be about as close to float64 as
  eager float32 is (at most F64_FACTOR times eager's distance), the way the training fuzzer
  judges bf16. A model with convolutions has two eager float32 runs, NCHW and channels-last
  (the layout ours trains in), and eager's distance is the farther of the two: an activation
  that lies within rounding of a kink (a ReLU6 input at -3e-7 among values up to 5.5 in
  mobilenetv2_050) falls on either side in different float32 computations, eager's own two
  included, and moves a whole channel's gradients by far more than rounding.

A row's status: ``ok``; ``wrong`` (a value out of tolerance); ``crash`` (an exception reached the
user); ``fallback`` (a graph ran eagerly: minicompile's log said so; the reasons are listed);
``pending`` (wrong, crashing or falling back in a way another change owns, PENDING says which).
timm needs the torchvision stand-in of /work/shared/stubs on PYTHONPATH (its README); HF runs
offline. docs/testing.md has the list and the latest results.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.testing import kinks

OUT_RTOL = 1e-4       # max |compiled - eager| / max |eager| of an output or loss
GRAD_RTOL = 1e-4      # relative L2 of a gradient that needs no second opinion
F64_FACTOR = 3.0      # ours may be this many times farther from float64 than eager float32 is
NOISE = 1e-6          # gradients this close to float64 in relative L2 pass whatever eager's distance
FLOOR = 1e-2          # a gradient's norm is taken as at least this fraction of its step's (judge_grads)
BATCH, IMAGE, TOKENS, CLASSES = 2, 64, 16, 10
PENDING: dict[str, str] = {}   # model -> the known issue-23 bug another change fixes (none open)


# ------------------------------------------------------------------------------- the models

def timm_model(name: str, image: int = IMAGE, **kwargs) -> Callable:
    def build():
        import timm
        model = timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs)
        return dropout_off(model), (torch.randn(BATCH, 3, image, image),)
    build.library = "timm"
    return build


def dropout_off(model: nn.Module) -> nn.Module:
    """Every dropout, drop-path and classifier drop rate of a timm model set to 0: random draws
    would make eager, ours and float64 differ by more than any rounding (swin_tiny's stochastic
    depth, 0.1 by default; GhostNet's F.dropout of 0.2 before its classifier)."""
    for m in model.modules():
        for attr in ("drop_prob", "drop_rate") + (("p",) if isinstance(m, nn.modules.dropout._DropoutNd) else ()):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model


class Logits(nn.Module):
    """An HF model's logits (a tensor, not a ModelOutput), from keyword inputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        names = self.input_names
        return self.model(**dict(zip(names, inputs))).logits


def hf_model(cls: str, config: str, inputs: tuple = ("input_ids",), **sizes) -> Callable:
    """``transformers.<cls>(<config>(**sizes))`` with dropout off, random init, no cache."""
    def build():
        import transformers
        cfg = getattr(transformers, config)(**sizes)
        for key in dir(cfg):
            if ("dropout" in key or key.endswith("_pdrop")) and isinstance(getattr(cfg, key, None), float):
                setattr(cfg, key, 0.0)
        cfg.use_cache = False
        model = Logits(getattr(transformers, cls)(cfg))
        model.input_names = inputs
        vocab = getattr(cfg, "vocab_size", 100)
        args = []
        for name in inputs:
            if name == "input_features":
                args.append(torch.randn(BATCH, cfg.num_mel_bins, 2 * cfg.max_source_positions))
            else:
                args.append(torch.randint(0, vocab, (BATCH, TOKENS)))
        return model, tuple(args)
    build.library = "transformers"
    return build


_LM = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, max_position_embeddings=64)
_SEQ2SEQ = ("input_ids", "decoder_input_ids")

MODELS: dict[str, Callable] = {
    # CNNs
    "resnet18": timm_model("resnet18"),
    "resnext26ts": timm_model("resnext26ts"),
    "regnetx_002": timm_model("regnetx_002"),
    "densenet121": timm_model("densenet121", block_config=(2, 2, 2, 2)),
    "efficientnet_b0": timm_model("efficientnet_b0"),
    "mobilenetv3_small_050": timm_model("mobilenetv3_small_050"),
    "mobilenetv2_050": timm_model("mobilenetv2_050"),
    "convnext_atto": timm_model("convnext_atto"),
    "ghostnet_050": timm_model("ghostnet_050"),
    # vision transformers and MLP mixers
    "vit_tiny": timm_model("vit_tiny_patch16_224", img_size=64, depth=2),
    "deit_tiny": timm_model("deit_tiny_distilled_patch16_224", img_size=64, depth=2),
    "swin_tiny": timm_model("swin_tiny_patch4_window7_224", image=112, img_size=112, embed_dim=48,
                            depths=(2, 2, 2, 2), window_size=7),
    "beit": timm_model("beit_base_patch16_224", img_size=64, depth=2, embed_dim=96, num_heads=3),
    "mixer_s16": timm_model("mixer_s16_224", img_size=64),
    "poolformer_s12": timm_model("poolformer_s12"),
    "coat_lite_tiny": timm_model("coat_lite_tiny", img_size=64),
    "levit_128s": timm_model("levit_128s", image=64, img_size=64),
    # Hugging Face
    "gpt2": hf_model("GPT2LMHeadModel", "GPT2Config", vocab_size=100, n_embd=64, n_layer=2, n_head=4,
                     n_positions=64),
    "llama": hf_model("LlamaForCausalLM", "LlamaConfig", **_LM, num_key_value_heads=2),
    "mistral": hf_model("MistralForCausalLM", "MistralConfig", **_LM, num_key_value_heads=2, sliding_window=8),
    "gemma": hf_model("GemmaForCausalLM", "GemmaConfig", **_LM, num_key_value_heads=1, head_dim=16),
    "bert": hf_model("BertForMaskedLM", "BertConfig", **_LM),
    "albert": hf_model("AlbertForMaskedLM", "AlbertConfig", **_LM, embedding_size=32),
    "opt": hf_model("OPTForCausalLM", "OPTConfig", vocab_size=100, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64),
    "t5": hf_model("T5ForConditionalGeneration", "T5Config", _SEQ2SEQ, vocab_size=100, d_model=64, d_kv=16, d_ff=128,
                   num_layers=2, num_heads=4),
    "bart": hf_model("BartForConditionalGeneration", "BartConfig", _SEQ2SEQ, vocab_size=100, d_model=64,
                     encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64),
    "whisper": hf_model("WhisperForConditionalGeneration", "WhisperConfig", ("input_features", "decoder_input_ids"),
                        vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                        max_source_positions=16, max_target_positions=64, decoder_start_token_id=1,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2),
}


# ------------------------------------------------------------------------------- one model

@dataclass
class Result:
    model: str
    status: str = "ok"
    infer_err: float | None = None         # max |compiled - eager| / max |eager|, inference
    loss_err: float | None = None          # the same over both training losses
    grad_l2: float | None = None           # worst relative L2 of a gradient, compiled vs eager
    grad_f64: tuple | None = None          # that gradient's distance to float64: (ours, eager's)
    graph_breaks: int = 0
    fallbacks: list = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0


class FallbackLog(logging.Handler):
    """minicompile's warnings that a graph, or part of one, runs eagerly or per shape."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        message = record.getMessage()
        if any(s in message for s in ("eagerly", "per shape", "falling back")):
            self.messages.append(message[:300])


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def rel_l2(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """||a - b|| / ||b||, or over ``floor`` where ||b|| is below it."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def infer(model: nn.Module, inputs: tuple) -> float:
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = model(*inputs)
        compiled = torch.compile(model, backend="minicompile")
        return rel_max(compiled(*inputs), expected)


STEPS = 2


def train(model: nn.Module, inputs: tuple, compiled: bool, points: list | None = None) -> tuple[list, list, list]:
    """STEPS AdamW steps of ``model`` (a copy, in its dtype); each step's loss and gradients, and
    the point each step started from (the model's state and the optimizer's, copied). Given
    ``points`` (eager's), step k starts from points[k] instead of where step k-1 left this run:
    each step's loss and gradients are then taken at the same point as eager's."""
    model = copy.deepcopy(model).train()
    fn = torch.compile(model, backend="minicompile") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads, started = [], [], []
    for k in range(STEPS):
        if points is not None:
            model.load_state_dict(points[k][0])   # copies in place, casting to this model's dtype
            opt.load_state_dict(copy.deepcopy(points[k][1]))   # the optimizer would take these tensors as its own
        started.append((copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())))
        opt.zero_grad(set_to_none=True)
        loss, step_grads = loss_and_grads(model, fn, inputs)
        losses.append(loss)
        grads.append(step_grads)
        opt.step()
    return losses, grads, started


def loss_and_grads(model: nn.Module, fn: Callable, inputs: tuple) -> tuple:
    """One forward and backward of ``fn`` (``model``, or it compiled): the loss, each parameter's gradient."""
    target = torch.randint(0, CLASSES, (BATCH,), generator=torch.Generator().manual_seed(2))
    out = fn(*inputs)
    out = out.flatten(0, -2) if out.dim() > 2 else out   # token logits: one row per token
    loss = F.cross_entropy(out.float() if out.dtype != torch.float64 else out,
                           target.repeat_interleave(out.shape[0] // BATCH) % out.shape[-1])
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                           for p in model.parameters()]


def tie_variants(model64: nn.Module, inputs: tuple, points: list) -> list[list]:
    """For each step, the float64 gradients with one activation input that lies within rounding
    of a kink moved to its other side (minicompile/testing/kinks.py), one run per such input."""
    variants = []
    for point in points:
        def at_point():
            m = copy.deepcopy(model64).train()
            m.load_state_dict(point[0])
            return m
        m = at_point()
        found = kinks.record(m)
        m(*inputs)
        variants.append([loss_and_grads(m2, m2, inputs)[1]
                         for m2 in (kinks.flip(at_point(), tie) for tie in found.ties())])
    return variants


def judge_losses(ours: list, eagers: list, f64: list) -> list[str]:
    """Each step's loss: within OUT_RTOL of an eager run's, or about as close to float64's as the
    eager runs are (the farther of them: each is a float32 computation a user gets)."""
    problems = []
    for k, (a, d) in enumerate(zip(ours, f64)):
        err = min(rel_max(a, e[k]) for e in eagers)
        eager_to_f64 = max(rel_max(e[k], d) for e in eagers)
        if err > OUT_RTOL and rel_max(a, d) > max(F64_FACTOR * eager_to_f64, NOISE):
            problems.append(f"step {k + 1} loss {err:.1e} from eager; float64 distance ours "
                            f"{rel_max(a, d):.1e}, eager {eager_to_f64:.1e}")
    return problems


def judge_grads(ours: list, eagers: list, f64: list, names: list, r: Result, ties: list | None = None) -> str:
    """The worst gradient (relative L2 to the nearer eager run's) over both steps, and whether
    float64 excuses it: ours at most F64_FACTOR times as far from it as the farther eager run.
    A gradient below FLOOR of its step's whole gradient norm (a bias that BatchNorm cancels: zero
    in exact arithmetic) is measured against that floor: its value is rounding noise in eager too.
    ``ties`` (tie_variants): per step, float64 gradients with one near-kink activation on its
    other side; ours is measured against the one of those and float64's own that is nearest to
    it over the whole step (eager against float64's own)."""
    worst = (-1.0, None)
    for step in range(len(ours)):
        floor = FLOOR * float(torch.cat([d.double().flatten() for d in f64[step]]).norm())
        flat = torch.cat([o.double().flatten() for o in ours[step]])
        referee = min([f64[step]] + (ties[step] if ties else []),
                      key=lambda v: float((flat - torch.cat([d.double().flatten() for d in v])).norm()))
        for i, (name, o, d) in enumerate(zip(names, ours[step], referee)):
            err = min(rel_l2(o, e[step][i], floor) for e in eagers)
            if err > worst[0]:
                eager_to_f64 = max(rel_l2(e[step][i], f64[step][i], floor) for e in eagers)
                worst = (err, (step, name, rel_l2(o, d, floor), eager_to_f64))
    r.grad_l2, (step, name, to_f64, eager_to_f64) = worst[0], worst[1]
    r.grad_f64 = (to_f64, eager_to_f64)
    if r.grad_l2 <= GRAD_RTOL or to_f64 <= max(F64_FACTOR * eager_to_f64, NOISE):
        return ""
    return (f"step {step + 1} grad of {name}: {r.grad_l2:.1e} from eager; float64 distance ours "
            f"{to_f64:.1e}, eager {eager_to_f64:.1e}")


def run_one(name: str) -> Result:
    r = Result(name)
    start = time.perf_counter()
    fallbacks = FallbackLog()
    logging.getLogger("minicompile").addHandler(fallbacks)
    try:
        torch.manual_seed(0)
        model, inputs = MODELS[name]()
        r.infer_err = infer(model, inputs)
        torch._dynamo.reset()
        ref_losses, ref_grads, points = train(model, inputs, compiled=False)
        eager_losses, eager_grads = [ref_losses], [ref_grads]
        if any(p.dim() == 4 for p in model.parameters()):   # convolutions: eager channels-last too
            cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
            cl_inputs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs]
            cl_losses, cl_grads, _ = train(cl, cl_inputs, compiled=False, points=points)
            eager_losses.append(cl_losses)
            eager_grads.append(cl_grads)
        losses, grads, _ = train(model, inputs, compiled=True, points=points)
        wide = [x.double() if x.is_floating_point() else x for x in inputs]
        f64_losses, f64_grads, _ = train(model.double(), wide, compiled=False, points=points)
        r.loss_err = max(min(rel_max(a, e[k]) for e in eager_losses) for k, a in enumerate(losses))
        names = [n for n, _ in model.named_parameters()]
        problems = [f"inference output {r.infer_err:.1e} from eager"] if r.infer_err > OUT_RTOL else []
        problems += judge_losses(losses, eager_losses, f64_losses)
        grad_problem = judge_grads(grads, eager_grads, f64_grads, names, r)
        if grad_problem:   # a second opinion: activations within rounding of a kink, either side
            grad_problem = judge_grads(grads, eager_grads, f64_grads, names, r, tie_variants(model, wide, points))
        problems += [grad_problem] if grad_problem else []
        if problems:
            r.status, r.detail = "wrong", "; ".join(problems)
    except Exception as e:
        r.status, r.detail = "crash", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    r.graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    r.fallbacks = sorted(set(fallbacks.messages))
    if r.status == "ok" and r.fallbacks:
        r.status = "fallback"
    if r.status != "ok" and name in PENDING:
        r.status, r.detail = "pending", f"{PENDING[name]}; {r.detail}"
    r.seconds = time.perf_counter() - start
    return r


# ------------------------------------------------------------------------------- the table

def run_isolated(name: str, timeout: float) -> Result:
    """One model in a fresh process (a hard crash or a hang costs that row only)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    if MODELS[name].library == "transformers":   # transformers reads torchvision's version: not timm's stand-in
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if not os.path.isdir(os.path.join(p, "torchvision")))
    cmd = [sys.executable, "-m", "minicompile.testing.tryout_models", "--one", name]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result(name, "crash", detail=f"timed out after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            r = json.loads(line)
            return Result(**{**r, "grad_f64": tuple(r["grad_f64"]) if r["grad_f64"] else None})
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return Result(name, "crash", detail=f"the process died (rc {proc.returncode}): {tail[:300]}")


def _e(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def format_table(results: list[Result]) -> str:
    lines = ["| model | status | inference | losses | worst grad (vs eager) | its float64 distance: ours / eager's "
             "| graph breaks | s |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        f64 = "-" if not r.grad_f64 else f"{r.grad_f64[0]:.1e} / {r.grad_f64[1]:.1e}"
        lines.append(f"| {r.model} | {r.status} | {_e(r.infer_err)} | {_e(r.loss_err)} | {_e(r.grad_l2)} | {f64} "
                     f"| {r.graph_breaks} | {r.seconds:.0f} |")
    notes = [f"- {r.model}: {r.detail}" + "".join(f"\n  - {m}" for m in r.fallbacks)
             for r in results if r.detail or r.fallbacks]
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "wrong", "crash", "fallback", "pending")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return "\n".join(lines + [""] + notes + ["", f"{len(results)} models: {summary}"])


def load(paths: list[str]) -> list[Result]:
    rows = [r for path in paths for r in json.load(open(path))]
    return [Result(**{**r, "grad_f64": tuple(r["grad_f64"]) if r["grad_f64"] else None}) for r in rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated names (default: all): " + ",".join(MODELS))
    ap.add_argument("--one", help=argparse.SUPPRESS)   # the worker: one model, a JSON line out
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    ap.add_argument("--json", help="write the results here too, after every model")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier --json runs, merged")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one).__dict__))
        return 0
    if args.table:
        results = load(args.table)
        print(format_table(results))
        return 0 if all(r.status in ("ok", "pending") for r in results) else 1
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    results = []
    for name in names:
        results.append(run_isolated(name, args.timeout))
        r = results[-1]
        print(f"{name}: {r.status} ({r.seconds:.0f} s) {r.detail}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([r.__dict__ for r in results], f, indent=1)
    print(format_table(results))
    return 0 if all(r.status in ("ok", "pending") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
