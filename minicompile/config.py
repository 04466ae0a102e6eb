"""Every minicompile knob, in one place.

Each knob has a default and an environment variable read at import time; ``knob`` declares
both with the values it accepts and the README's line for it, so one parser checks every
variable (a bad value is a ``ConfigError`` naming it) and ``readme_table`` makes the
README's table (``minicompile config`` prints the knobs as set now). Tests and users change knobs for a block of code with
``config.patch``, checked the same way::

    with minicompile.config.patch(cpu_backend="triton"):
        ...

``torch.compile(mode=..., options={...})`` sets knobs for one compiled graph: ``MODES`` says
which knobs a mode sets, ``options`` names knobs (or Inductor's names for them,
``OPTION_ALIASES``); ``graph_knobs`` checks both (docs/modes.md).
"""
from __future__ import annotations

import contextlib
import functools
import difflib
import os
import warnings
from dataclasses import dataclass, field, fields


class ConfigError(ValueError):
    """A knob set to a value it does not accept (environment, ``patch`` or ``options``)."""


@dataclass(frozen=True)
class Knob:
    """One knob's variable, default and accepted values, and the README's line for it."""
    env: str
    default: object
    doc: str
    choices: tuple = ()     # a string knob's accepted values (empty: any string)
    lo: int | None = None   # an integer knob's accepted range
    hi: int | None = None
    shown: str = ""         # the default as the README shows it, where it is computed

    def shown_default(self) -> str:
        return self.shown or (f"`{int(self.default)}`" if isinstance(self.default, bool) else f"`{self.default}`")

    def accepted(self) -> str:
        if isinstance(self.default, bool):
            return "1/0 (also true/false, yes/no, on/off)"
        if isinstance(self.default, int):
            if self.lo is not None and self.hi is not None:
                return f"an integer from {self.lo} to {self.hi}"
            return f"an integer >= {self.lo}" if self.lo is not None else "an integer"
        return ", ".join(repr(c) for c in self.choices) if self.choices else "a string"

    def check(self, value, where: str):
        """``value`` as this knob's type, or a ConfigError naming ``where`` and what it accepts."""
        bad = ConfigError(f"minicompile: {where} is {value!r}, which it does not accept; "
                          f"accepted: {self.accepted()} (default: {self.shown_default()})")
        kind = type(self.default)
        if isinstance(value, str) and kind is not str:
            text = value.strip().lower()
            if kind is bool:
                if text not in _TRUE + _FALSE:
                    raise bad
                return text in _TRUE
            try:
                value = int(text)
            except ValueError:
                raise bad from None
        if kind is bool and value in (0, 1) and not isinstance(value, float):
            value = bool(value)
        if type(value) is not kind or (self.choices and value not in self.choices):
            raise bad
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise bad
        return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def knob(env: str, default, doc: str, **limits):
    """A Config field read from ``env`` at import; a bad value is a ConfigError naming it."""
    spec = Knob(env, default, doc, **limits)
    raw = os.environ.get(env, "")
    value = default if raw == "" else spec.check(raw, env)
    return field(default=value, metadata={"knob": spec})


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minicompile")


@dataclass
class Config:
    debug: int = knob(
        "MINICOMPILE_DEBUG", 0, "what each compile prints, 0 (nothing) to 5 (see Debugging above)", lo=0, hi=5)
    cache_dir: str = knob(
        "MINICOMPILE_CACHE_DIR", _default_cache_dir(), "compiled kernels and measured choices; corrupt "
        "entries are rebuilt (with a log line), an unwritable directory falls back to a temporary one; "
        "`minicompile cache info` / `clear`", shown="`~/.cache/minicompile`")
    cxx: str = knob(
        "MINICOMPILE_CXX", os.environ.get("CXX", ""), "the C++ compiler (else `$CXX`, then g++, c++, clang++)",
        shown="g++")
    cpu_backend: str = knob(
        "MINICOMPILE_CPU_BACKEND", "cpp", "code generator for CPU tensors: `triton` runs them through the "
        "Triton generator (with `TRITON_INTERPRET=1`)", choices=("cpp", "triton"))
    fallback_on_error: bool = knob(
        "MINICOMPILE_FALLBACK", True, "an internal compiler error runs the graph eagerly with a warning; "
        "0 raises it (for bug reports and tests)")
    recompile_limit: int = knob(
        "MINICOMPILE_RECOMPILE_LIMIT", 8, "entries per code offset in `minicompile.compile` (8 times that "
        "at a resume point inside a loop); then the function runs eagerly, with a warning naming the "
        "guard that kept failing", lo=1)
    fusion: bool = knob("MINICOMPILE_FUSION", True, "0: one kernel per buffer (for debugging)")
    realize_reads_threshold: int = knob(
        "MINICOMPILE_REALIZE_READS", 4, "a lazy value read by more consumers is computed once into a "
        "buffer", lo=1)
    realize_opcount_threshold: int = knob(
        "MINICOMPILE_REALIZE_OPS", 30, "a lazy value whose body has more ops is computed once into a "
        "buffer", lo=1)
    realize_loads_threshold: int = knob(
        "MINICOMPILE_REALIZE_LOADS", 4, "a value read twice or more that loads more than this many "
        "buffers is computed once into a buffer (keeps lowering linear in the depth of residual chains)",
        lo=1)
    parallel_threshold: int = knob(
        "MINICOMPILE_PARALLEL_THRESHOLD", 32768, "smallest loop (in elements) run on several OpenMP "
        "threads", lo=1)
    horizontal_groups: bool = knob(
        "MINICOMPILE_HORIZONTAL", True, "consecutive independent C++ kernels run as one call with one "
        "OpenMP parallel region, no barrier between them (scheduler/groups.py)")
    triton_persistent_rnumel: int = knob(
        "MINICOMPILE_TRITON_PERSISTENT_RNUMEL", 4096, "Triton: a reduction row of at most this many "
        "elements (rounded up to a power of two) is held in registers; longer rows loop", lo=1)
    cpu_attention: str = knob(
        "MINICOMPILE_CPU_ATTENTION", "auto", "CPU attention: `auto` keeps eager's fused flash kernel (an "
        "extern call) for a shape where it measured faster than the decomposed math form on this machine "
        "(once per shape and thread count, remembered in the cache), and the math form where neither "
        "runs on the traced layout; `math` or `flash` pins the choice (cpu/claims.py)",
        choices=("auto", "math", "flash"))
    cpu_gemm: str = knob(
        "MINICOMPILE_CPU_GEMM", "auto", "CPU float32 matrix products: `auto` runs each shape with MKL's "
        "sgemm (`aten.mm`, as eager) unless oneDNN's matmul measured more than 10% faster on this machine "
        "(once per shape and thread count, remembered in the cache); `mkl` or `onednn` pins the library. "
        "Where weights are prepared, a product of a weight runs our packed-weight template where that measured "
        "5% faster than the library (cpu/gemm_template.py); `template` pins it there (MKL elsewhere)",
        choices=("auto", "mkl", "onednn", "template"))
    cpu_narrow_gemm: str = knob(
        "MINICOMPILE_CPU_NARROW_GEMM", "auto", "CPU bfloat16/float16 matrix products (mm, bmm; autocast's): "
        "`auto` runs them with the library's narrow kernel, as eager, on a CPU with instructions for the "
        "dtype (avx512_bf16, amx_bf16; avx512_fp16, amx_fp16), elsewhere as the float32 product of the "
        "converted operands rounded once (10-45x faster on AVX2; both accumulate in float32); "
        "`library` or `float32` pins it",
        choices=("auto", "library", "float32"))
    cpu_epilogue: str = knob(
        "MINICOMPILE_CPU_EPILOGUE", "auto", "CPU float32 inference: an activation (ReLU, GELU, SiLU, clamp) or "
        "residual add after a matrix product or 2-d convolution runs as oneDNN's post-op where, timed on "
        "this machine (once per shape and thread count, remembered in the cache), that beats the product "
        "plus a separate pass (cpu/epilogues.py); `fused` or `separate` pins it; training graphs: `separate`",
        choices=("auto", "fused", "separate"))
    cpu_libraries: str = knob(
        "MINICOMPILE_CPU_LIBRARIES", "measured", "`eager` pins every library choice that changes numerics "
        "to the call eager makes: matrix products through MKL's sgemm (as `MINICOMPILE_CPU_GEMM=mkl`), "
        "bfloat16/float16 ones through the library's narrow kernel (as `MINICOMPILE_CPU_NARROW_GEMM=library`) and "
        "attention through eager's fused kernel wherever eager runs it (as `MINICOMPILE_CPU_ATTENTION=flash`), "
        "epilogues in separate passes (as `MINICOMPILE_CPU_EPILOGUE=separate`); "
        "`measured` leaves them to those knobs", choices=("measured", "eager"))
    conv_channels_last: bool = knob(
        "MINICOMPILE_CONV_CHANNELS_LAST", True, "CPU float32 convolutions run channels-last: in inference "
        "(inputs and weights converted, 1x1 convolutions as oneDNN linear, eager's output layout "
        "restored) and in training, forward and backward; 0 keeps NCHW")
    conv_layout: str = knob(
        "MINICOMPILE_CONV_LAYOUT", "auto", "`auto` keeps a convolution graph channels-last only where its convolutions, "
        "timed both ways on this machine (weight conversions counted unless weights are prepared; training: forward and "
        "backward, each weight and its gradient converted, cpu/train_layout.py), run faster so; `channels_last` always converts",
        choices=("auto", "channels_last"))
    prepare_weights: bool = knob(
        "MINICOMPILE_PREPARE_WEIGHTS", False, "CPU inference: values computed from parameters and buffers "
        "alone (channels-last weights, BatchNorm folded into the convolution) are computed once per "
        "version of those tensors (cpu/prepare.py); also `options={\"freezing\": True}`. Off by default: "
        "a write through `p.data` moves no version counter and would not be seen")
    host_pool_mb: int = knob(
        "MINICOMPILE_HOST_POOL_MB", 2048, "CPU buffers of 64 KiB or more (and matrix products' results) "
        "are kept for reuse once nothing references them, so their pages stay mapped; "
        "`minicompile.runtime.host_pool.clear()` releases the idle ones; 0 turns it off", lo=0)
    triton_autotune: bool = knob(
        "MINICOMPILE_TRITON_AUTOTUNE", True, "Triton on a GPU: time a few block sizes / num_warps per "
        "kernel and shape (cached on disk)")
    max_autotune: bool = knob(
        "MINICOMPILE_MAX_AUTOTUNE", False, "what `mode=\"max-autotune\"` sets: time CPU kernel variants per "
        "graph and cache the winner; widen the Triton autotuner's search (docs/modes.md)")
    cudagraphs: bool = knob(
        "MINICOMPILE_CUDAGRAPHS", False, "what `mode=\"reduce-overhead\"` sets: replay each compiled "
        "graph's kernels as one recorded CUDA graph (no effect on CPU)")
    partitioner: str = knob(
        "MINICOMPILE_PARTITIONER", "min_cut", "how training graphs are split into forward and backward: "
        "`min_cut` (recompute cheap elementwise chains instead of saving them) or `save_all`",
        choices=("min_cut", "save_all"))
    checkpoint: str = knob(
        "MINICOMPILE_CHECKPOINT", "recompute", "values computed inside a `torch.utils.checkpoint` region: "
        "`recompute` (as eager: recomputed in the backward from the region's inputs, never saved; random "
        "draws are kept from the forward) or `min_cut` (the partitioner chooses as for any value)",
        choices=("recompute", "min_cut"))
    check: bool = knob(
        "MINICOMPILE_CHECK", False, "every compiled graph also runs eagerly on the same inputs; the first "
        "call whose outputs differ names the kernel that diverges first (its FX nodes and source lines) and "
        "writes a reproducer (testing/check.py; Checking results above)")


# Variables read by the tests and scripts, not by the compiler: known, so not reported as typos.
TOOL_VARIABLES = {
    "MINICOMPILE_FUZZ_N": "programs `tests/test_fuzz.py` runs (default 200)",
    "MINICOMPILE_FUZZ_TRAIN_N": "programs `tests/test_fuzz_train.py` runs",
    "MINICOMPILE_GPU_DRY_RUN": "`benchmarks/gpu_check.sh` without a GPU (docs/triton.md)",
    "MINICOMPILE_GPU_BENCH_ARGS": "replaces `benchmarks/gpu_check.sh`'s arguments to bench_gpu.py",
    "MINICOMPILE_TEST_FLAG": "read by one front-end test of `os.environ` guards",
}


@functools.cache
def knobs() -> dict:
    """Each Config field's name and its Knob (made once: ``patch`` runs around compiled calls)."""
    return {f.name: f.metadata["knob"] for f in fields(Config)}


def unknown_variables(environ=os.environ) -> list:
    """``MINICOMPILE_*`` variables set in ``environ`` that nothing reads, each with a close match."""
    known = [k.env for k in knobs().values()] + list(TOOL_VARIABLES)
    found = []
    for name in sorted(v for v in environ if v.startswith("MINICOMPILE_") and v not in known):
        close = difflib.get_close_matches(name, known, n=1)
        found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return found


def readme_table() -> str:
    """The README's configuration table, made from the knobs themselves."""
    rows = ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
    for spec in knobs().values():
        rows.append(f"| `{spec.env}` | {spec.shown_default()} | {spec.accepted()} | {spec.doc} |")
    rows += ["", "Read by the tests and scripts only:", "", "| variable | meaning |", "|---|---|"]
    rows += [f"| `{name}` | {doc} |" for name, doc in TOOL_VARIABLES.items()]
    return "\n".join(rows) + "\n"


config = Config()

if unknown_variables():
    warnings.warn(f"minicompile: ignoring unknown environment variable(s): {', '.join(unknown_variables())}; "
                  "the README's Configuration table lists every variable")


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
    spec = knobs()[knob]
    if not isinstance(value, type(spec.default)) and not (isinstance(spec.default, bool) and value in (0, 1)):
        raise TypeError(f"minicompile: option {key!r} must be of type {type(spec.default).__name__}, "
                        f"got {value!r}")
    return spec.check(value, f"option {key!r}")


@contextlib.contextmanager
def patch(**changes):
    """Set knobs for the duration of a ``with`` block, then restore them."""
    names = {f.name for f in fields(Config)}
    unknown = set(changes) - names
    if unknown:
        raise AttributeError(f"unknown minicompile config knob(s): {sorted(unknown)}; known: {sorted(names)}")
    specs = knobs()
    changes = {k: specs[k].check(v, f"config knob {k!r} ({specs[k].env})") for k, v in changes.items()}
    saved = {k: getattr(config, k) for k in changes}
    for k, v in changes.items():
        setattr(config, k, v)
    try:
        yield config
    finally:
        for k, v in saved.items():
            setattr(config, k, v)

