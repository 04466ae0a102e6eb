"""One printer per stage of a compilation; the CLI and MINICOMPILE_DEBUG both use these.

A stage renders one captured graph (its FX graph and CompiledGraph) to text. STAGES names
them in pipeline order; each knows the file name ``inspect --out`` writes it to and the
language used to highlight it. DEBUG_LADDER says which stages each MINICOMPILE_DEBUG level
prints. The printers need only a CompiledGraph's fields, so the pipeline can call them.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from minicompile.aot.runner import constructed_by

aten = torch.ops.aten


@dataclass
class ReportStage:
    name: str
    title: str
    render: Callable      # (fx_graph | None, compiled | None) -> str
    filename: str         # under --out DIR/graph<i>/
    language: str | None  # for highlight.py


def summary(compiled) -> str:
    times = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in compiled.timings.items())
    total = sum(compiled.timings.values()) * 1000
    return (f"{compiled.num_kernels} kernel(s), {len(compiled.externs)} extern call(s), backend {compiled.backend}; "
            f"compiled in {total:.0f} ms ({times})")


def fx_graph_text(fx_graph) -> str:
    return fx_graph.print_readable(print_output=False).rstrip() + "\n"


def aten_graph_text(compiled) -> str:
    """The ATen graph, headed by the passes that constructed it and their times."""
    text = compiled.aten.gm.print_readable(print_output=False)
    # make_fx names the class after the traced callable, often "<lambda>".
    text = re.sub(r"^class <lambda>\(", "class AtenGraph(", text).rstrip() + "\n"
    return constructed_by(compiled.aten) + text


def joint_graph_text(joint) -> str:
    """The joint forward/backward graph (aot/joint.py), headed by its passes and its signature."""
    text = joint.graph.print_readable(print_output=False)
    text = re.sub(r"^class [^(]+\(", "class JointGraph(", text).rstrip() + "\n"
    grads = len(joint.grad_inputs)
    signature = (f"# (*primals, *tangents) -> (*outputs, *grads): {joint.num_primals} primal(s), "
                 f"{len(joint.diff_outputs)} tangent(s), {joint.num_outputs} output(s), {grads} gradient(s)\n")
    return constructed_by(joint) + signature + text


def training_text(joint, part, level: int) -> str:
    """MINICOMPILE_DEBUG for a training graph, before its halves compile: the joint graph (level 3)
    and the partition (level 2: what the forward saves for the backward, what backward recomputes)."""
    out = ""
    if level >= 3:
        out += banner("[minicompile] joint graph (forward and backward, ATen)") + "\n" + joint_graph_text(joint)
        out += banner(f"[minicompile] partition ({part.report.mode})") + "\n"
    return out + f"[minicompile] {part.report}\n"


def loop_ir_text(compiled) -> str:
    """Every buffer's loop body, in program order (ir/graph.py)."""
    return str(compiled.loop_graph)


def fusion_text(compiled) -> str:
    """Kernels with their FX nodes, unfused edges with reasons, extern reasons, source lines."""
    lines = [compiled.explain()]
    sources = compiled.loop_graph.sources
    per_kernel = []
    for step in compiled.schedule.steps:
        nodes = step.nodes if hasattr(step, "nodes") else [step.buffer]
        origins = [o for n in nodes for o in getattr(n, "origins", ())]
        where = list(dict.fromkeys(sources[o] for o in origins if o in sources))
        if where:
            per_kernel.append(f"{step.name}:")
            per_kernel += [f"    {w}" for w in where]
    if per_kernel:
        lines.append("user source lines:")
        lines += ["    " + ln for ln in per_kernel]
    elif compiled.externs or compiled.schedule.steps:
        lines.append("user source lines: none recorded (the tracer kept no stack traces for this graph)")
    lines += [f"library choice: {c}" for c in library_choices(compiled.aten.gm)]
    return "\n".join(lines).rstrip() + "\n"


_PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_EAGER_HINT = "MINICOMPILE_CPU_LIBRARIES=eager gives eager's"


def library_choices(aten_graph) -> list[str]:
    """The library calls of an ATen graph whose rounding differs from eager's, against the ones
    eager makes (cpu/claims.py measures the choice): matrix products in oneDNN's matmul
    rather than aten.mm (MKL's sgemm on CPU), attention as our math form rather than eager's
    fused flash kernel. Empty when the graph has neither products nor attention."""
    onednn = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    counts = Counter()
    for n in aten_graph.graph.nodes:
        # by name: the graph's meta may hold another object for the same overload (a deep copy)
        decomposed = n.target is not _FLASH and str(n.meta.get("original_aten")) == str(_FLASH)
        if onednn is not None and n.target is onednn.default:
            counts["onednn"] += 1
        elif n.target in _PRODUCTS:
            counts["math" if decomposed else "mm"] += 1   # the math form: two products per call
        elif n.target is _FLASH:
            counts["flash"] += 1
    counts["math"] //= 2
    out = []
    if counts["mm"] or counts["onednn"]:
        out.append(f"matrix products: {counts['mm']} as eager's (aten.mm/addmm/bmm: MKL's sgemm on CPU), "
                   f"{counts['onednn']} in oneDNN's matmul (measured faster here, or MINICOMPILE_CPU_GEMM=onednn; "
                   f"{_EAGER_HINT})")
    if counts["flash"] or counts["math"]:
        out.append(f"attention: {counts['flash']} in eager's fused flash kernel, {counts['math']} decomposed to "
                   f"our math form (measured faster here, or MINICOMPILE_CPU_ATTENTION=math; {_EAGER_HINT})")
    return out


def kernel_text(compiled) -> str:
    return (compiled.kernel_source or "// no generated kernels: every op is an extern call\n").rstrip() + "\n"


def wrapper_text(compiled) -> str:
    return compiled.wrapper_source.rstrip() + "\n"


_KERNEL_SUFFIX = {"cpp": ("kernels.cpp", "cpp"), "triton": ("kernels.py", "python")}


def stage_file(stage: ReportStage, compiled) -> tuple[str, str | None]:
    """(file name, highlight language) of a stage; kernel source depends on the backend."""
    if stage.name == "kernels" and compiled is not None:
        return _KERNEL_SUFFIX.get(compiled.backend, ("kernels.txt", None))
    return stage.filename, stage.language


def stage_title(stage: ReportStage, compiled) -> str:
    """The stage's title; a graph that was not captured (a half of the joint graph, compiled by
    ``compile_aten``) is titled by what it is."""
    if stage.name == "graph" and getattr(compiled, "title", None):
        return compiled.title
    return stage.title


STAGES = {s.name: s for s in [
    ReportStage("graph", "captured FX graph", lambda fx, c: fx_graph_text(fx), "fx_graph.py", "python"),
    ReportStage("aten", "ATen graph (decomposed, functional)", lambda fx, c: aten_graph_text(c), "aten_graph.py", "python"),
    ReportStage("ir", "loop IR (one body per buffer)", lambda fx, c: loop_ir_text(c), "loop_ir.txt", "python"),
    ReportStage("fusion", "fusion groups", lambda fx, c: fusion_text(c), "fusion.txt", None),
    ReportStage("kernels", "generated kernels", lambda fx, c: kernel_text(c), "kernels.cpp", "cpp"),
    ReportStage("wrapper", "host wrapper", lambda fx, c: wrapper_text(c), "wrapper.py", "python"),
]}

# MINICOMPILE_DEBUG level -> the stages it adds (level 1 prints the one-line summary only).
DEBUG_LADDER = {
    1: [],
    2: ["fusion"],
    3: ["graph", "aten", "ir"],
    4: ["kernels"],
    5: ["wrapper"],
}


def debug_stages(level: int) -> list[str]:
    names = [s for lvl, stages in sorted(DEBUG_LADDER.items()) if lvl <= level for s in stages]
    return [s for s in STAGES if s in names]   # pipeline order


def banner(title: str) -> str:
    return f"=== {title} " + "=" * max(3, 76 - len(title))
