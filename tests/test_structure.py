"""Structure checks, run by CI (tinygrad's sz.py idea): size budgets, imports that follow the
layering of docs/architecture.md, and an op table that its lowering, backends and docs agree with.

Each check is a plain function over data (a list of files, an import graph, a source text) and
returns what it found wrong. The tests at the end run every check on a purpose-made violation,
so a check that can no longer fail is noticed.
"""
from __future__ import annotations

import ast
import operator
import re
from pathlib import Path

import pytest
import torch

from minicompile.codegen import cpp_ops, triton_ops
from minicompile.config import patch
from minicompile.decomp.core_ops import NATIVE_OPS, markdown_table
from minicompile.ir.ops import POINTWISE_OPS
from minicompile.lowering import LOWERINGS
from minicompile.pipeline import compile_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minicompile"
aten = torch.ops.aten

# The pipeline's stages, in docs/architecture.md's order. The core is these plus the top-level modules.
STAGES = ("capture", "aot", "decomp", "lowering", "ir", "scheduler", "codegen", "runtime")
# The review's goal was 10,000 lines; the core measured 10,193 when this check was added. Compiled
# optimizer steps, aliasing, mutating custom ops, modes/options, CUDA graphs, CPU autotuning, profiler
# events and the printable loop IR then added about 1,150 lines (11,345). The budget sits just
# above that: lower it as code is removed, never raise it by habit. Symbolic sizes (~250 lines) and
# compiled training (joint trace, min-cut partitioner, autograd runtime, backward decompositions,
# ~600 lines) and the front end's never-crash work came next: 12,517 measured with all of them.
# Training whole models (BatchNorm's running statistics written back, dropout, the batch-norm,
# slice/select and nll_loss backward decompositions, 236 lines) came next: 12,772.
# Backward-shaped CPU kernels (column reductions with interchanged loops, per-row loads moved
# out of loops, ~110 lines) came next.
# Horizontal C++ kernel groups (one call and one parallel region for independent kernels, the
# optimizer step's fix; codegen/cpp_groups.py and the wrapper's group calls) added ~130.
# Capturing HF models and image models in one graph (objects made while tracing, super(), Python
# __getattribute__/__setattr__/__getitem__ hooks, try/with blocks traced, state queries, map/filter,
# deque) added ~580.
# Symbolic sizes in the Triton kernels and launcher, symbolic cat/pad/slice/argmax lowerings and
# fusion of coarser symbolic ranges added ~120 lines; division by a polynomial (a KV
# cache s + 1 long, so generate() compiles 3 times, not once per token) and quotient ranges ~45.
# Channels-last convolution graphs with loops in memory order (aot/conv_layout.py, issue 15)
# added ~105.
# Automatic dynamic sizes in our front end (capture/dynamic.py: sizes that changed become symbols,
# SymInts as graph nodes, the ShapeEnv's guards, the static retrace, compile(dynamic=...) and
# mark_dynamic) added ~190: 14231 measured with all of them.
# Generator functions inlined lazily in the front end (LazyIter over a suspended Frame, yield from,
# lazy zip/enumerate/map/filter over them) and @contextlib.contextmanager with-blocks added ~210.
# The measured choice between MKL's sgemm and oneDNN's matmul per product shape
# (aot/cpu_policy.py, runtime/autotune.library_choice) and pow's products added ~130.
# Inference values computed from parameters alone prepared once per version (aot/prepare.py:
# static inputs, conv + BatchNorm folding, the split; runtime/prepared.py's cache) added ~305; 1x1
# convolutions of NHWC pixels as oneDNN linear (aot/conv_layout.py) ~50.
# One buffer for a value that an extern or output reads through a view, and reduction kernels
# joined only by members that share a load (the training step's extra memory passes) added ~26.
# Linear-time scheduling (indexed fusion candidates, ancestor bit masks; tests/test_compile_scaling.py)
# and realizing a value that loads many buffers added ~33; `minicompile bench --dynamic` in cli.py 9.
# Off-by-default prepared weights and its freezing alias, and the merges' joined docstrings, ~15.
# Channels-last convolutions through training's forward and backward (aot/conv_layout_train.py and
# its hook in aot/joint.py) added ~130; max pooling's indices saved as int8 window offsets
# (aot/pool_offsets.py) ~105. The same-memory check before an output is viewed through its
# realized root (lowering/graph.py) 7.
# Real-model kernels (issue 15): repeat and roll as index math, max pooling as a window of loads
# (lowering/pooling.py), views of lazy values stored like the values, loops split where indices
# divide them (scheduler/kernel.py), the float blend for where, and the measured convolution
# layout (aot/conv_layout.py, runtime/autotune.library_times) added ~315; matrix products into
# the wrapper's buffers and MKL preferred within a margin (fewer page faults) ~30.
# Issue 15 again: the measured flash-or-math attention choice (aot/cpu_policy.py) ~45, convolutions
# of eager channels-last inputs left out of the layout choice (aot/conv_layout.py) ~40, per-channel
# values computed before a kernel's loops (codegen/cpp_channels.py) ~70, and column reductions
# under more than one outer loop ~10: 15813 measured. Compile time: a graph's kernels built as
# parallel translation units (runtime/cpp_build.py) and each kernel's reads recorded once ~65;
# unique graph argument names in capture ~10, values compared bit for bit kept out of backward's
# recompute (aot/partition.py) ~12.
# Issue 24's front-end semantics: getattr/hasattr answered where Python raises AttributeError (the
# absence guarded), id() of identity-guarded values, NumPy values of tensors opaque, ~155: 16068;
# .item()'s floats as unspecialised graph inputs and the recompile limit's honest message ~125;
# deques from inputs traced on copies ~12: 16205. User text escaped once for every generated
# comment (codegen/common.py comment_text) ~13. Attention on every shape: timing operands laid
# out as the traced ones (stride 0 included) and the math form where no candidate runs ~32.
# GPU runs: a 0-d input loaded as a block, float64 sqrt templates, CUDA's stride rule, refused
# CUDA-graph captures, the GPU's bf16 conversion ~55: 16307. minicompile.compile takes
# torch.compile's arguments (compile_options.py: fullgraph, mode, options, backend by name) and
# inlines a module's own __call__ (transformers 5.17's checkpointing layers) ~140: 16449.
# Issue 23: data-dependent sizes and numbers computed at run time (lowering/graph.py's scalar
# nodes and size bindings, the wrapper's bindings, the scheduler's order after them, ranges of
# unbacked symbols), the global state restored around compiling (aot/global_state.py),
# flex_attention's vmap traced alone, and the symbolic path's errors raised under
# MINICOMPILE_FALLBACK=0 added ~255: 16164 measured alone, 16705 with the work above. Issue
# 23's layout contract: ops that read a layout checked against eager's strides in both
# channels-last passes (aot/layout_readers.py), eager's draws for non-contiguous random ops, the
# backward's fallback on traced layouts, symbolic elementwise strides ~280: 16988; the pooling
# offsets' rebuild placed before the first reader as the graph stood 3: 16991. A storage reader
# (as_strided, as_strided_scatter) of a chain of views reads the viewed value's whole storage in
# eager's layout (lowering/graph.py storage_view) 52: 18046; the channels-last passes check the
# layout of the value that owns a storage reader's view (aot/layout_readers.py) 36: 18082; the
# memory an extern view reads kept out of the wrapper's reuse pool while the view lives 9: 18091.
# The GPU fixes of the bug-class fuzzer's first CUDA run (padded extern strides, aligned
# attention bias rows, memory-order draws on CUDA) 55: 18146. Our front end: generators live across
# a break stepped lazily in Python, inputs read before side effects replay, pairwise modelled 61.
# Unbacked sizes: two sizes a run-time check found equal taken as one, F.pad of a size from data,
# numbers from data that tracing replaced checked at run time, extern result sizes checked ~100: 18305.
CORE_LINE_BUDGET = 18_628
MAX_FILE_LINES = 600

# docs/architecture.md's layering, as (importer, imported) stage pairs that must not occur.
FORBIDDEN_IMPORTS = {("ir", "scheduler"), ("ir", "codegen"), ("scheduler", "codegen"), ("decomp", "lowering")}
# Generated code imports these; of minicompile, only the runtime.
GENERATED_MAY_IMPORT = ("torch", "triton", "minicompile.runtime")

# Imports inside a function, by (file, module): each needs a reason to exist.
ALLOWED_FUNCTION_IMPORTS = {
    ("minicompile/compile_options.py", "minicompile.backend"):
        "`import minicompile` stays light; the pipeline loads torch's tracing machinery on first compile",
    ("minicompile/cli.py", "minicompile.tools"): "the CLI loads a subcommand's tools only when it runs",
    ("minicompile/cli.py", "minicompile.runtime"): "the CLI loads a subcommand's tools only when it runs",
    ("minicompile/testing/fuzz.py", "minicompile.testing.fuzz_dynamic"):
        "fuzz_dynamic builds on fuzz (a cycle at the top); --dynamic loads it when asked",
    ("minicompile/runtime/triton_launch.py", "triton"): "optional dependency: a clear error where it is missing",
    ("minicompile/runtime/triton_launch.py", "triton.testing"): "optional dependency, autotuning only",
    ("minicompile/runtime/triton_interpret.py", "triton.runtime.interpreter"):
        "importable only where Triton's interpreter runs",
    ("minicompile/testing/opinfo_sweep.py", "torch.testing._internal.common_methods_invocations"):
        "the OpInfo database takes seconds to import; only the sweep needs it",
    ("minicompile/tools/bench.py", "matplotlib"): "optional dependency, --plot only",
    ("minicompile/tools/bench.py", "matplotlib.pyplot"): "optional dependency, --plot only",
    ("minicompile/tools/models.py", "transformers"): "optional dependency, the HF models of bench --models only",
    ("minicompile/testing/tryout_models.py", "timm"): "optional dependency, the real-model tryout's timm rows only",
    ("minicompile/testing/tryout_models.py", "transformers"):
        "optional dependency, the real-model tryout's HF rows only",
}


# -- the checks ------------------------------------------------------------------------------------

def python_files(root: Path) -> list[Path]:
    """Every .py file of the checkout, skipping hidden folders (.venv, .git) and caches."""
    return sorted(p for p in root.rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))


def core_files(package: Path) -> list[Path]:
    return [p for p in python_files(package) if p.parent == package or p.relative_to(package).parts[0] in STAGES]


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def over_budget(files: list[Path], budget: int) -> int | None:
    """The total line count of ``files`` where it exceeds ``budget``."""
    total = sum(map(line_count, files))
    return total if total > budget else None


def long_files(files: list[Path], limit: int) -> list[str]:
    return [f"{p}: {n} lines" for p in files if (n := line_count(p)) > limit]


def imports_in(source: str) -> list[tuple[int, tuple[str, ...], bool]]:
    """(line, candidates, inside a function) per imported name. ``from a import b`` may import
    module ``a.b`` or a name of ``a``, which the source alone cannot tell: its candidates are
    ``("a.b", "a")``, the last one the module that surely runs."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((child.lineno, (a.name,), inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.extend((child.lineno, (f"{child.module}.{a.name}", child.module), inner) for a in child.names)
            visit(child, inner)
    visit(ast.parse(source), False)
    return found


def function_level_imports(sources: dict[str, str], allowed) -> list[str]:
    """Imports inside functions that the allow-list does not name (by file and module)."""
    bad = []
    for rel, source in sources.items():
        by_line: dict[int, set] = {}
        for line, candidates, inner in imports_in(source):
            if inner:
                by_line.setdefault(line, set()).update(candidates)
        bad += [f"{rel}:{line} imports {min(modules, key=len)} inside a function"
                for line, modules in sorted(by_line.items()) if not any((rel, m) in allowed for m in modules)]
    return bad


def module_of(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str], modules_only: bool = False) -> set[tuple[str, str]]:
    """(importer, imported) minicompile modules; ``modules_only`` keeps module-level imports."""
    known = {module_of(rel) for rel in sources}
    edges = set()
    for rel, source in sources.items():
        for _, candidates, inner in imports_in(source):
            target = next((m for m in candidates if m in known), None)
            if target is not None and target != module_of(rel) and not (modules_only and inner):
                edges.add((module_of(rel), target))
    return edges


def stage(module: str) -> str:
    """'minicompile.ir.ops' -> 'ir'; a top-level module is its own name ('pipeline')."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "minicompile"


def layering_violations(edges) -> list[str]:
    """Imports that break docs/architecture.md's layering: a forbidden pair of stages; a stage importing
    the front (pipeline, backend, cli, tools, testing, report; config is everyone's); the
    runtime importing the compiler (generated code imports the runtime)."""
    bad = []
    for a, b in sorted(edges):
        sa, sb = stage(a), stage(b)
        if sa == sb or sa not in STAGES:
            continue
        front = sb not in STAGES and sb != "config"
        if (sa, sb) in FORBIDDEN_IMPORTS or front or (sa == "runtime" and sb != "config"):
            bad.append(f"{a} imports {b}")
    return bad


def import_cycles(edges) -> list[list[str]]:
    """Cycles in an import graph: one per back edge of a depth-first search."""
    graph: dict[str, set] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def generated_imports(source: str) -> list[str]:
    """Modules generated code imports that it must not (anything but torch, triton, the runtime)."""
    modules = {candidates[-1] for _, candidates, _ in imports_in(source)}
    return sorted(m for m in modules if not any(m == ok or m.startswith(ok + ".") for ok in GENERATED_MAY_IMPORT))


def ops_without_template(ops, templates) -> list[str]:
    """Pointwise ops a backend's template table cannot spell."""
    return sorted(op for op in ops if op not in templates)


def native_ops_without_lowering(native_ops, lowerings) -> list[str]:
    """Ops CORE_OPS calls native that the lowering would in fact run as externs."""
    return sorted(str(op) for op in native_ops if op not in lowerings and op is not operator.getitem)


GENERATED_DOC = re.compile(r"<!-- begin generated: markdown_table\(\) -->\n(.*?)<!-- end generated -->", re.S)


def doc_table_drift(doc: str, generated: str) -> str | None:
    """Why the generated block of docs/core-ops.md is not ``generated``, or None."""
    m = GENERATED_DOC.search(doc)
    if m is None:
        return "no generated block"
    return None if m.group(1) == generated else "the table differs from markdown_table()"


# -- on the code -----------------------------------------------------------------------------------

def package_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in python_files(PACKAGE)}


def test_core_stays_under_its_line_budget():
    total = over_budget(core_files(PACKAGE), CORE_LINE_BUDGET)
    assert total is None, f"the core has {total} lines, over its budget of {CORE_LINE_BUDGET}"


def test_no_file_over_600_lines():
    assert not long_files(python_files(ROOT), MAX_FILE_LINES)


def test_function_level_imports_are_allowed_with_a_reason():
    assert not function_level_imports(package_sources(), ALLOWED_FUNCTION_IMPORTS)


def test_imports_follow_the_layering():
    assert not layering_violations(import_graph(package_sources()))


def test_no_import_cycles():
    assert not import_cycles(import_graph(package_sources(), modules_only=True))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_generated_code_imports_only_the_runtime(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    with patch(cpu_backend=backend):
        c = compile_graph(torch.fx.symbolic_trace(lambda a: (a.sin() + 1).softmax(-1) @ a.t()), [torch.randn(4, 8)])
    python_sources = [c.wrapper_source] + ([c.kernel_source] if backend == "triton" else [])
    assert not [m for s in python_sources for m in generated_imports(s)]


def test_every_pointwise_op_has_a_template_in_each_backend():
    for backend in (cpp_ops, triton_ops):
        assert not ops_without_template(POINTWISE_OPS, backend.TEMPLATES), backend.__name__


def test_every_op_core_ops_calls_native_has_a_lowering():
    assert not native_ops_without_lowering(NATIVE_OPS, LOWERINGS)


def test_core_ops_doc_is_generated_from_the_code():
    drift = doc_table_drift((ROOT / "docs/core-ops.md").read_text(), markdown_table())
    assert drift is None, f"docs/core-ops.md: {drift}; paste in the output of markdown_table()"


# -- each check reports a purpose-made violation ----------------------------------------------------

def test_size_checks_report_violations(tmp_path):
    (tmp_path / "pkg" / "ir").mkdir(parents=True)
    (tmp_path / "pkg" / "tools").mkdir()
    big = tmp_path / "pkg" / "ir" / "big.py"
    big.write_text("a = 1\n" * 5)
    (tmp_path / "pkg" / "top.py").write_text("b = 2\n")
    (tmp_path / "pkg" / "tools" / "t.py").write_text("c = 3\n" * 50)
    files = core_files(tmp_path / "pkg")
    assert sorted(p.name for p in files) == ["big.py", "top.py"]
    assert over_budget(files, 5) == 6 and over_budget(files, 6) is None
    assert long_files(files, 4) == [f"{big}: 5 lines"]


def test_import_checks_report_violations():
    source = "import os\n\ndef f():\n    import shutil\n    from triton import jit\n"
    assert function_level_imports({"m.py": source}, {("m.py", "triton")}) == ["m.py:4 imports shutil inside a function"]
    sources = {"minicompile/ir/graph.py": "from minicompile.codegen import common\n",
               "minicompile/codegen/common.py": "import minicompile.ir.graph\nimport minicompile.runtime.cache\n",
               "minicompile/runtime/cudagraphs.py": "def f():\n    from minicompile.codegen.common import k\n",
               "minicompile/runtime/cache.py": "from minicompile.config import config\n",
               "minicompile/decomp/x.py": "from minicompile import pipeline\n",
               "minicompile/pipeline.py": "", "minicompile/config.py": ""}
    edges = import_graph(sources)
    assert layering_violations(edges) == ["minicompile.decomp.x imports minicompile.pipeline",
                                          "minicompile.ir.graph imports minicompile.codegen.common",
                                          "minicompile.runtime.cudagraphs imports minicompile.codegen.common"]
    assert import_cycles(import_graph(sources, modules_only=True)) == [
        ["minicompile.codegen.common", "minicompile.ir.graph", "minicompile.codegen.common"]]
    assert generated_imports("import torch\nfrom minicompile.runtime.host_pool import take\n") == []
    assert generated_imports("from minicompile.lowering import graph\nimport numpy\n") == [
        "minicompile.lowering", "numpy"]


def test_op_table_checks_report_violations():
    assert ops_without_template({"exp": None, "new_op": None}, {"exp": "e({0})"}) == ["new_op"]
    assert native_ops_without_lowering({aten.exp.default, operator.getitem}, {}) == ["aten.exp.default"]
    doc = "x\n<!-- begin generated: markdown_table() -->\n| a |\n<!-- end generated -->\n"
    assert doc_table_drift(doc, "| a |\n") is None
    assert doc_table_drift(doc, "| b |\n") is not None
    assert doc_table_drift("no block", "| a |\n") == "no generated block"
