"""Kernels with the same code, built once.

A model whose layers repeat (a transformer's blocks, the blocks of a ResNet stage) fuses every
layer into the same kernels over other buffers: GPT-2's backward makes 45 kernels, 21 of them
distinct. Each distinct kernel is compiled once (g++, or Triton's JIT on a GPU); a later kernel
with the same code refers to the first (C++: a forwarder, a function of its own name and
parameters that calls the first with its buffers and compiles to a jump; Triton: the module
name bound to the first's function), so the wrapper is unchanged.

"The same code" is decided on the rendered kernel with the parameters renamed by position: two
kernels whose parameters and bodies are equal after that compute the same function of their
arguments, whatever each was planned from. A name the renaming misses (a scratch array named
after a buffer) only makes two kernels look different, never the same.
"""
from __future__ import annotations

import re


def code_key(lines: list, names: list) -> str:
    """``lines`` (a kernel's parameters and body, without its name or comments) with every
    parameter in ``names`` named by its position."""
    text = "\n".join(lines)
    if not names:
        return text
    index = {n: k for k, n in enumerate(names)}
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return word.sub(lambda m: f"$p{index[m.group(1)]}", text)   # no C++ or Python name has a '$'


def cpp_forwarder(ck, first) -> str:
    """C++ kernel ``ck`` as a call of ``first``, a kernel of the same code that may sit in another
    translation unit, hence the declaration."""
    declaration = f'extern "C" {{ void {first.k.name}({", ".join(first.param_code)}); }}'
    call = f"    {first.k.name}({', '.join(ck.param_names())});"
    return "\n".join(ck.header() + [f"// the same code as {first.k.name}, on this kernel's buffers", declaration]
                     + ck.signature() + ["{", call, "}"])
