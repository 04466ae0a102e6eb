"""Build a C++ translation unit into a shared library (cached) and load it with ctypes.

Generated kernels include the helpers in ``include/minicompile_prelude.h`` (package data,
next to this file) instead of carrying them, so a printed kernel source is the kernel. The
cache key hashes every header there with the source, the flags and the compiler version.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import threading

from minicompile.config import config
from minicompile.runtime import cache

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


def build_key(source: str) -> str:
    """The cache key of ``source``: it, the included headers, the flags and the compiler."""
    return cache.digest(source, _headers(), " ".join(CXXFLAGS), _compiler_version(compiler()))


_build_locks: dict = {}
_locks_guard = threading.Lock()


def build(source: str) -> str:
    """Path of a shared library built from ``source``: from the cache, or compiled now."""
    cxx = compiler()
    key = build_key(source)
    with _locks_guard:
        lock = _build_locks.setdefault(key, threading.Lock())
    with lock:
        d = cache.entry_dir("cpp", key)
        src_path, lib_path = os.path.join(d, "kernels.cpp"), os.path.join(d, "kernels.so")
        if cache.is_valid(lib_path):
            return lib_path
        # temporary names of this process and thread: other processes (DDP ranks sharing the
        # cache) may build the same entry at the same time; the rename makes either copy whole
        tmp_src, tmp_lib = (f"{p}.{os.getpid()}.{threading.get_ident()}.tmp" for p in (src_path, lib_path))
        with open(tmp_src, "w") as f:
            f.write(source)
        os.replace(tmp_src, src_path)
        cmd = [cxx, *CXXFLAGS, "-I", INCLUDE_DIR, src_path, "-o", tmp_lib]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CppCompileError(f"compiling generated kernels failed (source: {src_path}).\n"
                                  f"command: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
        cache.commit(tmp_lib, lib_path)
        return lib_path


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


def load(source: str, kernels: dict) -> KernelLibrary:
    return KernelLibrary(build(source), kernels)
