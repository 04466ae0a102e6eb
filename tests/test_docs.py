"""Every command and code block in README.md and docs/*.md runs as written (issue 28).

Fenced ```bash and ```python blocks are executed; other fences (program output, C++ source,
diagrams) are shown, not run. A marker comment on the line before a block changes how it runs:

    <!-- doc-test: skip (reason) -->       not run: it needs a GPU, a network, or is this suite itself
    <!-- doc-test: slow (reason) -->       runs only under `pytest -m slow` (it takes minutes)
    <!-- doc-test: continues -->           a Python block that runs after the file's previous Python block

Markers combine (`<!-- doc-test: slow, continues (reason) -->`); skip and slow need a reason.
Shell commands run one at a time with bash in a scratch directory that links every top-level
entry of the checkout (so `examples/mlp.py` and `--out artifacts/` work and write nothing into
the checkout); `minicompile`, `python`, `python3` and `.venv/bin/python` there are this
interpreter with the checkout on PYTHONPATH. Python blocks run as scripts the same way.
"""
import json
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from minicompile.tools import doc_numbers
from tests.helpers import subprocess_env

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGUAGES = ("bash", "python")
MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<kinds>[a-z, ]+?)\s*(\((?P<reason>.+)\))?\s*-->")
KINDS = {"skip", "slow", "continues"}


@dataclass
class DocBlock:
    path: Path
    line: int            # of the opening fence, 1-based
    language: str
    text: str
    kinds: frozenset = frozenset()
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse_blocks(markdown: str, path: Path) -> list[DocBlock]:
    """The fenced blocks of ``markdown``, each with the marker on the nearest non-blank line above it."""
    lines, blocks, i = markdown.split("\n"), [], 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        block = DocBlock(path, i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n")
        marker = MARKER.search(above)
        if marker:
            block.kinds = frozenset(k.strip() for k in marker.group("kinds").split(","))
            block.reason = (marker.group("reason") or "").strip()
        blocks.append(block)
        i = end + 1
    return blocks


def shell_commands(text: str) -> list[str]:
    """One command per line (backslash continuations joined); comment-only lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def program(block: DocBlock, blocks: list[DocBlock]) -> str:
    """A Python block's program: with `continues`, the file's earlier Python block (and its own) first."""
    if "continues" not in block.kinds:
        return block.text
    earlier = [b for b in blocks if b.path == block.path and b.language == "python" and b.line < block.line]
    assert earlier, f"{block.name}: `continues` but no Python block above it"
    return program(earlier[-1], blocks) + block.text


ALL_BLOCKS = [b for path in DOCS for b in parse_blocks(path.read_text(), path)]
RUNNABLE = [b for b in ALL_BLOCKS if b.language in RUN_LANGUAGES]


def params(blocks) -> list:
    params = []
    for b in blocks:
        marks = [pytest.mark.slow] if "slow" in b.kinds else []
        if "skip" in b.kinds:
            marks.append(pytest.mark.skip(reason=f"{b.name}: {b.reason}"))
        params.append(pytest.param(b, id=b.name, marks=marks))
    return params


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory that looks like the checkout, with `minicompile` and `python` on PATH."""
    root = tmp_path_factory.mktemp("docs")
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv"):
            (root / entry.name).symlink_to(entry)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shims = {"python": f'exec {sys.executable} "$@"', "python3": f'exec {sys.executable} "$@"',
             "minicompile": f'exec {sys.executable} -m minicompile.cli "$@"'}
    for name, body in shims.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = subprocess_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                         PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                         MINICOMPILE_CACHE_DIR=str(tmp_path_factory.mktemp("docs-cache")))
    return root, env


def run_in(scratch, argv, block: DocBlock, what: str):
    root, env = scratch
    timeout = 3600 if "slow" in block.kinds else 600
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{block.name}: `{what}` exited {proc.returncode}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.mark.parametrize("block", params(RUNNABLE))
def test_documented_block_runs(block, scratch):
    if block.language == "python":
        script = scratch[0] / f"doc_block_{block.line}.py"
        script.write_text(program(block, RUNNABLE))
        run_in(scratch, [sys.executable, script.name], block, "the Python block")
    else:
        for command in shell_commands(block.text):
            run_in(scratch, ["bash", "-e", "-o", "pipefail", "-c", command], block, command)


def test_markers_are_known_and_give_reasons():
    for b in ALL_BLOCKS:
        assert b.kinds <= KINDS, f"{b.name}: unknown doc-test marker {sorted(b.kinds - KINDS)}"
        if b.kinds & {"skip", "slow"}:
            assert b.reason, f"{b.name}: a skip or slow marker needs a (reason)"
        if b.kinds:
            assert b.language in RUN_LANGUAGES, f"{b.name}: a marker on a block that is never run"


def test_parser_reads_markers_commands_and_continuations(tmp_path):
    text = ("```bash\nminicompile cache info   # one\n\n# a comment\npython -m x \\\n    --flag\n```\n"
            "<!-- doc-test: slow, continues (takes minutes) -->\n\n```python\nprint(1)\n```\n"
            "```\noutput\n```\n")
    shell, py, output = parse_blocks(text, REPO / "README.md")
    assert shell_commands(shell.text) == ["minicompile cache info   # one", "python -m x --flag"]
    assert (py.kinds, py.reason, py.line) == ({"slow", "continues"}, "takes minutes", 10)
    assert not shell.kinds and output.language == ""
    assert len(RUNNABLE) >= 10 and any(b.path.name == "README.md" for b in RUNNABLE)


def test_test_suite_numbers_in_the_docs_come_from_the_record():
    """README.md and docs/testing.md quote the recorded run (docs/test-run.json), never typed counts."""
    record = json.loads(doc_numbers.RECORD.read_text())
    assert doc_numbers.update_docs(record, check=True) == [], \
        "run `python -m minicompile.tools.doc_numbers` to put docs/test-run.json's numbers into the docs"
    for path in doc_numbers.DOCS:
        assert doc_numbers.SPAN.search(path.read_text()), f"{path.name} lost its generated test-run numbers"
    sentence = doc_numbers.render({"counts": {"passed": 2250, "skipped": 123, "deselected": 40}, "duration_s": 905,
                                   "cpus": 2, "workers": 2, "load_average_at_end": 2.5, "date": "d", "torch": "t"})
    assert "2,250 passed, 123 skipped, 40 slow" in sentence and "15 min 5 s on 2 cores, 2 test workers" in sentence


def test_doc_numbers_run_command_starts_the_suite(tmp_path):
    """`doc_numbers --run` runs the README's test command with its record option (a full run is
    minutes: here collection only); it once never started ("unrecognized arguments")."""
    record = tmp_path / "run.json"
    record.write_text("{}")   # an earlier record, as docs/test-run.json always is
    proc = subprocess.run(doc_numbers.run_command(record) + ["--collect-only", "-n", "0"],
                          cwd=doc_numbers.REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "tests collected" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
