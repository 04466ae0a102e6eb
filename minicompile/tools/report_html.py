"""``minicompile report TARGET``: one self-contained HTML page for a compile.

The page holds what ``minicompile inspect`` prints, from the same printers (tools/inspect.py,
report/artifacts.py): the headline, graph breaks and guards, then per graph its captured FX
graph, ATen graph, loop IR, fusion groups, kernels (highlighted) and wrapper; for ``--train``
each graph's partition report and both halves. Charts (inline SVG bars) show the time each
compile pass took; ``--profile`` runs every graph again under torch.profiler and charts each
kernel's time per call (median), the bytes its arguments hold, and the fraction of the machine's copy
bandwidth that moving those bytes in that time achieves (a per-kernel roofline).

No network: the CSS, the script and the charts are inline. Every piece of text (model
source lines, names, generated code) is HTML-escaped. The page's script checks that every
section it was built with is present and that no script error fired, and writes the result
into ``#report-check`` (the Chromium test reads it).
"""
from __future__ import annotations

import html
import json
import os
import statistics
import sys
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from minicompile.aot.runtime import TrainingGraph
from minicompile.pipeline import CompiledGraph
from minicompile.report.artifacts import STAGES, stage_file
from minicompile.report.highlight import highlight_html
from minicompile.tools.bench_worker import copy_bandwidth
from minicompile.tools.capture import capture_dynamo
from minicompile.tools.inspect import _graph_stages, _halves, breaks_text, guards_text, headline
from minicompile.tools.target import load_target

COPY_BYTES = 1 << 28     # far larger than any cache: the copy runs at memory bandwidth
PROFILE_CALLS = 5


@dataclass
class Section:
    id: str
    title: str
    body: str             # HTML
    children: list = field(default_factory=list)


def run_report(target_spec: str, out: str, train: bool = False, profile_kernels: bool = False, stream=None) -> int:
    stream = stream or sys.stdout
    target = load_target(target_spec)
    report = capture_dynamo(target.model, target.example_inputs, train=train)
    page = render_page(report, target.name, profile_kernels)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    stream.write(headline(report, target.name, "report"))
    stream.write(f"wrote {out} ({len(page.encode()) / 1e3:.0f} KB)\n")
    return 0


def render_page(report, name: str, profile_kernels: bool = False) -> str:
    sections = [Section("summary", "summary", _pre(headline(report, name, "report"))),
                Section("timings", "compile time per pass", _timing_charts(report))]
    if profile_kernels:
        sections.append(Section("profile", "kernel profile (per-kernel roofline)", _profile_section(report)))
    sections += [Section("breaks", "graph breaks", _pre(breaks_text(report))),
                Section("guards", "guards", _pre(guards_text(report, full=True)))]
    for i, rec in enumerate(report.graphs):
        graph = Section(f"graph{i}", f"graph {i}: {rec.code_name}()", _pre(rec.note) if rec.compiled is None else "")
        for half, stage, compiled in _graph_stages(rec, list(STAGES)):
            _, language = stage_file(stage, compiled)
            text = stage.render(rec.graph, compiled)
            sid = f"graph{i}-" + (f"{half}-" if half else "") + stage.name
            graph.children.append(Section(sid, f"{half}: {stage.title}" if half else stage.title,
                                          _pre(highlight_html(text, language), escaped=True)))
        sections.append(graph)
    return _page(f"minicompile report: {name}", sections)


# ---------------------------------------------------------------- compile-pass timings

def _compiled_halves(rec) -> list:
    """(label, CompiledGraph) of one record: the graph, or a training graph's two halves."""
    if isinstance(rec.compiled, TrainingGraph):
        return list(_halves(rec.compiled))
    return [("", rec.compiled)] if isinstance(rec.compiled, CompiledGraph) else []


def _timing_charts(report) -> str:
    charts = []
    for i, rec in enumerate(report.graphs):
        for half, compiled in _compiled_halves(rec):
            rows = [(stage, seconds * 1e3, f"{seconds * 1e3:.1f} ms") for stage, seconds in compiled.timings.items()]
            total = sum(compiled.timings.values()) * 1e3
            charts.append(bar_chart(f"graph {i}{' ' + half if half else ''}: {total:.0f} ms", rows))
    return "".join(charts) or "<p>no compiled graphs</p>"


# ---------------------------------------------------------------- the per-kernel roofline

@dataclass
class KernelProfile:
    graph: str            # "graph 0", "graph 0 backward"
    kernel: str
    us_per_call: float
    bytes: int

    def fraction(self, copy_bytes_per_s: float) -> float:
        return self.bytes / (self.us_per_call * 1e-6) / copy_bytes_per_s if self.us_per_call > 0 else 0.0


def argument_bytes(compiled: CompiledGraph, kernel: str) -> int:
    """Bytes the kernel's (or group's) tensor arguments hold, each counted once: what an ideal
    kernel reads and writes once each (sizes passed as arguments are skipped)."""
    buffers = compiled.loop_graph.by_name
    total = 0
    for name in compiled.kernel_args.get(kernel, ()):
        layout = getattr(buffers.get(name), "layout", None)
        if layout is not None:
            total += int(layout.storage_numel()) * layout.dtype.itemsize
    return total


def profile_kernels(report, calls: int = PROFILE_CALLS) -> list[KernelProfile]:
    """Each graph run ``calls`` times under torch.profiler (a training graph: forward and
    backward); the wrapper names each kernel's event after it, inside an event per graph."""
    out = []
    for i, rec in enumerate(report.graphs):
        halves = _compiled_halves(rec)
        if not halves or not rec.example_inputs:
            continue
        step = _training_step(rec) if isinstance(rec.compiled, TrainingGraph) else _inference_step(rec)
        step()   # warm: the backward compiles on its first call
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                step()
        # One graph event per half, named when its wrapper loaded; the forward's runs first.
        graph_events = sorted({e.name: e.time_range.start for e in prof.events()
                               if e.name.startswith("minicompile_graph_")}.items(), key=lambda kv: kv[1])
        for (event, _), (half, compiled) in zip(graph_events, halves):
            times: dict = {}   # kernel -> the CPU time of each of its calls, in microseconds
            for e in prof.events():
                if e.name in compiled.kernel_args and _inside(e, event):
                    times.setdefault(e.name, []).append(e.cpu_time_total)
            label = f"graph {i}{' ' + half if half else ''}"
            out += [KernelProfile(label, k, statistics.median(us), argument_bytes(compiled, k))
                    for k, us in times.items()]
    return out


def _inside(event, graph_event: str) -> bool:
    parent = event.cpu_parent
    while parent is not None and parent.name != graph_event:
        parent = parent.cpu_parent
    return parent is not None


def _inference_step(rec):
    def step():
        with torch.no_grad():
            rec.compiled(*rec.example_inputs)
    return step


def _training_step(rec):
    def step():
        with torch.enable_grad():
            outs = [o for o in torch.utils._pytree.tree_leaves(rec.compiled(*rec.example_inputs))
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [x for x in rec.example_inputs if isinstance(x, torch.Tensor) and x.requires_grad]
            if outs and wrt:
                torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
    return step


def _profile_section(report) -> str:
    kernels = profile_kernels(report)
    if not kernels:
        return "<p>no generated kernels ran (every op is an extern call)</p>"
    copy_rate = copy_bandwidth(COPY_BYTES, 5, "cpu")
    names = [f"{k.graph} {k.kernel}" for k in kernels]
    fractions = [k.fraction(copy_rate) for k in kernels]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    intro = (f"<p>{len(kernels)} kernel(s), each the median of {PROFILE_CALLS} calls (CPU time of its profiler "
             f"event). Copy bandwidth of this machine: {copy_rate / 1e9:.1f} GB/s (a {COPY_BYTES >> 20} MiB "
             f"<code>copy_</code>), load average {load:.1f} on {os.cpu_count()} CPUs (a load above the CPU "
             f"count slows every number here). Bytes are what the kernel's arguments hold, each once; above "
             f"100%, the data was in cache.</p>")
    return intro + "".join([
        bar_chart("time per call", [(n, k.us_per_call, f"{k.us_per_call:.1f} us") for n, k in zip(names, kernels)]),
        bar_chart("bytes moved", [(n, k.bytes, f"{k.bytes / 1e3:.1f} KB") for n, k in zip(names, kernels)]),
        bar_chart("fraction of copy bandwidth", [(n, f * 100, f"{f * 100:.0f}%") for n, f in zip(names, fractions)],
                  mark=(100.0, "100% of copy")),
    ])


# ---------------------------------------------------------------- HTML

def bar_chart(title: str, rows: list, mark: tuple | None = None) -> str:
    """A horizontal bar chart as inline SVG: rows of (label, value, value text); ``mark``, a
    (value, text), draws a labelled dashed line at that value (100% of copy bandwidth)."""
    label_w, bar_w, row_h = 260, 520, 18
    top = max([v for _, v, _ in rows] + [mark[0] if mark else 0.0, 1e-12])
    height = row_h * len(rows) + 28
    parts = [f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
             f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" height="{height}" role="img">']
    for k, (label, value, text) in enumerate(rows):
        y, w = 4 + k * row_h, max(1.0, bar_w * value / top)
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{html.escape(str(label))}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row_h - 4}" class="bar"/>'
                     f'<text x="{label_w + w + 4:.1f}" y="{y + 13}">{html.escape(text)}</text>')
    if mark is not None:
        x = label_w + bar_w * mark[0] / top
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height - 20}" class="mark"/>'
                     f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle">{html.escape(mark[1])}</text>')
    parts.append("</svg></figure>")
    return "".join(parts)


def _pre(text: str, escaped: bool = False) -> str:
    return f"<pre>{text if escaped else html.escape(text)}</pre>"


def _all_ids(sections: list) -> list:
    return [i for s in sections for i in [s.id] + _all_ids(s.children)]


def _render(s: Section, level: int = 2) -> str:
    head = f'<h{level}>{html.escape(s.title)}</h{level}>'
    if level > 2:   # a stage: collapsible, open
        return f'<details open id="{s.id}" class="stage"><summary>{head}</summary>{s.body}</details>'
    inner = "".join(_render(c, level + 1) for c in s.children)
    return f'<section id="{s.id}">{head}{s.body}{inner}</section>'


def _page(title: str, sections: list) -> str:
    ids = _all_ids(sections)
    toc = "".join(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<script>{ERROR_HOOK}</script><style>{CSS}</style></head>"
            f'<body data-sections="{html.escape(json.dumps(ids))}"><header><h1>{html.escape(title)}</h1>'
            f'<p id="report-check">report-check: pending</p><nav><ul>{toc}</ul></nav></header>'
            f'<main>{"".join(_render(s) for s in sections)}</main><script>{CHECK}</script></body></html>\n')


ERROR_HOOK = ("window.reportErrors = [];"
              "window.addEventListener('error', function (e) { window.reportErrors.push(String(e.message)); });")

# Runs last: every section the page was built with must be in the DOM, and no error fired.
CHECK = """
(function () {
  var want = JSON.parse(document.body.dataset.sections);
  var missing = want.filter(function (id) { return !document.getElementById(id); });
  var el = document.getElementById('report-check');
  var ok = missing.length === 0 && window.reportErrors.length === 0;
  el.textContent = ok ? 'report-check: OK, ' + want.length + ' sections'
                      : 'report-check: FAIL missing=' + missing.join(',') + ' errors=' + window.reportErrors.join(';');
  el.className = ok ? 'ok' : 'fail';
  document.querySelectorAll('details.stage summary').forEach(function (s) {
    s.title = 'click to fold';
  });
})();
"""

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:10px 20px}header h1{margin:0;font-size:20px}
nav ul{margin:6px 0 0;padding:0;list-style:none;display:flex;flex-wrap:wrap;gap:4px 14px}
nav a{color:#9cd0ff}main{padding:0 20px 40px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;margin:14px 0;padding:4px 14px}
h2{font-size:17px;margin:10px 0}h3{font-size:14px;display:inline;margin:0}
details.stage{margin:6px 0;border-top:1px solid #eee;padding-top:4px}
summary{cursor:pointer}
pre{background:#f5f6f8;padding:8px;overflow:auto;max-height:420px;font:12px/1.35 ui-monospace,monospace}
.keyword{color:#a626a4;font-weight:600}.string{color:#50a14f}.comment{color:#8a8f98;font-style:italic}
.number{color:#c18401}
#report-check{margin:4px 0;font-size:12px}#report-check.ok{color:#9fe3a0}#report-check.fail{color:#ff9f9f}
figure.chart{margin:8px 0}figcaption{font-weight:600;margin-bottom:2px}
svg text{font:11px ui-monospace,monospace;fill:#333}.bar{fill:#4a90d9}.mark{stroke:#d9534f;stroke-dasharray:4 3}
"""
