"""Structure checks (tinygrad's sz.py idea): the op table and its backends agree, the docs match
the code. Each check is a plain function over data and is also run on a purpose-made violation,
so a check that can no longer fail is noticed."""
from __future__ import annotations

import operator
import re
from pathlib import Path

import torch

from minicompile.codegen import cpp_ops, triton_ops
from minicompile.decomp.core_ops import NATIVE_OPS, markdown_table
from minicompile.ir.ops import POINTWISE_OPS
from minicompile.lowering import LOWERINGS

ROOT = Path(__file__).resolve().parents[1]
aten = torch.ops.aten


# -- the checks --------------------------------------------------------------------------------

def ops_without_template(ops, templates) -> list[str]:
    """Pointwise ops a backend's template table cannot spell."""
    return sorted(op for op in ops if op not in templates)


def native_ops_without_lowering(native_ops, lowerings) -> list[str]:
    """Ops CORE_OPS calls native that the lowering would in fact run as externs."""
    return sorted(str(op) for op in native_ops if op not in lowerings and op is not operator.getitem)


GENERATED = re.compile(r"<!-- begin generated: markdown_table\(\) -->\n(.*?)<!-- end generated -->", re.S)


def doc_table_drift(doc: str, generated: str) -> str | None:
    """Why the generated block of docs/core-ops.md is not ``generated``, or None."""
    m = GENERATED.search(doc)
    if m is None:
        return "no generated block"
    return None if m.group(1) == generated else "the table differs from markdown_table()"


# -- on the code -----------------------------------------------------------------------------

def test_every_pointwise_op_has_a_template_in_each_backend():
    for backend in (cpp_ops, triton_ops):
        assert not ops_without_template(POINTWISE_OPS, backend.TEMPLATES), backend.__name__


def test_every_op_core_ops_calls_native_has_a_lowering():
    assert not native_ops_without_lowering(NATIVE_OPS, LOWERINGS)


def test_core_ops_doc_is_generated_from_the_code():
    drift = doc_table_drift((ROOT / "docs/core-ops.md").read_text(), markdown_table())
    assert drift is None, f"docs/core-ops.md: {drift}; paste in the output of markdown_table()"


# -- each check fails on a purpose-made violation ------------------------------------------------

def test_checks_report_violations():
    assert ops_without_template({"exp": None, "new_op": None}, {"exp": "e({0})"}) == ["new_op"]
    assert native_ops_without_lowering({aten.exp.default, operator.getitem}, {}) == ["aten.exp.default"]
    doc = "x\n<!-- begin generated: markdown_table() -->\n| a |\n<!-- end generated -->\n"
    assert doc_table_drift(doc, "| a |\n") is None
    assert doc_table_drift(doc, "| b |\n") is not None
    assert doc_table_drift("no block", "| a |\n") == "no generated block"
