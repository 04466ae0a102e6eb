"""Fine-tune a small Hugging Face GPT-2 the way people train: 20 AdamW steps under
``torch.autocast("cpu", torch.bfloat16)``, activation checkpointing on every block
(``gradient_checkpointing_enable``), and a new sequence length each step (16..128 in steps of 8).
The same model, data and optimizer run eagerly beside it; the script prints both loss curves,
how many graphs minicompile compiled, and whether any graph broke or ran eagerly, and exits
non-zero when a loss differs from eager's by more than bf16's tolerance.

    HF_HUB_OFFLINE=1 python examples/finetune_gpt2.py [--steps 20]
"""
import argparse
import copy
import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MINICOMPILE_FALLBACK", "0")   # a graph that cannot compile raises instead of running eagerly

import transformers  # noqa: E402

from minicompile.backend import minicompile_backend  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--rtol", type=float, default=0.01, help="largest relative loss difference accepted")
args = parser.parse_args()

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128,
                                 attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
model = transformers.GPT2LMHeadModel(config).train()
model.loss_type = "ForCausalLM"
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.config.use_cache = False   # as with any checkpointed model: else HF warns inside forward, a graph break
eager = copy.deepcopy(model)

graphs = []


def counting_backend(gm, example_inputs):
    graphs.append(gm)
    return minicompile_backend(gm, example_inputs)


torch._dynamo.reset()
torch._dynamo.utils.counters.clear()
compiled = torch.compile(model, backend=counting_backend)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
eager_opt = torch.optim.AdamW(eager.parameters(), lr=3e-3)
lengths = [16 + 8 * ((k * 7) % 15) for k in range(args.steps)]   # 16..128 in steps of 8, every length, shuffled

losses, eager_losses = [], []
for step, t in enumerate(lengths):
    start, step_size = torch.randint(0, 256, (2, 1)), torch.randint(1, 4, (2, 1))
    ids = (start + step_size * torch.arange(t)) % 256   # arithmetic sequences: a loss that can fall
    for net, optimizer, out in ((compiled, opt, losses), (eager, eager_opt, eager_losses)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append(loss.item())
    print(f"step {step:2d}  length {t:3d}  loss {losses[-1]:.4f}  eager {eager_losses[-1]:.4f}")

breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
worst = max(abs(a - b) / abs(b) for a, b in zip(losses, eager_losses))
print(f"graphs compiled: {len(graphs)}, graph breaks: {breaks}, "
      f"largest relative loss difference from eager: {worst:.2e} (tolerance {args.rtol})")
ok = worst <= args.rtol and breaks == 0
print("check vs eager:", "OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
