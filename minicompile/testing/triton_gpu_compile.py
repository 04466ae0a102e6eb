"""Compile generated Triton kernels for a real GPU, on a machine without one.

Triton's interpreter runs our kernels on CPU tensors, but it is not the compiler: it accepts
what a GPU build rejects (``tl.sqrt_rn`` of a float64, found on the first H200 run) and says
nothing about registers or shared memory. Triton's own compiler runs anywhere, though: it
lowers a kernel to PTX and cubin for a named target (``GPUTarget("cuda", 90, 32)``: Hopper)
with the ptxas it ships. So::

    with record_launches() as launches:
        ...run compiled graphs on CPU tensors with MINICOMPILE_CPU_BACKEND=triton...
    problems = compile_for_gpu(launches)     # [] when every kernel builds for the GPU

compiles each launched kernel, with the argument types it was called with and every block
setting the GPU launcher would try for its sizes (``TritonKernelLauncher.candidates``), and
reports the ones that do not compile or break a device limit (shared memory per block, threads
per block); with ``usage=[]`` it also reads each build's registers and local memory (spills)
with the cuobjdump that ships with Triton. ``python -m minicompile.testing.fuzz --gpu-compile`` and tests/test_triton_gpu_compile.py
use it.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minicompile.runtime import triton_launch
from minicompile.runtime.triton_launch import TritonKernelLauncher

# Hopper (H100/H200): 227 KiB of shared memory a block can ask for, 1024 threads a block
SHARED_MEMORY_LIMIT = 227 * 1024
THREADS_LIMIT = 1024

_POINTER_TYPES = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.bfloat16: "*bf16", torch.float16: "*fp16",
    torch.int8: "*i8", torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8",
    torch.bool: "*i1",
}


@dataclass
class Launch:
    """One kernel as the wrapper called it: the module it lives in, its arguments' types, its sizes."""
    launcher: TritonKernelLauncher
    source: str
    types: dict          # argument name -> Triton type string
    numels: tuple        # (xnumel, rnumel or None)


@contextlib.contextmanager
def record_launches():
    """Every (kernel, argument types, sizes) launched inside the block, once each."""
    launches: dict = {}
    original = TritonKernelLauncher.__call__

    def recording(self, *args):
        key = (self.key, tuple(_type_of(a) for a in args))
        if key not in launches:
            names = list(self.fn.arg_names)[:len(args)]
            launches[key] = Launch(self, _source_of(self), dict(zip(names, key[1])), self.numels(args))
        return original(self, *args)
    TritonKernelLauncher.__call__ = recording
    try:
        yield launches
    finally:
        TritonKernelLauncher.__call__ = original


def _type_of(a) -> str:
    if isinstance(a, torch.Tensor):
        return _POINTER_TYPES[a.dtype]
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        return "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
    return "fp32"


def _source_of(launcher) -> str:
    with open(launcher.fn.fn.__code__.co_filename) as f:
        return f.read()


def compile_for_gpu(launches, arch: int = 90, every_candidate: bool = True, usage: list | None = None) -> list[str]:
    """Compile each recorded launch for CUDA ``sm_<arch>``; the problems found, one line each.
    ``usage`` (a list) receives (kernel and setting, registers a thread, local memory bytes a
    thread: spilled registers) for each build."""
    target = GPUTarget("cuda", arch, 32)
    problems, done = [], set()
    for launch in (launches.values() if isinstance(launches, dict) else launches):
        module = triton_launch.import_module(launch.source, interpret=False)
        fn = getattr(module, launch.launcher.name)
        xnumel, rnumel = launch.numels
        candidates = launch.launcher.candidates(xnumel, rnumel)
        for choice in candidates if every_candidate else candidates[:1]:
            constexprs = {k: v for k, v in choice.items() if k != "num_warps"}
            signature = dict(launch.types, **{k: "constexpr" for k in constexprs})
            key = (id(fn), tuple(sorted(signature.items())), tuple(sorted(choice.items())))
            if key in done:
                continue
            done.add(key)
            what = f"{launch.launcher.name} {choice}"
            try:
                compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=target,
                                          options={"num_warps": choice["num_warps"]})
            except Exception as e:  # noqa: BLE001 - a kernel the GPU compiler rejects is the finding
                problems.append(f"{what}: {type(e).__name__}: {_first_lines(e)}")
                continue
            if usage is not None:
                usage.append((what, *resource_usage(compiled.asm["cubin"])))
            shared = compiled.metadata.shared
            if shared > SHARED_MEMORY_LIMIT:
                problems.append(f"{what}: {shared} bytes of shared memory (limit {SHARED_MEMORY_LIMIT})")
            if choice["num_warps"] * 32 > THREADS_LIMIT:
                problems.append(f"{what}: {choice['num_warps'] * 32} threads a block (limit {THREADS_LIMIT})")
    return problems


def resource_usage(cubin: bytes) -> tuple:
    """(registers, local bytes) a thread of the cubin's kernel uses, from the cuobjdump that ships
    with Triton; (None, None) where it cannot run."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                  timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None, None
    found = re.search(r"REG:(\d+).*?LOCAL:(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def _first_lines(e: Exception) -> str:
    text = str(e).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " / ".join(lines[-3:])[:400] if lines else ""
