"""Load a generated Triton module (cached on disk), compute grids, autotune, launch.

The module is written into minicompile's cache (keyed by its source) and imported from
there, so Triton can read the kernels' source and Tracebacks point at real lines. Triton's
own compile cache goes under minicompile's cache directory too (TRITON_CACHE_DIR), unless
the user set it. Kernels for CPU tensors are imported in interpreter mode (as if
``TRITON_INTERPRET=1``), which is how CI runs the Triton path without a GPU.

Autotuning (GPU only): each kernel times a few (XBLOCK, RBLOCK, num_warps) candidates on its
first call, with copies of the buffers it writes so the real outputs are untouched; the
winner is kept in memory and on disk, keyed by the kernel's source (which fixes its shapes,
or with symbolic sizes names them), the size bucket (next powers of two of the extents) and
the device name. ``config.max_autotune`` (torch.compile's max-autotune modes) widens the
search: each candidate also with half and twice its num_warps, and more block sizes. Both
knobs are read when the graph is compiled. In the interpreter timing means nothing: a fixed
heuristic is used.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading

import torch

from minicompile.config import config
from minicompile.runtime import cache
from minicompile.runtime.host_pool import copy_with_layout

_env_lock = threading.Lock()


class TritonNotAvailable(RuntimeError):
    pass


def _triton():
    try:
        import triton
    except ImportError as e:  # pragma: no cover - triton ships with the dev install
        raise TritonNotAvailable("the Triton code generator needs the `triton` package: pip install triton, "
                                 "or run CPU tensors through the C++ backend (MINICOMPILE_CPU_BACKEND=cpp)") from e
    return triton


@contextlib.contextmanager
def _interpret_mode(on: bool):
    """Set TRITON_INTERPRET for the duration of an import (``triton.jit`` reads it there)."""
    with _env_lock:
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if on else "0"
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved


def _module_path(source: str) -> tuple[str, str]:
    key = cache.digest(source, "triton-module")
    path = os.path.join(cache.entry_dir("triton", key), "kernels.py")
    if not cache.is_valid(path):
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        cache.commit(tmp, path)
    return key, path


def import_module(source: str, interpret: bool):
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache.cache_root(), "triton-cache"))
    _triton()
    key, path = _module_path(source)
    name = f"minicompile_triton_{key}_{'interp' if interpret else 'gpu'}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with _interpret_mode(interpret):
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


class TritonKernelLauncher:
    """``launcher(*tensors, *sizes)`` runs one generated kernel over its whole grid.

    With symbolic sizes the kernel's extents are expressions over the size arguments (the
    last arguments, named like the kernel's parameters): evaluated per call, and the
    block-size choice is kept per size bucket (the next powers of two of both extents)."""

    def __init__(self, fn, name: str, meta: dict, source_key: str, interpret: bool):
        self.fn = fn
        self.name = name
        self.extents = [_extent(meta["xnumel"]), None if meta["rnumel"] is None else _extent(meta["rnumel"])]
        self.persistent = meta["persistent"]
        self.written = meta["written"]
        self.arg_names = list(meta.get("args", []))
        self.key = cache.digest(source_key, name)
        self.interpret = interpret
        self.autotune = config.triton_autotune
        self.wide = config.max_autotune
        self.choices = {}  # size bucket -> (XBLOCK, RBLOCK, num_warps)

    def __repr__(self):
        return f"TritonKernelLauncher({self.name}, extents={self.extents}, choices={self.choices})"

    def numels(self, args) -> tuple:
        """(xnumel, rnumel or None) for a call with ``args``."""
        if all(e is None or isinstance(e, int) for e in self.extents):
            return tuple(self.extents)
        names = dict(zip(self.arg_names, args))
        # the extents are our own generated size expressions (compiled by _extent)
        return tuple(e if e is None or isinstance(e, int) else eval(e, {}, names) for e in self.extents)  # noqa: S307

    # -- candidates -------------------------------------------------------------------------
    def candidates(self, xnumel: int, rnumel) -> list[dict]:
        """(XBLOCK, RBLOCK, num_warps) settings worth trying, the heuristic default first."""
        base = self._usual_candidates(xnumel, rnumel)
        return _widened(base, next_power_of_2(xnumel), rnumel is None) if self.wide else base

    def _usual_candidates(self, xnumel: int, rnumel) -> list[dict]:
        xcap = next_power_of_2(xnumel)
        if rnumel is None:
            sizes = [b for b in (1024, 512, 256, 2048) if b <= max(xcap, 128)] or [128]
            return [dict(XBLOCK=b, num_warps=4 if b <= 512 else 8) for b in sizes]
        if self.persistent:
            r = next_power_of_2(rnumel)
            out = []
            for budget in (2048, 4096, 1024, 8192):
                x = max(1, min(xcap, budget // r))
                warps = 8 if r * x >= 4096 else 4 if r * x >= 1024 else 2
                c = dict(XBLOCK=x, RBLOCK=r, num_warps=warps)
                if c not in out:
                    out.append(c)
            return out
        out = []
        for r, x in ((1024, 2), (512, 4), (2048, 1), (256, 8), (4096, 1)):
            c = dict(XBLOCK=max(1, min(x, xcap)), RBLOCK=r, num_warps=8 if r * x >= 2048 else 4)
            if c not in out:
                out.append(c)
        return out

    def _interpreter_choice(self, xnumel: int, rnumel) -> dict:
        """Big blocks: the interpreter runs one numpy step per program, so fewer programs is faster."""
        if rnumel is None:
            return dict(XBLOCK=min(next_power_of_2(xnumel), 1024), num_warps=1)
        r = next_power_of_2(rnumel) if self.persistent else 64
        return dict(XBLOCK=max(1, min(next_power_of_2(xnumel), 4096 // r)), RBLOCK=r, num_warps=1)

    # -- launching --------------------------------------------------------------------------
    def __call__(self, *args):
        xnumel, rnumel = self.numels(args)
        if xnumel == 0:
            return
        bucket = (next_power_of_2(xnumel), rnumel and next_power_of_2(rnumel))
        choice = self.choices.get(bucket)
        if choice is None:
            choice = self.choices[bucket] = self._choose(args, xnumel, rnumel)
        self._launch(choice, args, xnumel)

    def _launch(self, choice, args, xnumel: int):
        self.fn[(triton_cdiv(xnumel, choice["XBLOCK"]),)](*args, **choice)

    def _choose(self, args, xnumel: int, rnumel) -> dict:
        if self.interpret:
            return self._interpreter_choice(xnumel, rnumel)
        options = self.candidates(xnumel, rnumel)
        if not self.autotune or len(options) == 1:
            return options[0]
        device = torch.cuda.get_device_name(args[0].device) if args and args[0].is_cuda else "device"
        bucket = (next_power_of_2(xnumel), rnumel and next_power_of_2(rnumel))
        key = cache.digest(self.key, device, repr(bucket), *(("wide search",) if self.wide else ()))
        path = os.path.join(cache.entry_dir("triton-autotune", key), "choice.json")
        if cache.is_valid(path):
            with open(path) as f:
                return json.load(f)
        best = self._benchmark(options, args, xnumel)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(best, f)
        cache.commit(tmp, path)
        return best

    def _benchmark(self, options, args, xnumel: int) -> dict:
        from triton.testing import do_bench
        trial = self.trial_args(args)
        timings = []
        for c in options:
            try:
                t = do_bench(lambda: self._launch(c, trial, xnumel), warmup=5, rep=20)
            except Exception:  # a setting that does not compile (too many registers) is skipped
                continue
            timings.append((t, c))
        if not timings:
            return options[0]
        return min(timings, key=lambda tc: tc[0])[1]

    def trial_args(self, args) -> list:
        """``args`` for timing: each buffer the kernel writes replaced by a copy with its strides (an
        in-place kernel run many times would corrupt its input; a contiguous copy of a buffer with
        gaps would be written past its end)."""
        return [copy_with_layout(a) if i in self._written_positions(args) else a for i, a in enumerate(args)]

    def _written_positions(self, args) -> set:
        return {i for i, n in enumerate(self.arg_names) if n in self.written} if self.arg_names else set(range(len(args)))


class TritonKernels:
    """The loaded module: one launcher attribute per kernel, for the host wrapper."""

    def __init__(self, source: str, kernel_args: dict, interpret: bool):
        self.module = import_module(source, interpret)
        key = cache.digest(source)
        for name, meta in self.module.LAUNCH.items():
            if "grid" in meta:   # a whole kernel with its own grid (codegen/triton_flex.py)
                setattr(self, name, FixedGridLauncher(getattr(self.module, name), tuple(meta["grid"])))
                continue
            meta = dict(meta, args=kernel_args.get(name, []))
            setattr(self, name, TritonKernelLauncher(getattr(self.module, name), name, meta, key, interpret))


class FixedGridLauncher:
    """``launcher(*tensors)`` runs a kernel whose grid and block sizes its generator fixed."""

    def __init__(self, fn, grid: tuple):
        self.fn, self.grid = fn, grid

    def __call__(self, *args):
        self.fn[self.grid](*args)


def load(source: str, kernel_args: dict, interpret: bool) -> TritonKernels:
    return TritonKernels(source, kernel_args, interpret)


def _widened(base: list, xcap: int, pointwise: bool) -> list:
    """The max-autotune search: every usual candidate with half and twice its warps, and for
    pointwise kernels smaller and larger blocks too."""
    out = list(base)

    def add(c):
        if c not in out:
            out.append(c)
    for c in base:
        for warps in (c["num_warps"] // 2, c["num_warps"] * 2):
            if 1 <= warps <= 16:
                add(dict(c, num_warps=warps))
    if pointwise:
        for block in (64, 128, 4096, 8192):
            if block <= max(xcap, 128):
                add(dict(XBLOCK=block, num_warps=max(1, min(16, block // 256))))
    return out


def _extent(e):
    """An extent from LAUNCH: an int, or a Python expression over the size arguments (a string)."""
    return e if isinstance(e, int) else compile(e, "<extent>", "eval")


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
