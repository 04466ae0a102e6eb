"""``minicompile inspect TARGET``: show every stage of compiling a model, or write it to files.

Stage by stage, for each captured graph: the FX graph, the ATen graph, the loop IR (each
buffer's body), the fusion groups (kernels with their FX nodes and the user's source lines,
unfused edges and extern calls with reasons), the generated kernels and the host wrapper; before them, the graph breaks
and guards of the capture. ``--out DIR`` writes all of it, plus a reproducer per graph.
``--frontend`` picks who captures: TorchDynamo (default) or minicompile's own tracer; both
hand back capture's CaptureReport, so the same printers show either.

``--train`` captures for training (inputs requiring grad, one backward; see tools/capture.py):
each graph then shows its partition report (what is saved for backward, what is recomputed)
and every stage of its forward graph, then of its backward graph.
"""
from __future__ import annotations

import os
import sys

import torch

from minicompile.aot.runtime import TrainingGraph
from minicompile.capture.explain import CaptureReport
from minicompile.pipeline import CompiledGraph
from minicompile.report.artifacts import STAGES, ReportStage, banner, library_choices, stage_file, summary
from minicompile.tools.capture import FRONTENDS, capture_dynamo
from minicompile.report.highlight import highlight
from minicompile.tools.repro import write_repro
from minicompile.tools.target import load_target

CAPTURE_STAGES = ["breaks", "guards"]
ALL_STAGES = CAPTURE_STAGES + list(STAGES)


def parse_stages(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return ALL_STAGES
    unknown = [s for s in names if s not in ALL_STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(ALL_STAGES)} or 'all'")
    return names


def run_inspect(target_spec: str, stages: list[str], out_dir: str | None, frontend: str, stream=None,
                train: bool = False) -> int:
    stream = stream or sys.stdout
    target = load_target(target_spec)
    if train:
        report = capture_dynamo(target.model, target.example_inputs, train=True)
    else:
        report = FRONTENDS[frontend](target.model, target.example_inputs)
    text_blocks = render_report(report, target.name, stages, stream)
    for block in text_blocks:
        stream.write(block)
    if out_dir:
        paths = write_artifacts(report, target.name, out_dir)
        stream.write(f"\nwrote {len(paths)} file(s) to {out_dir}\n")
    return 0


def headline(report: CaptureReport, name: str, command: str = "inspect") -> str:
    lines = [f"minicompile {command} {name}: {len(report.graphs)} graph(s), {len(report.breaks)} graph break(s), "
             f"{len(report.guards)} guard(s) (front end: {report.frontend})"]
    for i, rec in enumerate(report.graphs):
        detail = _summary(rec.compiled) if rec.compiled is not None else rec.note
        start = f" from offset {rec.offset}" if rec.offset else ""
        lines.append(f"  graph {i}: {rec.code_name}(){start}: {detail}")
        lines += [f"    library choice: {c}" for c in _library_choices(rec.compiled)]
    lines += [f"  fallback to {f.kind} for {f.code_name}(): {f.reason}" for f in report.fallbacks]
    what = "output and gradients" if any(isinstance(r.compiled, TrainingGraph) for r in report.graphs) else "output"
    lines.append(f"  compiled {what} vs eager: {_compare(report.output, report.eager_output)}")
    return "\n".join(lines) + "\n"


def render_report(report: CaptureReport, name: str, stages: list[str], stream) -> list[str]:
    blocks = [headline(report, name)]
    if "breaks" in stages:
        blocks.append("\n" + banner("graph breaks") + "\n" + breaks_text(report))
    if "guards" in stages:
        blocks.append("\n" + banner("guards") + "\n" + guards_text(report))
    for i, rec in enumerate(report.graphs):
        for half, stage, compiled in _graph_stages(rec, stages):
            _, language = stage_file(stage, compiled)
            text = stage.render(rec.graph, compiled)
            title = f"{half}: {stage.title}" if half else stage.title
            blocks.append(f"\n{banner(f'graph {i}: {title}')}\n{highlight(text, language, stream)}")
    return blocks


def _graph_stages(rec, stages: list[str]):
    """(half, stage, compiled graph) to print for one record: a training graph's captured FX
    graph and partition report, then each stage of its forward and of its backward half."""
    names = [s for s in STAGES if s in stages]
    if not isinstance(rec.compiled, TrainingGraph):
        return [("", STAGES[n], rec.compiled) for n in names if rec.compiled is not None or n == "graph"]
    out = [("", STAGES["graph"], None)] if "graph" in names else []
    out.append(("", PARTITION_STAGE, rec.compiled))
    for half, compiled in _halves(rec.compiled):
        out += [(half, STAGES[n], compiled) for n in names if n != "graph"]
    return out


def _halves(graph: TrainingGraph) -> list:
    """The forward and backward CompiledGraphs (a backward that failed to compile runs eagerly: left out)."""
    return [(half, c) for half, c in (("forward", graph.forward), ("backward", graph.backward))
            if isinstance(c, CompiledGraph)]


PARTITION_STAGE = ReportStage("partition", "partition report (saved for backward, recomputed)",
                              lambda fx, graph: str(graph.report).rstrip() + "\n", "partition.txt", None)


def _summary(compiled) -> str:
    if not isinstance(compiled, TrainingGraph):
        return summary(compiled)
    halves = dict(_halves(compiled))
    return "training graph; " + "; ".join(f"{half}: {summary(halves[half]) if half in halves else 'runs eagerly'}"
                                          for half in ("forward", "backward"))


def _library_choices(compiled) -> list[str]:
    if isinstance(compiled, TrainingGraph):
        return [f"{half}: {c}" for half, g in _halves(compiled) for c in library_choices(g.aten.gm)]
    return library_choices(compiled.aten.gm) if isinstance(compiled, CompiledGraph) else []


def breaks_text(report: CaptureReport) -> str:
    """Graph breaks (file:line in function, then why), and our front end's fallbacks."""
    fallbacks = "".join(f"fallback to {f.kind}: {f.where or '?'} in {f.code_name}()\n    {f.reason}\n"
                        for f in report.fallbacks)
    if not report.breaks:
        none = "none: the model was captured as one graph\n" if len(report.graphs) <= 1 else "none reported\n"
        return fallbacks or none
    return "".join(f"break {i}: {b.where} in {b.code_name}()\n    {b.reason}\n"
                   for i, b in enumerate(report.breaks)) + fallbacks


# Guards on what the user controls; the rest (module types, hook dicts, identities of
# globals) are summarised on screen and written in full to guards.txt.
KEY_GUARDS = ("TENSOR_MATCH", "CONSTANT_MATCH", "EQUALS_MATCH", "SEQUENCE_LENGTH", "GRAD_MODE", "SHAPE_ENV",
              "DEFAULT_DEVICE")


def guards_text(report: CaptureReport, full: bool = False) -> str:
    """The guards of each cache entry (our front end makes one per graph and resume point)."""
    if not report.guards:
        return "none\n"
    text = ""
    for e in report.entries:
        if len(report.entries) > 1:
            text += f"{e.code_name}() from offset {e.offset}:\n"
        text += "".join(f"{g}\n" for g in e.guards if full or g.kind in KEY_GUARDS)
    hidden = sum(1 for g in report.guards if not (full or g.kind in KEY_GUARDS))
    if hidden:
        text += f"... and {hidden} structural guard(s) (types, identities, hooks); --out DIR writes all to guards.txt\n"
    return text


def write_artifacts(report: CaptureReport, name: str, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)

    write(os.path.join(out_dir, "summary.txt"), headline(report, name))
    write(os.path.join(out_dir, "breaks.txt"), breaks_text(report))
    write(os.path.join(out_dir, "guards.txt"), guards_text(report, full=True))
    for i, rec in enumerate(report.graphs):
        gdir = os.path.join(out_dir, f"graph{i}")
        os.makedirs(gdir, exist_ok=True)
        for half, stage, compiled in _graph_stages(rec, list(STAGES)):
            filename, _ = stage_file(stage, compiled)
            os.makedirs(os.path.join(gdir, half), exist_ok=True)   # a training graph's forward/, backward/
            write(os.path.join(gdir, half, filename), stage.render(rec.graph, compiled))
        # A training graph's forward takes the captured graph's inputs: its reproducer can use them.
        forward = rec.compiled.forward if isinstance(rec.compiled, TrainingGraph) else rec.compiled
        if isinstance(forward, CompiledGraph):
            paths.append(write_repro(forward, rec.example_inputs, gdir, f"graph {i} of {name}"))
    return paths


def _compare(out, ref) -> str:
    flat_out, _ = torch.utils._pytree.tree_flatten(out)
    flat_ref, _ = torch.utils._pytree.tree_flatten(ref)
    if len(flat_out) != len(flat_ref):
        return f"MISMATCH ({len(flat_out)} outputs, eager has {len(flat_ref)})"
    worst = 0.0
    for o, r in zip(flat_out, flat_ref):
        if isinstance(r, torch.Tensor) and r.is_floating_point() and r.numel():
            if o.shape != r.shape:
                return f"MISMATCH (shape {tuple(o.shape)} vs eager {tuple(r.shape)})"
            worst = max(worst, (o.double() - r.double()).abs().nan_to_num(0).max().item())
        elif isinstance(r, torch.Tensor):
            if not torch.equal(o, r):
                return "MISMATCH (non-float output differs)"
    return f"max abs diff {worst:.3g}"
