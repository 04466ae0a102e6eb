"""max-autotune on CPU: time compiled variants of one graph, remember the fastest on disk.

The backend builds a few variants of a graph (the same graph under different code-generation
knobs, backend.py ``CPU_VARIANTS``) and asks ``fastest`` which one to keep. Each variant runs
the whole graph on copies of the example inputs (never the caller's tensors: a graph may
mutate its inputs), once to warm up, then until ``MIN_RUNS`` runs and ``BUDGET_S`` seconds
have passed; the median decides. The winner's name is stored under the graph's key (a hash
of its kernel and wrapper source), so the next process compiling the same graph builds only
the winner.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
from typing import Callable

import torch

from minicompile.runtime import cache
from minicompile.runtime.cpp_build import wait_for_background_builds
from minicompile.runtime.host_pool import copy_with_layout

log = logging.getLogger("minicompile")

MIN_RUNS = 5
BUDGET_S = 0.2


def fastest(variants: dict, example_args: list) -> tuple[str, dict]:
    """(name of the fastest variant, name -> median seconds per call); ``variants`` maps a name
    to ``run(args_tuple)``. A variant that fails to run is left out."""
    timings = {}
    for name, run in variants.items():
        try:
            timings[name] = median_call_time(run, example_args)
        except Exception:  # noqa: BLE001 - a variant that does not run is not a candidate
            continue
    if not timings:
        raise RuntimeError("max-autotune: no variant of this graph ran on its example inputs")
    return min(timings, key=timings.get), timings


def before_timing() -> None:
    """On several threads, wait for this process's g++ in the background first: it holds a core the
    threads wait for at each barrier, and the inflated answer is kept on disk (one thread has its own)."""
    if torch.get_num_threads() > 1:
        wait_for_background_builds()


def median_call_time(run: Callable, example_args: list) -> float:
    before_timing()
    args = tuple(copy_with_layout(a) if isinstance(a, torch.Tensor) else a for a in example_args)
    run(args)
    times = []
    start = time.perf_counter()
    while len(times) < MIN_RUNS or time.perf_counter() - start < BUDGET_S:
        t0 = time.perf_counter()
        run(args)
        times.append(time.perf_counter() - t0)
        if len(times) >= 10 * MIN_RUNS:
            break
    return statistics.median(times)


def _path(key: str) -> str:
    return os.path.join(cache.entry_dir("cpu-autotune", key), "choice.json")


def load_choice(key: str) -> str | None:
    path = _path(key)
    if not cache.is_valid(path):
        return None
    with open(path) as f:
        return json.load(f)["variant"]


def load_timings(key: str) -> dict | None:
    path = _path(key)
    if not cache.is_valid(path):
        return None
    with open(path) as f:
        times = json.load(f).get("median_seconds")
    return times if isinstance(times, dict) and all(isinstance(t, (int, float)) for t in times.values()) else None


def save_choice(key: str, variant: str, timings: dict) -> None:
    path = _path(key)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"variant": variant, "median_seconds": timings}, f, indent=1)
    cache.commit(tmp, path)
