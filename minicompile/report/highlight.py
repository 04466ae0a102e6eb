"""Syntax highlighting for terminals (pygments when it is installed and stdout is a TTY) and for
HTML pages (highlight_html: a few regex token classes, no dependency).

pygments is optional: without it, or when output is piped or written to a file, text
stays plain so it can be diffed and grepped.
"""
from __future__ import annotations

import html
import os
import re
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


# For HTML pages (tools/report_html.py): a few token classes by regex, no dependency. The
# text is escaped piece by piece, so nothing the user wrote can become markup.
_KEYWORDS = {
    "python": r"and|as|assert|break|class|continue|def|del|elif|else|except|False|finally|for|from|if|import|in|"
              r"is|lambda|None|not|or|pass|raise|return|True|try|while|with|yield",
    "cpp": r"auto|bool|break|const|constexpr|continue|double|else|extern|float|for|if|inline|int|int64_t|"
           r"int32_t|int8_t|uint8_t|long|return|static|struct|void|while|#include|#pragma|omp|parallel|simd",
}
_COMMENT = {"python": r"#[^\n]*", "cpp": r"//[^\n]*|/\*.*?\*/"}
_TOKENS = {lang: re.compile(
    rf"(?P<comment>{_COMMENT[lang]})|(?P<string>\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*')"
    rf"|(?P<keyword>(?<![\w#])(?:{words})\b)|(?P<number>\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?[fL]?\b)", re.S)
    for lang, words in _KEYWORDS.items()}


def highlight_html(text: str, language: str | None) -> str:
    """``text`` HTML-escaped, its comments, strings, keywords and numbers in ``<span class=...>``."""
    pattern = _TOKENS.get(LEXERS.get(language or "", ""))
    if pattern is None:
        return html.escape(text)
    out, pos = [], 0
    for m in pattern.finditer(text):
        out += [html.escape(text[pos:m.start()]), f'<span class="{m.lastgroup}">{html.escape(m.group())}</span>']
        pos = m.end()
    return "".join(out) + html.escape(text[pos:])
