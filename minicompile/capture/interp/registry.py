"""The opcode -> handler table the interpreter dispatches on.

Handler modules register themselves with ``@op("NAME", ...)``; the table is complete once
``minicompile.capture.interp.interpreter`` has been imported (the package ``__init__`` does so).
"""
from __future__ import annotations

HANDLERS: dict = {}


def registrar(table: dict):
    """A decorator factory: ``@reg("A", "B")`` puts the function into ``table`` under each name."""
    def named(*names: str):
        def register(fn):
            for name in names:
                table[name] = fn
            return fn
        return register
    return named


op = registrar(HANDLERS)
