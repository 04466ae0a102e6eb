"""C++ loop nests, shared by the kernel forms (codegen/cpp.py, cpp_columns.py)."""
from __future__ import annotations


def nest(headers: list, body: list) -> list:
    """Nested loops: ``headers[d]`` holds loop d's pragma and for-line."""
    out = []
    for d, hdr in enumerate(headers):
        out += ["    " * d + h for h in hdr] + ["    " * d + "{"]
    out += ["    " * len(headers) + b for b in body]
    for d in reversed(range(len(headers))):
        out.append("    " * d + "}")
    return out
