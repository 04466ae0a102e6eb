"""Sweep real models (HF transformers from small configs, timm via the stubs) against eager.

For each model, in its own process with a timeout (one thread), five checks:

    infer   torch.compile(backend="minicompile"), no_grad, float32: max abs diff, graphs, breaks
    train   a backward (sum of squares of the first output, eval mode): grads against eager
    ours    minicompile.compile(model) (the bytecode front end), no_grad
    ours_train  the training step through minicompile.compile
    shape2  the compiled model of ``infer`` at a second sequence length / batch: recompiles
    bf16    model.to(bfloat16): error against the float32 result, beside eager bf16's own error

Every check runs with MINICOMPILE_FALLBACK=0; a check that raises is run again with fallbacks on:
if it passes then it is a "fallback" (the reason is the raised error), otherwise a "crash". A graph
minicompile runs eagerly by design (its "... runs eagerly" warning) is a "fallback" too.

    PYTHONPATH=. python benchmarks/sweep_models.py [names...]   # timm models get SWEEP_STUBS on their path
    python benchmarks/sweep_models.py --one NAME [CHECK ...]      # one model, in this process
    SWEEP_CHECKS=train,bf16 python benchmarks/sweep_models.py NAME ...   # some of the checks
    python benchmarks/sweep_models.py --list
    python benchmarks/sweep_models.py --table OUT.jsonl           # the JSON lines as a markdown table
"""
from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from hf_models import tensors  # noqa: E402  (every tensor in a model output; this script's folder is on sys.path)

VOCAB, SEQ, SEQ2 = 1000, 16, 24
STUBS = os.environ.get("SWEEP_STUBS", "/work/shared/stubs")   # timm's torchvision stand-in
CHECKS = ("infer", "train", "ours", "ours_train", "shape2", "bf16")


# ---------------------------------------------------------------- models

def _hf():
    import transformers as T
    T.logging.set_verbosity_error()
    dec = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
               vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    enc = {k: v for k, v in dec.items() if "token" not in k} | dict(pad_token_id=1)
    s2s = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
               max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=1,
               decoder_start_token_id=0)
    vit = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128)
    kv = dict(num_key_value_heads=2)
    return {
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=8, **kv, **dec)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**kv, **dec)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=16, **kv, **dec)),
        "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**dec)),
        "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**kv, **dec)),
        "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(head_dim=16, **kv, **dec)),
        "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=16, sliding_window=8, **kv, **dec)),
        "stablelm": lambda: T.StableLmForCausalLM(T.StableLmConfig(**kv, **dec)),
        "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
            bos_token_id=0, eos_token_id=1)),
        "opt": lambda: T.OPTForCausalLM(T.OPTConfig(
            hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4, word_embed_proj_dim=64,
            vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=1)),
        "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                                          bos_token_id=0, eos_token_id=1, pad_token_id=1)),
        "gpt_neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
            hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=8,
            vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=0, eos_token_id=1)),
        "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(n_layer=2, n_head=4, n_embd=64, rotary_dim=8,
                                                       vocab_size=VOCAB, n_positions=128, bos_token_id=0,
                                                       eos_token_id=1)),
        "gpt_bigcode": lambda: T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(
            n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=1)),
        "roberta": lambda: T.RobertaModel(T.RobertaConfig(**enc)),
        "xlm_roberta": lambda: T.XLMRobertaForMaskedLM(T.XLMRobertaConfig(**enc)),
        "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(
            n_layers=2, n_heads=4, dim=64, hidden_dim=128, vocab_size=VOCAB, max_position_embeddings=128)),
        "albert": lambda: T.AlbertModel(T.AlbertConfig(embedding_size=32, **enc)),
        "electra": lambda: T.ElectraModel(T.ElectraConfig(embedding_size=32, **enc)),
        "deberta_v2": lambda: T.DebertaV2Model(T.DebertaV2Config(**enc)),
        "mobilebert": lambda: T.MobileBertModel(T.MobileBertConfig(
            embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2, **enc)),
        "bart": lambda: T.BartForConditionalGeneration(T.BartConfig(**s2s)),
        "mbart": lambda: T.MBartForConditionalGeneration(T.MBartConfig(**s2s)),
        "whisper_enc": lambda: T.WhisperModel(T.WhisperConfig(
            num_mel_bins=8, max_source_positions=16, max_target_positions=64,
            **{k: v for k, v in s2s.items() if k != "max_position_embeddings"})).encoder,
        "vit": lambda: T.ViTModel(T.ViTConfig(**vit)),
        "deit": lambda: T.DeiTModel(T.DeiTConfig(**vit)),
        "clip_vision": lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**vit)),
        "clip_text": lambda: T.CLIPTextModel(T.CLIPTextConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1)),
        "swin": lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                                                 num_heads=[2, 2], window_size=4)),
        "convnext": lambda: T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
        "resnet": lambda: T.ResNetModel(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])),
        "wav2vec2": lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)),
        "segformer": lambda: T.SegformerModel(T.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
            patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
    }


TIMM = ["resnet18", "resnext26ts", "regnetx_002", "efficientnet_b0", "mobilenetv3_small_050", "convnext_atto",
        "vit_tiny_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "mixer_s32_224",
        "poolformer_s12", "levit_128s", "ghostnet_050", "mobilevit_xxs", "densenet121", "dla34", "cait_xxs24_224", "pvt_v2_b0", "tinynet_e", "lcnet_050"]
_TIMM_KW = {"vit_tiny_patch16_224": dict(depth=2, img_size=64), "deit_tiny_patch16_224": dict(depth=2, img_size=64),
            "swin_tiny_patch4_window7_224": dict(depths=(1, 1), num_heads=(2, 4), embed_dim=32, img_size=64,
                                                 window_size=4),
            "mixer_s32_224": dict(img_size=64), "cait_xxs24_224": dict(depth=2, img_size=64),
            "levit_128s": dict(img_size=64)}


def names() -> list:
    return list(_hf()) + ["timm:" + n for n in TIMM]


def make(name: str, second: bool = False):
    """(model in eval mode, forward kwargs); ``second``: the second sequence length or batch."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    batch = 3 if second else 2
    if name.startswith("timm:"):
        import timm
        n = name[5:]
        model = timm.create_model(n, pretrained=False, num_classes=10, **_TIMM_KW.get(n, {})).eval()
        size = _TIMM_KW.get(n, {}).get("img_size", 64)
        with torch.no_grad():   # zero-initialised heads and last norms (timm's) would compare zeros with zeros
            for pname, p in model.named_parameters():
                if pname.endswith("weight") and not p.any():
                    p.normal_(1.0 if p.dim() == 1 else 0.0, 0.1 if p.dim() == 1 else 0.02)
        return model, dict(x=torch.randn(batch, 3, size, size, generator=g))
    model = _hf()[name]().eval()
    seq = SEQ2 if second else SEQ
    if name in ("vit", "deit", "clip_vision", "swin", "convnext", "resnet", "segformer"):
        return model, dict(pixel_values=torch.randn(batch, 3, 32, 32, generator=g))
    if name == "whisper_enc":
        return model, dict(input_features=torch.randn(batch, 8, 32, generator=g))
    if name == "wav2vec2":
        return model, dict(input_values=torch.randn(batch, 400 + 80 * second, generator=g))
    ids = torch.randint(2, VOCAB, (2, seq), generator=g)
    if name in ("bart", "mbart"):
        return model, dict(input_ids=ids, decoder_input_ids=ids[:, : seq // 2])
    return model, dict(input_ids=ids)


# ---------------------------------------------------------------- checks

def _judge(expected, actual) -> tuple:
    from minicompile.testing.compare import mismatch
    exp, act = tensors(expected), tensors(actual)
    err = max([(e.double() - a.double()).abs().max().item() for e, a in zip(exp, act)
               if e.is_floating_point() and e.shape == a.shape and e.numel()] or [0.0])
    return mismatch(exp, act, strides=False), err


def _graphs():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _first(out):
    return next(t for t in tensors(out) if t.is_floating_point())


def run_check(name: str, check: str) -> dict:
    import torch._dynamo
    import minicompile
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, kw = make(name)
    if check in ("infer", "shape2", "ours"):
        with torch.no_grad():
            expected = model(**kw)
            cm = minicompile.compile(model) if check == "ours" else torch.compile(model, backend="minicompile")
            got = cm(**kw)
            wrong, err = _judge(expected, got)
            res = dict(err=err, wrong=wrong)
            if check == "shape2":
                g1 = _graphs()[0]
                model2, kw2 = make(name, second=True)
                wrong, err = _judge(model(**kw2), cm(**kw2))
                res = dict(err=err, wrong=wrong, recompiles=_graphs()[0] - g1)
        graphs, breaks = _graphs()
        return res | ({} if check == "ours" else dict(graphs=graphs, breaks=breaks))
    if check in ("train", "ours_train"):
        twin = copy.deepcopy(model)
        out = _first(model(**kw))   # a random projection: LayerNorm's output has a fixed mean square
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        (out * weight).mean().backward()
        cm = minicompile.compile(twin) if check == "ours_train" else torch.compile(twin, backend="minicompile")
        (_first(cm(**kw)) * weight).mean().backward()
        pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters())]
        # a parameter the loss does not reach (BERT's pooler): None in eager, zeros through
        # AOTAutograd's backward (Inductor's too); anything else on one side only is wrong
        zeroed = sum(a is None and b is not None and not b.any() for a, b in pairs)
        pairs = [(a, b) for a, b in pairs if a is not None or b is None or b.any()]
        if any((a is None) != (b is None) for a, b in pairs):
            return dict(wrong="a grad is None on one side only")
        from minicompile.testing.compare import mismatch, same_tolerance
        eg, cg = [a for a, _ in pairs if a is not None], [b for _, b in pairs if b is not None]
        scale = max(g.abs().max().item() for g in eg) or 1.0
        wrong = mismatch(eg, cg, strides=False, tolerances=same_tolerance(1e-3, 1e-5 * scale))
        err = max((a - b).abs().max().item() for a, b in zip(eg, cg)) / scale
        graphs, breaks = _graphs()
        return dict(err=err, wrong=wrong, graphs=graphs, breaks=breaks, zero_for_none=zeroed)
    if check == "bf16":
        with torch.no_grad():
            ref = _first(model(**kw)).double()
            model.to(torch.bfloat16)
            kwb = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in kw.items()}
            eager = _first(model(**kwb)).double()
            got = _first(torch.compile(model, backend="minicompile")(**kwb)).double()
        e_err, c_err = (eager - ref).abs().max().item(), (got - ref).abs().max().item()
        wrong = None if c_err <= 2 * e_err + 1e-2 * ref.abs().max().item() else f"bf16 err {c_err:.3g} vs eager {e_err:.3g}"
        return dict(err=c_err, eager_err=e_err, wrong=wrong)
    raise ValueError(check)


class _Eager(logging.Handler):
    """minicompile's "... runs eagerly" warnings: a graph it ran eagerly by design (no exception)."""
    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []

    def emit(self, record):
        if "eager" in (msg := record.getMessage()):
            self.seen.append(msg.removeprefix("minicompile: ")[:300])


def one(name: str, checks) -> None:
    """Runs the checks in this process; prints one JSON line per check."""
    from minicompile.config import config
    for check in checks:
        t0 = time.time()
        for fallback in (False, True):
            config.fallback_on_error = fallback
            logging.getLogger("minicompile").addHandler(eager := _Eager())
            try:
                res = run_check(name, check)
                res["status"] = ("wrong" if res.get("wrong") else "ok") if not fallback else "fallback"
                if eager.seen and res["status"] == "ok":
                    res.update(status="fallback", error=eager.seen[0])
                break
            except Exception as e:   # noqa: BLE001 - the sweep records every failure
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                if not fallback:
                    first = msg
                res = dict(status="crash", error=msg)
            finally:
                logging.getLogger("minicompile").removeHandler(eager)
        if res["status"] == "fallback" and "error" not in res:
            res["error"] = first
        print("SWEEP " + json.dumps(dict(name=name, check=check, secs=round(time.time() - t0, 1), **res)), flush=True)


def table(lines) -> str:
    """A markdown table (model x check) from the sweep's JSON lines."""
    cells: dict = {}
    for ln in lines:
        r = json.loads(ln)
        st = r["status"]
        cell = {"ok": f"ok {r.get('err', 0):.0e}", "wrong": f"WRONG {r.get('wrong')}"}.get(st, f"{st}: {r.get('error')}")
        if st == "ok" and r.get("breaks"):
            cell += f" ({r['graphs']} graphs, {r['breaks']} breaks)"
        if st == "ok" and r.get("recompiles", 1) > 1:
            cell += f" ({r['recompiles']} recompiles)"
        cells.setdefault(r["name"], {})[r["check"]] = cell.replace("|", "/")
    rows = ["| model | " + " | ".join(CHECKS) + " |", "|---" * (len(CHECKS) + 1) + "|"]
    rows += [f"| {n} | " + " | ".join(c.get(k, "") for k in CHECKS) + " |" for n, c in cells.items()]
    return "\n".join(rows)


def main(argv) -> None:
    if argv[:1] == ["--table"]:
        print(table(open(argv[1]).read().splitlines()))
        return
    if argv[:1] == ["--list"]:
        print("\n".join(names()))
        return
    if argv[:1] == ["--one"]:
        one(argv[1], argv[2:] or CHECKS)
        return
    timeout = int(os.environ.get("SWEEP_TIMEOUT", "600"))
    env = dict(os.environ, MINICOMPILE_FALLBACK="0", OMP_NUM_THREADS="1")
    checks = tuple(os.environ.get("SWEEP_CHECKS", ",".join(CHECKS)).split(","))
    for name in argv or names():
        # timm imports torchvision: the stubs for timm only (transformers' vision models reject their version)
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "stubs" not in p]
        path += [STUBS] if name.startswith("timm:") else []
        try:
            p = subprocess.run([sys.executable, __file__, "--one", name, *checks], env=env | dict(PYTHONPATH=os.pathsep.join(path)),
                               timeout=timeout,
                               capture_output=True, text=True)
            out, tail = p.stdout, (p.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired as e:
            out, tail = (e.stdout or b"").decode(), "timeout"
        done = [json.loads(ln[6:]) for ln in out.splitlines() if ln.startswith("SWEEP ")]
        for res in done:
            print(json.dumps(res), flush=True)
        for check in checks[len(done):]:
            print(json.dumps(dict(name=name, check=check, status="crash", error=tail)), flush=True)
            tail = "not run"

if __name__ == "__main__":
    main(sys.argv[1:])
