"""The numbers the docs quote about the test suite, generated from a recorded run, not typed.

    python -m minicompile.tools.doc_numbers --run       # run the README's test command, record it, update the docs
    python -m minicompile.tools.doc_numbers --collect   # cheaper: record only what the command would run
    python -m minicompile.tools.doc_numbers             # update the docs from the record
    python -m minicompile.tools.doc_numbers --check     # exit 1 where the docs differ from the record

The record is docs/test-run.json, written by tests/conftest.py's `--record-run FILE` option (a
full run: outcome counts, duration, machine load) or by `--collect` (`pytest --collect-only`:
tests selected and the slow ones deselected). Each doc holds the generated sentence between
`<!-- numbers: test-run -->` and `<!-- /numbers -->`; tests/test_docs.py checks it is current.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docs" / "test-run.json"
DOCS = [REPO / "README.md", REPO / "docs" / "testing.md"]
SPAN = re.compile(r"(<!-- numbers: test-run -->)(.*?)(<!-- /numbers -->)", re.S)


def _workers(record: dict) -> str:
    """How many pytest-xdist worker processes ran the tests (older records do not say)."""
    n = record.get("workers")
    return "" if n is None else f", {n} test workers" if n > 1 else ", one test process"


def render(record: dict) -> str:
    """The sentence the docs quote, from a record."""
    c = record["counts"]
    if "duration_s" in record:
        minutes, seconds = divmod(round(record["duration_s"]), 60)
        return (f"{c['passed']:,} passed, {c['skipped']} skipped, {c['deselected']} slow ones deselected, "
                f"in {minutes} min {seconds} s on {record['cpus']} cores{_workers(record)} (load average "
                f"{record['load_average_at_end']} at the end; {record['date']}, torch {record['torch']})")
    return (f"{c['selected']:,} tests selected, {c['deselected']} slow ones deselected "
            f"(`pytest --collect-only`, {record['date']}; not timed)")


def collect() -> dict:
    """What the test command would run, without running it."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=REPO, capture_output=True, text=True).stdout
    m = re.search(r"(\d+)/(\d+) tests? collected \((\d+) deselected\)", out) or \
        re.search(r"(\d+) tests? collected()()", out)
    if not m:
        sys.exit(f"doc_numbers: cannot read pytest's collection summary:\n{out[-1000:]}")
    selected = int(m.group(1))
    return {"command": "python -m pytest --collect-only -q", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "counts": {"selected": selected, "deselected": int(m.group(3) or 0)}}


def update_docs(record: dict, check: bool) -> list[str]:
    """Put the sentence into every doc's span; the docs that differed."""
    stale = []
    for path in DOCS:
        text = path.read_text()
        new = SPAN.sub(lambda m: m.group(1) + render(record) + m.group(3), text)
        if new != text:
            stale.append(str(path.relative_to(REPO)))
            if not check:
                path.write_text(new)
    return stale


def run_command(record: Path) -> list:
    """The README's test command, recording the run into ``record``; the option is one token:
    before tests/conftest.py defines it, pytest takes a lone path for a test path."""
    return [sys.executable, "-m", "pytest", "-q", f"--record-run={record}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minicompile.tools.doc_numbers", description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--run", action="store_true", help="run `python -m pytest -q` and record it (minutes)")
    mode.add_argument("--collect", action="store_true", help="record the collection only")
    mode.add_argument("--check", action="store_true", help="exit 1 where the docs differ from the record")
    args = ap.parse_args(argv)
    if args.run:
        subprocess.run(run_command(RECORD), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    elif args.collect:
        RECORD.write_text(json.dumps(collect(), indent=1) + "\n")
    stale = update_docs(json.loads(RECORD.read_text()), check=args.check)
    print(("stale: " if args.check else "updated: ") + (", ".join(stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
