"""CaptureReport: what a capture front end did — graphs, graph breaks, fallbacks, recompiles, guards.

Every compiled callable carries one (``fn.capture_report``), accumulated over its calls;
``explain(fn)(*args)`` returns a fresh one for a single call. It prints readably. The
``minicompile inspect`` command fills the same report from either front end (ours or
TorchDynamo) and adds, per graph, what the backend compiled and the inputs it saw.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass, field

import torch.fx


@dataclass
class GraphRecord:
    code_name: str        # the function the graph was captured from
    offset: int           # bytecode offset the graph starts at (0: the call; more: after a break)
    graph: torch.fx.GraphModule
    ops: int
    # Filled by ``minicompile inspect``, which keeps them for printing and reproducers; the
    # report of a compiled callable leaves them empty so it holds no user tensors alive.
    example_inputs: list = field(default_factory=list)
    compiled: object = None   # what the backend made of the graph (a CompiledGraph under minicompile)
    note: str = ""            # why there is no compiled graph (e.g. it runs eagerly)


@dataclass
class BreakRecord:
    code_name: str
    reason: str
    where: str            # the user's file:line ("" when the front end does not know it)


class GraphBreakError(RuntimeError):
    """Raised by a function compiled with ``fullgraph=True`` at its first graph break or fallback,
    before anything of that call ran: the reason and the user's file:line and source text."""

    def __init__(self, code_name: str, reason: str, where: str | None):
        self.code_name, self.reason, self.where = code_name, reason, where
        line = _source_text(where)
        super().__init__(
            f"minicompile: {code_name}() cannot be captured as one graph (fullgraph=True): {reason}"
            + (f"\n  at {where}" if where else "") + (f": {line}" if line else "")
            + "\nRewrite that code so it can be traced (docs/capture.md lists what breaks), or compile "
              "with fullgraph=False to run it in Python between graphs; minicompile.explain(fn)(*args) "
              "lists every break.")


def _source_text(where: str | None) -> str:
    if not where or ":" not in where:
        return ""
    path, _, line = where.rpartition(":")
    return linecache.getline(path, int(line)).strip() if line.isdigit() else ""


@dataclass
class GuardRecord:
    """One guarded value: ``kind`` uses TorchDynamo's names (TENSOR_MATCH, CONSTANT_MATCH, ...)
    so both front ends print, and filter, their guards alike."""
    kind: str
    what: str             # the guarded value, e.g. L[0] (ours) or L['x'] (Dynamo)
    check: str            # what is checked, readably

    def __str__(self):
        return f"{self.kind:<28} {self.what:<40} {self.check}".rstrip()


@dataclass
class FallbackRecord:
    code_name: str
    kind: str             # "fx" (torch.fx.symbolic_trace), "eager", or "python" (the rest of a call after a break)
    reason: str
    where: str | None


@dataclass
class RecompileRecord:
    code_name: str
    offset: int
    guard: str            # the guard that failed
    limit_hit: bool = False


@dataclass
class EntryRecord:
    code_name: str
    offset: int
    guards: list          # GuardRecord
    check_source: str     # the generated check function ("" for TorchDynamo)


@dataclass
class CaptureReport:
    frontend: str = "minicompile"
    graphs: list = field(default_factory=list)
    breaks: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    recompiles: list = field(default_factory=list)
    dynamic: list = field(default_factory=list)    # capture.dynamic.DynamicRecord: sizes made symbolic, or not
    entries: list = field(default_factory=list)
    output: object = None         # explain(): the value the call returned
    eager_output: object = None   # inspect: what the model returned when run eagerly

    # ------------------------------------------------------------------ counts
    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def ops_per_graph(self) -> list[int]:
        return [g.ops for g in self.graphs]

    @property
    def compile_count(self) -> int:
        """Cache entries created (first compiles and recompiles, all offsets)."""
        return len(self.entries)

    @property
    def guards(self) -> list[GuardRecord]:
        """The guards of every entry, in order."""
        return [g for e in self.entries for g in e.guards]

    # ------------------------------------------------------------------ recording
    def record_entry(self, cache, entry, check_source: str) -> None:
        name = cache.code.co_name
        self.entries.append(EntryRecord(name, entry.offset, list(entry.guards.records), check_source))
        if entry.graph is not None:
            self.graphs.append(GraphRecord(name, entry.offset, entry.graph, entry.ops))
        if entry.break_action is not None:
            a = entry.break_action
            self.breaks.append(BreakRecord(name, a.reason, a.where))

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        out = [f"Graphs: {self.graph_count}   Graph breaks: {self.break_count}   "
               f"Fallbacks: {len(self.fallbacks)}   Recompiles: {len(self.recompiles)}"]
        for i, b in enumerate(self.breaks):
            out.append(f"  break {i}: {b.where} in {b.code_name}(): {b.reason}")
        for f in self.fallbacks:
            out.append(f"  fallback to {f.kind} for {f.code_name}(): {f.reason}"
                       + (f" at {f.where}" if f.where else ""))
        for r in self.recompiles:
            out.append(f"  recompile of {r.code_name}()@{r.offset}: guard failed: {r.guard}"
                       + ("  [recompile limit hit: running eagerly]" if r.limit_hit else ""))
        out.extend(f"  sizes of {d}" for d in self.dynamic)
        for i, g in enumerate(self.graphs):
            out.append(f"--- graph {i}: {g.code_name}() from offset {g.offset}, {g.ops} ops")
            out.append(g.graph.code.strip())
        for i, e in enumerate(self.entries):
            out.append(f"--- guards of entry {i}: {e.code_name}() at offset {e.offset}")
            out.extend(f"    {g}" for g in e.guards)
        return "\n".join(out)

    __repr__ = __str__
