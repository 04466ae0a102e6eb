"""The code generators' shared skeleton (codegen/common.py) and the C++ prelude header."""
from __future__ import annotations

import ctypes
import shutil

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.config import patch as config_patch
from minicompile.pipeline import compile_graph
from minicompile.runtime import cpp_build

# 42 with the shipped prelude; MC_PROBE where a header defines it
PROBE = ('#include "minicompile_prelude.h"\n'
         'extern "C" void kernel0(float* out) {\n'
         '#ifdef MC_PROBE\n    out[0] = MC_PROBE;\n#else\n    out[0] = mc_max(42.0f, 1.0f);\n#endif\n}\n')


def _run(source: str) -> tuple[str, float]:
    path = cpp_build.build(source)
    out = torch.zeros(1)
    ctypes.CDLL(path).kernel0(ctypes.c_void_p(out.data_ptr()))
    return path, float(out[0])


def _compile(fn, *inputs):
    return compile_graph(make_fx(fn, tracing_mode="fake")(*inputs), list(inputs))


def test_a_changed_prelude_header_rebuilds_the_kernels(tmp_path, monkeypatch):
    edited = tmp_path / "include"
    shutil.copytree(cpp_build.INCLUDE_DIR, edited)
    with open(edited / cpp_build.PRELUDE_HEADER, "a") as f:
        f.write("#define MC_PROBE 7.0f\n")
    with config_patch(cache_dir=str(tmp_path / "cache")):
        shipped, value = _run(PROBE)
        assert value == 42.0
        monkeypatch.setattr(cpp_build, "INCLUDE_DIR", str(edited))
        rebuilt, value = _run(PROBE)
        assert rebuilt != shipped and value == 7.0  # a new cache entry, built with the edited header
        monkeypatch.undo()
        assert _run(PROBE) == (shipped, 42.0)  # the original entry is still valid


def test_printed_cpp_source_is_the_kernels_and_includes_the_prelude():
    c = _compile(lambda x: torch.softmax(x, -1), torch.randn(4, 32))
    src = c.kernel_source
    assert src.startswith(f'#include "{cpp_build.PRELUDE_HEADER}"\n')
    assert "static inline float mc_exp" not in src and "mc_exp(" in src  # called, not defined here
