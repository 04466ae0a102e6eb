"""Build a C++ translation unit into a shared library (cached) and load it with ctypes.

Generated kernels include the helpers in ``include/minicompile_prelude.h`` (package data,
next to this file) instead of carrying them, so a printed kernel source is the kernel. The
cache key hashes every header there with the source, the flags and the compiler version.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait

from minicompile.config import config
from minicompile.runtime import cache

log = logging.getLogger("minicompile")

# -mprefer-vector-width=512: g++ otherwise keeps to 256-bit vectors on AVX-512 machines; the
# full width (and glibc's 16-lane math) ran the fused kernels 15-25% faster here. Machines
# without AVX-512 ignore it.
# -ffp-contract=off: no fused multiply-adds, so x*y - x*y is exactly 0 as in eager.
# -fno-math-errno/-fno-trapping-math and __FAST_MATH__ let glibc hand the vectoriser its SIMD
# exp/log/sin/...; unlike -ffast-math they keep NaN and Inf semantics, which eager relies on.
INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
PRELUDE_HEADER = "minicompile_prelude.h"  # every generated translation unit includes it

CXXFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
            "-D__FAST_MATH__", "-shared", "-fPIC", "-std=c++17", "-w"]


class CompilerNotFound(RuntimeError):
    pass


class CppCompileError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _find_compiler(requested: str) -> str:
    candidates = [requested] if requested else ["g++", "c++", "clang++"]
    for c in candidates:
        path = shutil.which(c)
        if path:
            return path
    if requested:
        raise CompilerNotFound(f"C++ compiler {requested!r} (from MINICOMPILE_CXX/CXX) was not found on PATH. "
                               f"Install it, or set MINICOMPILE_CXX (or CXX) to a C++ compiler such as g++.")
    raise CompilerNotFound("no C++ compiler found (looked for g++, c++, clang++): minicompile compiles CPU "
                           "kernels with one. Install g++ (e.g. `apt-get install g++`) or set MINICOMPILE_CXX "
                           "(or CXX) to a C++ compiler.")


def compiler() -> str:
    return _find_compiler(config.cxx)


@functools.lru_cache(maxsize=None)
def _compiler_version(path: str) -> str:
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return path


def _headers() -> bytes:
    """The headers generated code can include, names and contents: part of the cache key.
    Read on every build (a few KB), so an edited header is never served a stale library."""
    parts = []
    for name in sorted(os.listdir(INCLUDE_DIR)):
        with open(os.path.join(INCLUDE_DIR, name), "rb") as f:
            parts += [name.encode(), b"\0", f.read(), b"\0"]
    return b"".join(parts)


def build_key(source: str, headers: bytes | None = None) -> str:
    """The cache key of ``source``: it, the included headers, the flags and the compiler."""
    headers = _headers() if headers is None else headers
    return cache.digest(source, headers, " ".join(CXXFLAGS), _compiler_version(compiler()))


_build_locks: dict = {}
_locks_guard = threading.Lock()


# -- the prelude, precompiled (GCC) --------------------------------------------------------------
# g++ spends ~0.3 s of every translation unit parsing the prelude's standard headers (<cmath>,
# <algorithm>); precompiled, ~0.05 s. The precompiled header is built once per cache, in the
# background (start_precompiled_prelude, when a compile begins: the trace keeps one core busy
# and the other free), and a build uses it once it is there; g++ reads the header itself where
# the precompiled one does not fit (another compiler, other flags), so a build never depends on it.
_pch: dict = {"started": False, "dir": None, "key": None}
_background: set = set()   # builds running in the background: futures, and the prelude's thread


def start_precompiled_prelude() -> None:
    """Build the prelude's precompiled header in the background, once per process (GCC only)."""
    if _pch["started"]:
        return
    _pch["started"] = True
    try:
        cxx = compiler()
    except CompilerNotFound:
        return
    if "Free Software Foundation" in _compiler_version(cxx) and "clang" not in _compiler_version(cxx):
        thread = threading.Thread(target=_build_pch_quietly, args=(cxx,), daemon=True, name="minicompile-pch")
        _background.add(thread)
        thread.start()


def _build_pch_quietly(cxx: str) -> None:
    try:
        _build_pch(cxx)
    except Exception as e:   # noqa: BLE001 - an optimisation: builds read the header without it
        log.debug("minicompile: the precompiled prelude was not built (%s: %s)", type(e).__name__, e)
    finally:
        _background.discard(threading.current_thread())


def wait_for_background_builds() -> None:
    """Wait for g++ running in the background (the prelude, start_load): see autotune.before_timing."""
    for job in list(_background):
        job.join() if isinstance(job, threading.Thread) else wait([job])


def _pch_key(cxx: str, headers: bytes) -> str:
    return cache.digest("pch", headers, " ".join(CXXFLAGS), _compiler_version(cxx))


def _build_pch(cxx: str) -> None:
    key = _pch_key(cxx, _headers())
    d = cache.entry_dir("pch", key)
    gch = os.path.join(d, PRELUDE_HEADER + ".gch")
    if not cache.is_valid(gch):
        tmp = f"{gch}.{os.getpid()}.tmp"
        flags = [f for f in CXXFLAGS if f != "-shared"]
        gxx = [cxx, *flags, "-x", "c++-header", os.path.join(INCLUDE_DIR, PRELUDE_HEADER), "-o", tmp]
        # a process of its own builds and commits it: one that ends first leaves no half-built file
        subprocess.run([sys.executable, "-c", _BUILD_AND_COMMIT, tmp, gch, *gxx],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not cache.is_valid(gch):
            return
    _pch["dir"], _pch["key"] = d, key


# run the compiler, then move its output into place with its checksum as cache.commit does
_BUILD_AND_COMMIT = """import hashlib, os, subprocess, sys
tmp, final = sys.argv[1], sys.argv[2]
if subprocess.run(sys.argv[3:]).returncode == 0 and os.path.exists(tmp):
    with open(tmp, "rb") as f:
        checksum = hashlib.sha256(f.read()).hexdigest()
    os.replace(tmp, final)
    with open(tmp + ".sum", "w") as f:
        f.write(checksum)
    os.replace(tmp + ".sum", final + ".sha256")
elif os.path.exists(tmp):
    os.remove(tmp)
"""


def _include_flags(cxx: str, headers: bytes) -> list:
    """The precompiled prelude's folder if built from ``headers`` (not stale), then the headers' own."""
    fresh = _pch["dir"] and _pch["key"] == _pch_key(cxx, headers)
    return (["-I", _pch["dir"]] if fresh else []) + ["-I", INCLUDE_DIR]


def build(source: str, units: tuple = ()) -> str:
    """Path of a shared library built from ``source``: from the cache, or compiled now; ``units``
    (its independent parts) as translation units in parallel where it pays (``_parallel_parts``)."""
    return _build(*_where(source), source, units)


def _where(source: str) -> tuple:
    """The compiler, the headers (read once: the key, and whether the precompiled prelude fits),
    the key and the cache entry: what a build reads from the config, read by the caller's thread."""
    cxx, headers = compiler(), _headers()
    return cxx, headers, (key := build_key(source, headers)), cache.entry_dir("cpp", key)


def _build(cxx: str, headers: bytes, key: str, d: str, source: str, units: tuple) -> str:
    with _locks_guard:
        lock = _build_locks.setdefault(key, threading.Lock())
    with lock:
        src_path, lib_path = os.path.join(d, "kernels.cpp"), os.path.join(d, "kernels.so")
        if cache.is_valid(lib_path):
            return lib_path
        # temporary names of this process and thread: other processes (DDP ranks sharing the
        # cache) may build the same entry at the same time; the rename makes either copy whole
        tmp = f"{os.getpid()}.{threading.get_ident()}.tmp"
        _write(src_path, source, tmp)
        tmp_lib = f"{lib_path}.{tmp}"
        parts = _parallel_parts(units)
        if len(parts) < 2:
            _run([[cxx, *CXXFLAGS, *_include_flags(cxx, headers), src_path, "-o", tmp_lib]], src_path)
        else:
            objects, compiles = [], []
            for k, part in enumerate(parts):
                part_path = os.path.join(d, f"kernels.part{k}.cpp")
                _write(part_path, part, tmp)
                objects.append(f"{part_path}.{tmp}.o")
                compiles.append([cxx, *(f for f in CXXFLAGS if f != "-shared"), "-c", *_include_flags(cxx, headers),
                                 part_path, "-o", objects[-1]])
            _run(compiles, src_path)
            _run([[cxx, "-shared", "-fopenmp", *objects, "-o", tmp_lib]], src_path)
            for o in objects:
                os.remove(o)
        cache.commit(tmp_lib, lib_path)
        return lib_path


# Parallel builds: at least this many lines of kernels per part (g++ spends ~0.2 s on the
# prelude and its headers in every translation unit), and at most one part per core.
PART_MIN_LINES = 500


def _parallel_parts(units: tuple) -> list:
    """``units`` joined into as many translation units as pay (one, or none: build ``source``)."""
    lines = [u.count("\n") for u in units]
    n = min(len(units), os.cpu_count() or 1, sum(lines) // PART_MIN_LINES)
    if n < 2:
        return []
    bins = [[] for _ in range(n)]
    sizes = [0] * n
    for k in sorted(range(len(units)), key=lambda k: -lines[k]):   # largest first, into the lightest part
        j = sizes.index(min(sizes))
        bins[j].append(k)
        sizes[j] += lines[k]
    return [f'#include "{PRELUDE_HEADER}"\n\n' + "\n\n".join(units[k] for k in sorted(b)) + "\n" for b in bins]


def _write(path: str, text: str, tmp: str) -> None:
    with open(f"{path}.{tmp}", "w") as f:
        f.write(text)
    os.replace(f"{path}.{tmp}", path)


def _run(commands: list, src_path: str) -> None:
    """Run the compiler commands at once; a failure raises with the compiler's message."""
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for cmd in commands]
    failed = []
    for cmd, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            failed.append((cmd, err))
    if failed:
        cmd, err = failed[0]
        raise CppCompileError(f"compiling generated kernels failed (source: {src_path}).\n"
                              f"command: {' '.join(cmd)}\n{err[-4000:]}")


class KernelLibrary:
    """A loaded shared library; ``lib.kernel0(ptr, ptr, ...)`` calls a kernel."""

    def __init__(self, path: str, kernels: dict):
        self.path = path
        self._lib = ctypes.CDLL(path)
        for name, nargs in kernels.items():
            fn = getattr(self._lib, name)
            fn.argtypes = [ctypes.c_void_p] * nargs
            fn.restype = None
            setattr(self, name, fn)


_builder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="minicompile-build")
# a forked child (a DataLoader worker) has none of the parent's threads: its builds get their own
os.register_at_fork(after_in_child=lambda: globals().update(
    _builder=ThreadPoolExecutor(max_workers=2, thread_name_prefix="minicompile-build"), _build_locks={}, _background=set()))


def start_load(source: str, kernels: dict, units: tuple = ()) -> Future:
    """``load`` in the background (a future of the library or the error): g++ runs while the caller
    goes on. A library in the cache is loaded at once (the future is done)."""
    where, job = _where(source), Future()
    if cache.is_valid(os.path.join(where[3], "kernels.so")):
        job.set_result(load(source, kernels, units, where))
        return job
    _background.add(job := _builder.submit(lambda: load(source, kernels, units, where)))
    job.add_done_callback(_background.discard)   # after add: one done already is discarded at once
    return job


def load(source: str, kernels: dict, units: tuple = (), where: tuple | None = None) -> KernelLibrary:
    """The built library, loaded. A cached library that cannot be loaded (its checksum matched,
    but the file was built by another toolchain or damaged with its checksum) is rebuilt once.
    ``where``: ``_where(source)`` read before, by the thread that asked for the build."""
    where = where or _where(source)
    path = _build(*where, source, units)
    try:
        return KernelLibrary(path, kernels)
    except (OSError, AttributeError):
        cache.invalidate(path)
    path = _build(*where, source, units)
    try:
        return KernelLibrary(path, kernels)
    except (OSError, AttributeError) as e:
        raise CppCompileError(f"the freshly built kernel library {path} cannot be loaded ({e}); "
                              f"if this repeats, run `minicompile cache clear` (cache: {cache.cache_root()})") from e
