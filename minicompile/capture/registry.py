"""The opcode -> handler table the interpreter dispatches on.

Handler modules register themselves with ``@op("NAME", ...)``; the table is complete once
``minicompile.capture.interpreter`` has been imported (the package ``__init__`` does so).
"""
from __future__ import annotations

HANDLERS: dict = {}


def op(*names: str):
    def register(fn):
        for name in names:
            HANDLERS[name] = fn
        return fn
    return register
