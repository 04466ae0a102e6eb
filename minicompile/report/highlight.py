"""Syntax highlighting for terminals: pygments when it is installed and stdout is a TTY.

pygments is optional: without it, or when output is piped or written to a file, text
stays plain so it can be diffed and grepped.
"""
from __future__ import annotations

import os
import sys

try:
    import pygments
    from pygments.formatters import TerminalFormatter
    from pygments.lexers import get_lexer_by_name
except ImportError:  # optional dependency
    pygments = None

# Artifact language -> pygments lexer name.
LEXERS = {"cpp": "cpp", "python": "python", "triton": "python"}


def wants_color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return pygments is not None and hasattr(stream, "isatty") and stream.isatty()


def highlight(text: str, language: str | None, stream=None) -> str:
    """``text`` colored for ``stream`` (default stdout) when that is a terminal, else unchanged."""
    stream = stream or sys.stdout
    if not language or language not in LEXERS or not wants_color(stream):
        return text
    return pygments.highlight(text, get_lexer_by_name(LEXERS[language]), TerminalFormatter())
