"""The code generators' shared skeleton (codegen/common.py) and the C++ prelude header."""
from __future__ import annotations

import ctypes
import shutil

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.backend import minicompile_backend
from minicompile.codegen import BACKENDS
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


def _layer_norm_softmax(x, w, b):
    return torch.softmax(torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b) * 2.0, dim=-1)


def _dynamo_compile(fn, *inputs):
    """Through torch.compile, so FX nodes carry the user's source lines."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(minicompile_backend(gm, example_inputs))
        return graphs[-1]

    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend=backend)(*inputs)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, fn(*inputs))
    return graphs


def test_kernel_headers_group_fx_nodes_by_source_line_and_comment_each_argument():
    x, w, b = torch.randn(8, 32), torch.randn(32), torch.randn(32)
    line = _layer_norm_softmax.__code__.co_firstlineno + 1
    for backend in ("cpp", "triton"):
        if backend not in BACKENDS:
            continue
        with config_patch(cpu_backend=backend):
            (graph,) = _dynamo_compile(_layer_norm_softmax, x, w, b)
        src, c = graph.kernel_source, "//" if backend == "cpp" else "#"
        assert src.count(f"test_codegen_common.py:{line}") == 1, src  # once, not once per FX node
        group = next(ln for ln in src.splitlines() if f"test_codegen_common.py:{line}  <- " in ln)
        assert group.startswith(f"{c}   ") and "amax" in group and "exp" in group
        assert f"{c}       return torch.softmax(" in src
        assert "in: float32[8, 32]" in src and "in: float32[32]" in src and "out: float32[8, 32]" in src
