"""Every minicompile knob, in one place.

Each knob has a default and an environment variable read at import time. Tests and
users change knobs for a block of code with ``config.patch``::

    with minicompile.config.patch(cpu_backend="triton"):
        ...

``torch.compile(mode=..., options={...})`` sets knobs for one compiled graph: ``MODES`` says
which knobs a mode sets, ``options`` names knobs (or Inductor's names for them,
``OPTION_ALIASES``); ``graph_knobs`` checks both (docs/modes.md).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields


def _env(name: str, default, kind=str):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return kind(raw)


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minicompile")


@dataclass
class Config:
    # MINICOMPILE_DEBUG=0..5: the debug ladder documented in the README.
    debug: int = _env("MINICOMPILE_DEBUG", 0, int)
    # Where compiled kernels (and Triton's own cache) live.
    cache_dir: str = _env("MINICOMPILE_CACHE_DIR", _default_cache_dir())
    # The C++ compiler; falls back to $CXX, then g++, then c++.
    cxx: str = _env("MINICOMPILE_CXX", os.environ.get("CXX", ""))
    # Code generator for CPU tensors: "cpp" (default) or "triton" (runs under TRITON_INTERPRET=1).
    cpu_backend: str = _env("MINICOMPILE_CPU_BACKEND", "cpp")
    # Recompiles per code object in minicompile.compile before running eagerly.
    recompile_limit: int = _env("MINICOMPILE_RECOMPILE_LIMIT", 8, int)
    # A pointwise value read by more consumers than this is computed once into a buffer.
    realize_reads_threshold: int = _env("MINICOMPILE_REALIZE_READS", 4, int)
    # A pointwise value whose body has more ops than this is computed once into a buffer.
    realize_opcount_threshold: int = _env("MINICOMPILE_REALIZE_OPS", 30, int)
    # A pointwise value read twice or more that loads more buffers than this is computed once:
    # a residual stream x + f(x) inlined block after block would reload every f(x) so far.
    # 4, not 8: Swin's patch-merging LayerNorm recomputed a 6-buffer window/roll/residual chain
    # through gather indices inside its reduction (Swin 16.2 -> 12.9 ms, ConvNeXt 11.3 -> 9.5 ms
    # on one thread; ViT and GPT-2 unchanged within noise).
    realize_loads_threshold: int = _env("MINICOMPILE_REALIZE_LOADS", 4, int)
    # Turn the fusion scheduler off (one kernel per realized buffer), for debugging.
    fusion: bool = _env("MINICOMPILE_FUSION", True, bool)
    # An internal compiler error runs the graph eagerly (with a warning) instead of raising.
    fallback_on_error: bool = _env("MINICOMPILE_FALLBACK", True, bool)
    # Smallest loop (in elements) worth running on several OpenMP threads.
    parallel_threshold: int = _env("MINICOMPILE_PARALLEL_THRESHOLD", 32768, int)
    # C++: consecutive independent pointwise kernels run as one call with one OpenMP parallel
    # region and no barrier between them (codegen/cpp_groups.py; docs/optimizer.md).
    horizontal_groups: bool = _env("MINICOMPILE_HORIZONTAL", True, bool)
    # Triton: a reduction whose row (rounded up to a power of two) is at most this many elements
    # holds the whole row in registers (persistent); longer rows loop over RBLOCK-sized chunks.
    triton_persistent_rnumel: int = _env("MINICOMPILE_TRITON_PERSISTENT_RNUMEL", 4096, int)
    # CPU attention: "auto" keeps eager's fused flash kernel (an extern call) for a shape where it
    # measured faster than the decomposed math form on this machine (aot/cpu_policy.py); "math"
    # or "flash" pins the choice.
    cpu_attention: str = _env("MINICOMPILE_CPU_ATTENTION", "auto")
    # CPU float32 matrix products: "auto" runs each shape with MKL's sgemm (aten.mm) or oneDNN's
    # matmul, whichever measured faster on this machine (aot/cpu_policy.py); "mkl" or "onednn" pins it.
    cpu_gemm: str = _env("MINICOMPILE_CPU_GEMM", "auto")
    # "eager" pins every library choice that changes numerics to the call eager makes: matrix
    # products through MKL's sgemm (aten.mm, as cpu_gemm="mkl") and attention through eager's fused
    # kernel wherever eager ran it (as cpu_attention="flash"); "measured" leaves them to the knobs above.
    cpu_libraries: str = _env("MINICOMPILE_CPU_LIBRARIES", "measured")
    # CPU float32 convolutions run channels-last: inference (aot/conv_layout.py) and training,
    # forward and backward (aot/conv_layout_train.py).
    conv_channels_last: bool = _env("MINICOMPILE_CONV_CHANNELS_LAST", True, bool)
    # Inference: "auto" keeps a graph channels-last only where its convolutions, measured both
    # ways on this machine (weight conversions included unless weights are prepared), run faster
    # so (aot/conv_layout.py); "channels_last" converts every CPU float32 convolution graph.
    conv_layout: str = _env("MINICOMPILE_CONV_LAYOUT", "auto")
    # Inference on CPU: values computed from parameters and buffers alone (channels-last weights,
    # BatchNorm folded into the convolution before it) are computed once per version of those
    # tensors, not on every call (aot/prepare.py, runtime/prepared.py). Off by default, as
    # Inductor's freezing: a write through ``p.data`` moves no version counter, so a prepared
    # value would go stale silently. options={"freezing": True} turns it on for one model.
    prepare_weights: bool = _env("MINICOMPILE_PREPARE_WEIGHTS", False, bool)
    # CPU buffers of 64 KiB or more that the wrapper allocates are kept for reuse (up to this
    # many MiB) once nothing references them, so their pages stay mapped; 0 turns it off.
    host_pool_mb: int = _env("MINICOMPILE_HOST_POOL_MB", 2048, int)
    # Triton on a GPU: time a few block sizes / num_warps per kernel and shape (cached on disk).
    triton_autotune: bool = _env("MINICOMPILE_TRITON_AUTOTUNE", True, bool)
    # Search harder: Triton times more block sizes / num_warps; on CPU a few variants of the whole
    # graph (parallel threshold, realization) are built and the fastest is kept (docs/modes.md).
    max_autotune: bool = _env("MINICOMPILE_MAX_AUTOTUNE", False, bool)
    # CUDA graphs: a graph on CUDA tensors is recorded once per input shape and replayed
    # (runtime/cudagraphs.py). No effect on CPU tensors.
    cudagraphs: bool = _env("MINICOMPILE_CUDAGRAPHS", False, bool)
    # Training graphs: how the joint forward/backward graph is split (aot/partition.py). "min_cut"
    # saves the cheapest set of values for backward, recomputing cheap elementwise chains;
    # "save_all" saves every forward value backward reads.
    partitioner: str = _env("MINICOMPILE_PARTITIONER", "min_cut")
    # Every compiled graph also runs eagerly on the same inputs; the first call whose outputs differ
    # names the kernel that diverges first and writes a reproducer (testing/check.py; README).
    check: bool = _env("MINICOMPILE_CHECK", False, bool)


config = Config()


# torch.compile(mode=...): the knobs each mode sets (as Inductor's modes do).
MODES = {
    None: {},
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton_autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "triton_autotune": True},
}

# torch.compile(options={...}): Inductor's names for the knobs we share, besides our own knob names.
OPTION_ALIASES = {
    "triton.cudagraphs": "cudagraphs",
    "triton.autotune_pointwise": "triton_autotune",
    "freezing": "prepare_weights",
}

# Knobs that make no sense for one graph: the capture front end's limit is per code object.
PROCESS_KNOBS = ("recompile_limit",)

# Knobs a compiled graph reads while it runs, not only while it is compiled: options setting
# them are applied around each call of that graph (every other knob is read at compile time).
CALL_TIME_KNOBS = ("host_pool_mb", "cache_dir")


def option_names() -> list:
    """Every key ``options`` accepts: our knob names and the Inductor aliases."""
    knobs = [f.name for f in fields(Config) if f.name not in PROCESS_KNOBS]
    return sorted(knobs + list(OPTION_ALIASES))


def graph_knobs(mode=None, options=None) -> dict:
    """The knob changes ``torch.compile(mode=..., options=...)`` asks for; bad input is a clear error."""
    if mode not in MODES:
        valid = ", ".join(repr(m) for m in MODES)
        raise ValueError(f"minicompile: unknown mode {mode!r}; valid modes: {valid}")
    changes = dict(MODES[mode])
    known = option_names()
    unknown = sorted(k for k in (options or {}) if k not in known)
    if unknown:
        raise ValueError(f"minicompile: unknown option(s) {unknown}; known options: {', '.join(known)} "
                         f"(docs/modes.md says what each does)")
    for key, value in (options or {}).items():
        knob = OPTION_ALIASES.get(key, key)
        changes[knob] = _checked(knob, key, value)
    return changes


def _checked(knob: str, key: str, value):
    kind = type(getattr(Config, knob))
    ok = isinstance(value, kind) or (kind is bool and value in (0, 1))
    if not ok:
        raise TypeError(f"minicompile: option {key!r} must be of type {kind.__name__}, got {value!r}")
    return kind(value)


@contextlib.contextmanager
def patch(**changes):
    """Set knobs for the duration of a ``with`` block, then restore them."""
    names = {f.name for f in fields(Config)}
    unknown = set(changes) - names
    if unknown:
        raise AttributeError(f"unknown minicompile config knob(s): {sorted(unknown)}; known: {sorted(names)}")
    saved = {k: getattr(config, k) for k in changes}
    for k, v in changes.items():
        setattr(config, k, v)
    try:
        yield config
    finally:
        for k, v in saved.items():
            setattr(config, k, v)
