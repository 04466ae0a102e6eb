"""Structure checks, run by CI: a line budget per stage, printed as a table (tinygrad's sz.py idea;
`pytest -s -n 0 tests/test_structure.py` or `python tests/test_structure.py`), files and functions of a
bounded length, imports that follow the layering of docs/architecture.md, and an op table that its
lowering, backends and docs agree with.

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

# The pipeline's stages, in docs/architecture.md's order. The core is these plus the top-level modules;
# a new stage is one entry here and one in STAGE_BUDGETS.
STAGES = ("capture", "aot", "cpu", "decomp", "lowering", "ir", "scheduler", "codegen", "runtime")
TOP_LEVEL = "minicompile"   # the package's own modules (backend.py, pipeline.py, config.py, ...)
# Lines each stage of the core may have: today's counts. Lower one when code goes; a raise is a
# commit of its own whose message says what grew and why (git log holds the history).
STAGE_BUDGETS = {"capture": 6081, "aot": 2961, "cpu": 2027, "decomp": 1423, "lowering": 2009, "ir": 1464,
                 "scheduler": 923, "codegen": 3005, "runtime": 1421, TOP_LEVEL: 1192}
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80   # def line to last line

# docs/architecture.md's layering, as (importer, imported) stage pairs that must not occur.
FORBIDDEN_IMPORTS = {("ir", "scheduler"), ("ir", "codegen"), ("scheduler", "codegen"), ("decomp", "lowering"),
                     # aot/ is device-neutral: the CPU's policy (cpu/) is handed to it as a value, and
                     # lowering reads the stamps it leaves on nodes
                     ("lowering", "aot"), ("aot", "runtime"), ("aot", "cpu"), ("lowering", "cpu")}
# Generated code imports these; of minicompile, only the runtime.
GENERATED_MAY_IMPORT = ("torch", "triton", "minicompile.runtime")

# Imports inside a function, by (file, module): each needs a reason to exist.
ALLOWED_FUNCTION_IMPORTS = {
    ("minicompile/compile_options.py", "minicompile.backend"):
        "`import minicompile` stays light; the pipeline loads torch's tracing machinery on first compile",
    ("minicompile/cli.py", "minicompile.tools"): "the CLI loads a subcommand's tools only when it runs",
    ("minicompile/cli.py", "minicompile.runtime"): "the CLI loads a subcommand's tools only when it runs",
    ("minicompile/testing/fuzz_train.py", "minicompile.testing.fuzz_train_dynamic"):
        "fuzz_train_dynamic builds on fuzz_train (a cycle at the top); --dynamic loads it when asked",
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
    ("minicompile/tools/models_more.py", "transformers"): "optional dependency, the HF models of bench --models only",
    ("minicompile/tools/models.py", "minicompile.tools.models_more"):
        "the wider suite builds on models.py's classes: imported once they exist",
    ("minicompile/tools/train_models.py", "transformers"):
        "optional dependency, the HF models of bench --train --models only",
    ("minicompile/testing/tryout_models.py", "timm"): "optional dependency, the real-model tryout's timm rows only",
    ("minicompile/testing/tryout_models.py", "transformers"):
        "optional dependency, the real-model tryout's HF rows only",
}


# -- the checks ------------------------------------------------------------------------------------

def python_files(root: Path) -> list[Path]:
    """Every .py file of the checkout, skipping hidden folders (.venv, .git) and caches."""
    return sorted(p for p in root.rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))


def stage_of(path: Path, package: Path) -> str | None:
    """The core stage a file of ``package`` belongs to (TOP_LEVEL for the package's own modules), or
    None outside the core (tools/, testing/, report/)."""
    parts = path.relative_to(package).parts
    if len(parts) == 1:
        return TOP_LEVEL
    return parts[0] if parts[0] in STAGES else None


def core_files(package: Path) -> list[Path]:
    return [p for p in python_files(package) if stage_of(p, package) is not None]


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def stage_sizes(files: list[Path], package: Path) -> dict[str, tuple[int, int]]:
    """Stage -> (files, lines) of the core ``files``, in STAGES order, the top-level modules last."""
    sizes = dict.fromkeys((*STAGES, TOP_LEVEL), (0, 0))
    for p in files:
        n, lines = sizes[stage := stage_of(p, package)]
        sizes[stage] = (n + 1, lines + line_count(p))
    return sizes


def size_table(sizes: dict, budgets: dict) -> str:
    """The stages' sizes against their budgets, and the core's total, as a text table."""
    rows = [("stage", "files", "lines", "budget", "headroom")]
    for stage_name, (n, lines) in sizes.items():
        budget = budgets.get(stage_name)
        rows.append((stage_name, n, lines, "-" if budget is None else budget, "-" if budget is None else budget - lines))
    files, lines = (sum(col) for col in zip(*sizes.values()))
    budget = sum(budgets.get(s, 0) for s in sizes)
    rows.append(("total", files, lines, budget, budget - lines))
    return "\n".join(f"{r[0]:<12}" + "".join(f"{v:>10}" for v in r[1:]) for r in rows)


def over_budget(sizes: dict, budgets: dict) -> list[str]:
    """The stages over their line budget, or without one."""
    return [f"{s}: no budget in STAGE_BUDGETS" if s not in budgets else
            f"{s}: {lines} lines, over its budget of {budgets[s]} (a raise is its own commit, saying why)"
            for s, (_, lines) in sizes.items() if s not in budgets or lines > budgets[s]]


def long_files(files: list[Path], limit: int) -> list[str]:
    return [f"{p}: {n} lines" for p in files if (n := line_count(p)) > limit]


def long_functions(sources: dict[str, str], limit: int) -> list[str]:
    """Functions and methods over ``limit`` lines, from the def line to the last line."""
    return [f"{rel}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for rel, source in sources.items() for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


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


def core_size_table() -> str:
    return size_table(stage_sizes(core_files(PACKAGE), PACKAGE), STAGE_BUDGETS)


def test_each_stage_stays_under_its_line_budget():
    print("\n" + core_size_table())   # shown by `pytest -s -n 0` and on failure
    assert not over_budget(stage_sizes(core_files(PACKAGE), PACKAGE), STAGE_BUDGETS)


def test_no_file_over_600_lines():
    assert not long_files(python_files(ROOT), MAX_FILE_LINES)


def test_no_function_over_80_lines():
    """All of the package, tools/ and testing/ included: none of their functions needs more."""
    assert not long_functions(package_sources(), MAX_FUNCTION_LINES)


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
    sizes = stage_sizes(files, tmp_path / "pkg")
    assert sizes["ir"] == (1, 5) and sizes[TOP_LEVEL] == (1, 1) and sizes["capture"] == (0, 0)
    budgets = {**dict.fromkeys(sizes, 0), "ir": 5, TOP_LEVEL: 1}
    assert over_budget(sizes, budgets) == []
    assert over_budget(sizes, {**budgets, "ir": 4}) == [
        "ir: 5 lines, over its budget of 4 (a raise is its own commit, saying why)"]
    assert over_budget(sizes, {s: b for s, b in budgets.items() if s != "ir"}) == ["ir: no budget in STAGE_BUDGETS"]
    table = size_table(sizes, budgets).splitlines()
    assert table[0].split() == ["stage", "files", "lines", "budget", "headroom"]
    assert table[1 + STAGES.index("ir")].split() == ["ir", "1", "5", "5", "0"]
    assert table[-1].split() == ["total", "2", "6", "6", "0"]
    assert long_files(files, 4) == [f"{big}: 5 lines"]


def test_function_length_check_reports_violations():
    def function(name: str, lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x = {k}\n" for k in range(lines - 1))
    source = function("fits", 80) + "\n\nclass C:\n" + function("too_long", 81, indent="    ")
    assert long_functions({"m.py": source}, 80) == ["m.py:84 too_long: 81 lines"]


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


if __name__ == "__main__":
    print(core_size_table())
