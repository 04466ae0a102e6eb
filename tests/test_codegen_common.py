"""The code generators' shared skeleton (codegen/common.py) and the C++ prelude header."""
from __future__ import annotations

import ctypes
import math
import re
import shutil
import threading
from types import SimpleNamespace

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.codegen import BACKENDS, cpp_ops, triton_ops
from minicompile.codegen.common import ARG_REDUCTIONS, acc_dtype, identity_value
from minicompile.codegen.cpp import CppKernel
from minicompile.codegen.triton import TritonKernel
from minicompile.config import patch as config_patch
from minicompile.pipeline import compile_graph
from minicompile.runtime import cpp_build
from tests.helpers import compile_with_dynamo

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
        # the shipped prelude precompiled first (GCC): a build must not take it for the edited one
        monkeypatch.setattr(cpp_build, "_pch", {"started": False, "dir": None, "key": None})
        cpp_build.start_precompiled_prelude()
        for t in threading.enumerate():
            if t.name == "minicompile-pch":
                t.join()
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
    out, graphs = compile_with_dynamo(fn, *inputs, grad=True)
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


KINDS = ["sum", "prod", "max", "min", "any", "all", "argmax", "argmin"]


def _reduction(kind, dtype, n):
    data = SimpleNamespace(reduction_type=kind, src_dtype=dtype, reduction_ranges=[n])
    return SimpleNamespace(dtype=torch.int64 if kind in ARG_REDUCTIONS else dtype, data=data)


def test_every_reduction_kind_has_an_identity_and_combine_in_each_backend():
    assert set(cpp_ops.REDUCTIONS) == set(triton_ops.REDUCTIONS) == set(KINDS)
    assert identity_value(-math.inf, torch.int32) == -2 ** 31 and identity_value(math.inf, torch.bool) is True
    assert CppKernel.identity("max", torch.int64) == "std::numeric_limits<int64_t>::min()"
    assert CppKernel.identity("sum", torch.float32) == "0.0f"
    assert TritonKernel.identity("min", torch.int8) == "127"
    assert TritonKernel.identity("max", torch.float32) == "float('-inf')"


def test_long_float32_sums_accumulate_in_double_in_cpp_only():
    # C++ keeps a double total of short float32 partials (cpp_sums.py); Triton's per-lane partial sums
    long_sum, short_sum = _reduction("sum", torch.float32, 100_000), _reduction("sum", torch.float32, 32)
    assert CppKernel.acc_dtype(long_sum) == torch.float64
    assert CppKernel.acc_dtype(short_sum) == torch.float32
    assert TritonKernel.acc_dtype(long_sum) == torch.float32
    assert acc_dtype(_reduction("argmax", torch.bfloat16, 10), None) == torch.float32  # the values', computed
    assert acc_dtype(_reduction("max", torch.float64, 100_000), 8192) == torch.float64


def test_cpp_literals_are_exact_and_read_as_cpp():
    assert cpp_ops.literal(0, torch.float32) == "0.0f" and cpp_ops.literal(-0.5, torch.float32) == "(-0.5f)"
    assert cpp_ops.literal(1e-5, torch.float32) == "static_cast<float>(1e-05)"  # not a float32: rounded as eager
    assert cpp_ops.literal(0.1, torch.float64) == "0.1"
    assert cpp_ops.literal(-2 ** 63, torch.int64) == "std::numeric_limits<int64_t>::min()"
    assert cpp_ops.literal(3, torch.int64) == "INT64_C(3)"


def test_cpp_kernels_are_rendered_once_and_skip_no_op_casts(monkeypatch):
    rendered = []
    render = CppKernel.render
    monkeypatch.setattr(CppKernel, "render", lambda self: rendered.append(self.k.name) or render(self))
    fn = lambda x: (torch.softmax(x, -1), x.argmax(-1), (x * 0.5).sum())
    c = _compile(fn, torch.randn(6, 40))
    assert sorted(rendered) == sorted(k.name for k in c.schedule.kernels)
    for out, ref in zip(c(torch.ones(6, 40)), fn(torch.ones(6, 40))):
        torch.testing.assert_close(out, ref)
    src = c.kernel_source
    assert "= 0.0f;" in src and "0.5f" in src
    assert not re.search(r"float \w+ = static_cast<float>\(tmp|\+ static_cast<float>\(tmp|v = static_cast<float>", src)


def test_a_big_graph_builds_as_parallel_translation_units(tmp_path, monkeypatch):
    # runtime/cpp_build.py: the kernels and groups are split into parts compiled at once, then linked
    monkeypatch.setattr(cpp_build, "PART_MIN_LINES", 1)
    monkeypatch.setattr(cpp_build.os, "cpu_count", lambda: 2)

    def fn(x, y, p, q):
        p.mul_(0.5)
        q.add_(1.0)   # two independent in-place updates: one horizontal group of static kernels
        return torch.softmax(x, -1), (y.sin() * 2).sum(0)
    torch.manual_seed(0)
    inputs = [torch.randn(64, 32), torch.randn(16, 8), torch.randn(300, 300), torch.randn(300, 300)]
    eager_inputs = [t.clone() for t in inputs]
    expected = fn(*eager_inputs)
    with config_patch(cache_dir=str(tmp_path), parallel_threshold=1):
        c = _compile(fn, *[t.clone() for t in inputs])
        out = c(*inputs)
    for a, b in zip([*out, *inputs], [*expected, *eager_inputs]):   # outputs and the updated inputs
        torch.testing.assert_close(a, b)
    parts = {p.name: p.read_text() for p in tmp_path.glob("cpp/*/*/kernels.part*.cpp")}
    assert sorted(parts) == ["kernels.part0.cpp", "kernels.part1.cpp"], sorted(parts)
    assert "group0(" in c.wrapper_source
    (group,) = [src for src in parts.values() if "void group0(" in src]
    members = re.findall(r"static void (\w+)\(", group)   # the group's members live in its part
    assert len(members) == 2 and all(f"{m}(" in group.split("void group0(")[1] for m in members)
