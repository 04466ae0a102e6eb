"""Cold compile time: one compiler, one workload, its first call, in a fresh process with empty caches.

    python -m minicompile.tools.cold_compile --kind train|train_models|models --workload NAME --size SIZE
                                              --compiler minicompile|inductor|eager --result FILE.json
                                              [--autocast bf16|fp16] [--mode max-autotune]

``bench --train``, ``bench --train --models`` and ``bench --models`` time both compilers in one process, where the second
compile of anything is not cold: Dynamo, Inductor and minicompile keep in-memory caches, and
whoever compiles first pays the process's one-time costs. So each compiler's cold compile of
each workload is measured here instead, alone in a new process whose every cache starts empty:

- ``MINICOMPILE_CACHE_DIR``: minicompile's built kernels (and autotuning results).
- ``TORCHINDUCTOR_CACHE_DIR``: Inductor's FX graph cache (fxgraph/), AOTAutograd cache, built
  C++ libraries and Python modules, Dynamo's automatic-dynamic (PGO) state (dynamo/).
- ``TMPDIR``: Inductor's precompiled header of its C++ prelude is NOT under
  TORCHINDUCTOR_CACHE_DIR but in ``tempfile.gettempdir()/torchinductor_<user>/precompiled_headers``
  (torch/_inductor/codecache.py, ``_HEADER_DIR``, "global, rather than ignored by fresh_cache"):
  built once per machine and reused by every later process unless TMPDIR moves it.
- ``TRITON_CACHE_DIR``: Triton's compiled kernels (CUDA, or TRITON_INTERPRET).
- in-memory caches (Dynamo's, Inductor's PyCodeCache and lru_caches, our loaded libraries):
  the process is new.

All of them point into one new temporary directory per measurement. Timed: the first call of
``torch.compile(model, ...)`` (training: the first forward and backward), Dynamo's capture
included, after torch is imported, the model built and run eagerly once, and the compiler's
own package imported through Dynamo's backend registry (reported apart as ``import_s``; Inductor's
is the larger).
``--compiler eager`` (Dynamo's ``backend="eager"``) measures the floor both compilers share:
Dynamo's capture and an eager first step.
The callers pass the minicompile settings of their timed run (``bench --train``: compile errors
raise, MINICOMPILE_FALLBACK=0, so a cold time is never an eager fallback's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from minicompile.tools.models import MODELS
from minicompile.tools.train_models import TRAIN_MODELS
from minicompile.tools.workloads import build_train



def cold_env(tmp: str, **extra) -> dict:
    """The environment of a process whose every compile cache is a new directory under ``tmp``."""
    env = dict(os.environ, MINICOMPILE_CACHE_DIR=os.path.join(tmp, "minicompile"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
               TMPDIR=os.path.join(tmp, "tmp"), HF_HUB_OFFLINE="1", **extra)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    env.pop("MINICOMPILE_DEBUG", None)
    return env


def measure(kind: str, workload: str, size: str, compiler: str, autocast: str | None = None,
            batch: int | None = None, dtype: str | None = None, mode: str | None = None, **env) -> dict:
    """``{"compile_s", "import_s"}`` of ``compiler``'s cold compile, or ``{"error": ...}``; ``env``:
    more environment variables for the process (``MINICOMPILE_FALLBACK="0"`` to raise on errors);
    ``autocast`` ("bf16", "fp16"; train_models and models): the forward runs under CPU autocast;
    ``batch``, ``dtype`` (models only): the inputs' batch size instead of the model's own, the
    model and its inputs in that dtype; ``mode``: torch.compile's mode."""
    with tempfile.TemporaryDirectory(prefix="minicompile-cold-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "minicompile.tools.cold_compile", "--kind", kind, "--workload", workload,
               "--size", size, "--compiler", compiler, "--result", out] + (["--autocast", autocast] if autocast else []) + \
            (["--batch", str(batch)] if batch else []) + (["--dtype", dtype] if dtype else []) + \
            (["--mode", mode] if mode else [])
        proc = subprocess.run(cmd, env=cold_env(tmp, **env), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
            return {"error": f"cold compile exited with status {proc.returncode}: " + " | ".join(tail)}
        with open(out) as f:
            return json.load(f)


# ---------------------------------------------------------------- in the fresh process

def _first_train_step(name: str, size: str):
    """A training workload's first step (forward + backward) as bench_train.setup makes it."""
    model, shape = build_train(name, size)
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    grad_out = torch.randn_like(model(x)).detach()

    def first_call(compile_fn):
        compile_fn(model)(x).backward(grad_out)
    return first_call


def _first_train_model_step(name: str, size: str, autocast: str | None = None):
    """A real model's first training step (its loss, then backward) as bench_train_models.setup makes it."""
    model, inputs = TRAIN_MODELS[name].build(size)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(autocast)

    def forward(fn):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            return fn(*inputs)
    forward(model).backward()
    model.zero_grad(set_to_none=True)

    def first_call(compile_fn):
        forward(compile_fn(model)).backward()
    return first_call


def _first_inference(name: str, size: str, batch: int | None = None, dtype: str | None = None,
                     autocast: str | None = None):
    """A real model's first call under no_grad, as bench_models.run_model makes it."""
    model, inputs = MODELS[name].build(size, batch, dtype, autocast)
    with torch.no_grad():
        model(*inputs)

    def first_call(compile_fn):
        with torch.no_grad():
            compile_fn(model)(*inputs)
    return first_call


FIRST_CALL = {"train": _first_train_step, "train_models": _first_train_model_step, "models": _first_inference}


def run(kind: str, workload: str, size: str, compiler: str, autocast: str | None = None,
        batch: int | None = None, dtype: str | None = None, mode: str | None = None) -> dict:
    given = dict(autocast=autocast, batch=batch, dtype=dtype)
    first_call = FIRST_CALL[kind](workload, size, **{k: v for k, v in given.items() if v})
    backend = compiler if compiler in ("minicompile", "eager") else "inductor"
    t0 = time.perf_counter()
    torch._dynamo.lookup_backend(backend)   # imports the compiler: Dynamo's registry loads it
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    first_call(lambda m: torch.compile(m, backend=backend, mode=mode))
    return {"compile_s": time.perf_counter() - t0, "import_s": import_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=sorted(FIRST_CALL), required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--compiler", choices=["inductor", "minicompile", "eager"], required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--autocast", choices=["bf16", "fp16"], help="train_models, models: the forward under CPU autocast")
    p.add_argument("--batch", type=int, help="models: the inputs' batch size")
    p.add_argument("--dtype", choices=["bf16", "fp16"], help="models: the model and its inputs in this dtype")
    p.add_argument("--mode", help="torch.compile's mode")
    args = p.parse_args(argv)
    result = run(args.kind, args.workload, args.size, args.compiler, args.autocast, args.batch, args.dtype, args.mode)
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
