"""MINICOMPILE_CHECK=1: every compiled graph also runs eagerly, and a difference is traced to a kernel.

    compiled.check = DifferentialCheck(gm, compiled)    pipeline.py, when config.check is on
    compiled(*args)                                      goes through DifferentialCheck.__call__

Each call first runs the captured graph eagerly (on copies of the inputs the graph writes,
from the random generator's state the compiled call then starts from), then the compiled graph
on the caller's own tensors, so they end exactly as they would without the check. The first
call whose outputs differ beyond testing/compare.py's tolerances, and from a float64 run of the
graph by more than rounding (ROUNDING: twice eager's own distance), is localised:

1. The decomposed ATen graph is interpreted node by node: eager's value of every FX node.
   Where its outputs already differ from the captured graph's, a decomposition is to blame.
2. The host wrapper is generated again without buffer reuse (codegen/wrapper.py) and run one
   step at a time. Each kernel call (or extern call) is fed eager's values of the buffers it
   reads, and the buffers it writes are compared with eager's values of the FX nodes they hold
   (a buffer's last origin), by the same rule. The first step that differs is named, with its
   FX nodes and the user's source lines. Where none differs alone, the compiled chain is run unfed and the
   first buffer beyond tolerance is named: rounding that accumulates.
3. A reproducer is written (tools/repro.py, with the input values that showed the difference).

The report is one warning on the "minicompile" logger; it also lists the library choices that
change numerics (report/artifacts.library_choices) and how to pin eager's.
"""
from __future__ import annotations

import logging
import os

import torch
from torch.utils import _pytree as pytree

from minicompile.codegen.common import origins_by_source_line
from minicompile.codegen.wrapper import WrapperCode
from minicompile.config import config
from minicompile.ir.nodes import ComputedBuffer, ExternKernel, InputBuffer, MultiOutput
from minicompile.report.artifacts import library_choices
from minicompile.runtime import cache
from minicompile.scheduler.fusion import TemplateKernel
from minicompile.scheduler.kernel import FusedKernel
from minicompile.testing.compare import copy_preserving_strides, mismatch
from minicompile.tools.repro import write_repro

log = logging.getLogger("minicompile")
aten = torch.ops.aten


class DifferentialCheck:
    """Runs eager beside a CompiledGraph on every call; ``reports`` keeps what it warned."""

    def __init__(self, gm: torch.fx.GraphModule, compiled):
        self.gm = gm
        self.compiled = compiled
        self.reports: list = []

    def __call__(self, run_compiled, args: tuple):
        written = [k for k in self.compiled.mutated_inputs if k < len(args)]
        before = {k: copy_preserving_strides(args[k]) for k in written}
        rng = _rng_state()
        try:
            with torch.no_grad():
                expected = self.gm(*_with(args, {k: copy_preserving_strides(v) for k, v in before.items()}))
        except Exception as e:  # the check must never cost the user their program
            log.warning("minicompile check: the graph could not run eagerly (%s: %s); not checked",
                        type(e).__name__, e)
            return run_compiled(args)
        _set_rng_state(rng)
        actual = run_compiled(args)
        found = mismatch(expected, actual)
        if found:
            self._report(found, expected, actual, _with(args, before), rng)
        return actual

    def _report(self, found: str, expected, actual, args: tuple, rng) -> None:
        wide = float64_values(self.gm, args, self.compiled.aten.gm)[1]
        distance = rounding_distances(expected, actual, wide)
        if distance and distance[0] <= ROUNDING * distance[1] + ROUNDING_ATOL:
            log.info("minicompile check: %s; but no farther from a float64 run than eager (%.3g against %.3g)",
                     found, *distance)
            return
        if distance:
            found += f"; from a float64 run: compiled {distance[0]:.3g}, eager {distance[1]:.3g}"
        if self.reports:  # localised once per graph
            log.warning("minicompile check: this graph differs from eager again: %s", found)
            return
        try:
            text = localise(self.compiled, found, expected, args, rng)
        except Exception as e:
            text = (f"minicompile check: a compiled graph's {found}; localising it failed "
                    f"({type(e).__name__}: {e})")
        self.reports.append(text)
        log.warning("%s", text)


def localise(compiled, found: str, expected, args: tuple, rng) -> str:
    """The check's report for a graph whose outputs differ from eager's (see the module docstring)."""
    full = list(args) + list(compiled.aten.lifted)
    prepared = compiled.aten.prepared
    aten_args = full + list(prepared(tuple(full))) if prepared else full
    _set_rng_state(rng)
    eager, aten_out = eager_values(compiled.aten.gm, _copies(aten_args))  # each run on its own copies:
    # the graph writes the inputs it mutates
    lines = [f"minicompile check: a compiled graph ({compiled.num_kernels} kernel(s), "
             f"{len(compiled.externs)} extern call(s)) differs from eager: {found}"]
    decomposed = mismatch(expected, aten_out, strides=False)
    if decomposed:
        lines.append(f"  the decomposed ATen graph, run eagerly, already differs (a decomposition or ATen pass): "
                     f"{decomposed}")
    wide = float64_values(compiled.aten.gm, aten_args, compiled.aten.gm)[0]
    steps = SteppedRun(compiled, _copies(full), wide)
    _set_rng_state(rng)
    first = steps.first_difference(eager, feed=True)
    if first is not None:
        lines.append(f"  first diverging step, fed eager's values of its inputs: {first}")
    else:
        _set_rng_state(rng)
        chained = SteppedRun(compiled, _copies(full), wide).first_difference(eager, feed=False)
        lines.append("  every kernel and extern call matches eager when fed eager's inputs"
                     + (f"; along the compiled chain, rounding first exceeds the tolerance at {chained}"
                        if chained else "; the difference is in the outputs' layout or aliasing"))
    lines += [f"  library choice: {c}" for c in library_choices(compiled.aten.gm)]
    path = _write_repro(compiled, aten_args, "a graph MINICOMPILE_CHECK found to differ from eager")
    lines.append(f"  reproducer: {path} (run: python {path})")
    return "\n".join(lines)


# Ops whose result holds whatever the memory held: no value to compare or feed.
UNDEFINED = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default,
             aten.new_empty_strided.default, aten.empty_permuted.default}


# A result is rounding, not a wrong value, when it is no farther than this from a float64 run
# relative to eager's own distance (plus float32's absolute tolerance): a sum of terms that
# cancel is 0.0 in eager and 1e-5 in another order of summation, both right.
ROUNDING, ROUNDING_ATOL = 2.0, 1e-5


def rounding_distances(expected, actual, wide) -> tuple | None:
    """(compiled's, eager's) largest distance from the float64 run ``wide`` over the float outputs;
    None without a float64 run."""
    if wide is None:
        return None
    leaves = zip(*(pytree.tree_leaves(v) for v in (expected, actual, wide)))
    pairs = [((a.double() - w).abs().max().item(), (e.double() - w).abs().max().item()) for e, a, w in leaves
             if isinstance(e, torch.Tensor) and e.is_floating_point() and e.numel() and e.shape == w.shape]
    return (max(p[0] for p in pairs), max(p[1] for p in pairs)) if pairs else None


class _Float64(torch.fx.Interpreter):
    """Floating tensors widened to float64; a node whose op refuses float64 runs in float32."""

    def run_node(self, n):
        try:
            return _widened(super().run_node(n))
        except Exception:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            narrow = pytree.tree_map(lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float64
                                     else v, (args, kwargs))
            return _widened(getattr(self, n.op)(n.target, *narrow))


def _widened(value):
    """Float tensors as float64 copies, other tensors copied (the run may write them), the rest as is."""
    return pytree.tree_map(lambda v: (v.double() if v.is_floating_point() else copy_preserving_strides(v))
                           if isinstance(v, torch.Tensor) else v, value)


def float64_values(gm: torch.fx.GraphModule, args, aten_graph):
    """(FX node name -> value, outputs) of ``gm`` run in float64, or (None, None) where that says
    nothing: the graph draws random numbers (float64 draws differ) or the run fails."""
    if any(isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
           for n in aten_graph.graph.nodes):
        return None, None
    interpreter = _Float64(gm, garbage_collect_values=False)
    try:
        with torch.no_grad():
            out = interpreter.run(*_widened(list(args)))
    except Exception:
        return None, None
    return {n.name: v for n, v in interpreter.env.items() if n.target not in UNDEFINED}, out


def eager_values(gm: torch.fx.GraphModule, args: list):
    """(FX node name -> eager's value, the graph's outputs): ``gm`` interpreted one node at a time."""
    interpreter = torch.fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        out = interpreter.run(*args)
    return {n.name: v for n, v in interpreter.env.items() if n.target not in UNDEFINED}, out


class SteppedRun:
    """The compiled graph's wrapper, one schedule step at a time, in a namespace that keeps every
    buffer (no memory handed on), so each can be fed and compared."""

    def __init__(self, compiled, args: list, wide: dict | None = None):
        self.compiled = compiled
        self.wide = wide  # float64 values of the FX nodes: a difference within rounding is not reported
        kernels = compiled.code.kernels
        self.wrapper = WrapperCode(compiled.loop_graph, compiled.schedule, kernels.kernel_args,
                                   compiled.aten.prepared, reuse_memory=False)
        source = self.wrapper.generate()
        self.ns: dict = {}
        exec(compile(source, "<minicompile-check-wrapper>", "exec"), self.ns)
        self.ns.update({name: getattr(compiled.lib, name) for name in kernels.kernel_args})
        self.ns.update(compiled.loop_graph.constants)
        self.ns.update(externs=self.wrapper.externs, args=tuple(args))
        self._exec(self.wrapper.prologue, "prologue")
        self.by_name = compiled.loop_graph.by_name
        self.kernels = {k.name: k for k in compiled.schedule.kernels}
        self.groups = {g.name: g.kernels for g in compiled.schedule.groups}

    def first_difference(self, eager: dict, feed: bool) -> str | None:
        """The first step whose results differ from eager's, described; None when none does."""
        for step, (_, lines) in zip(self.compiled.schedule.steps, self.wrapper.steps):
            writers = self._writers(step)
            written = {b.name for _, b in writers}
            if feed:
                for name in self._reads(step):
                    if name not in written:
                        self._feed(name, eager)
            self._exec(lines, step.name)
            for kernel, buf in writers:
                expected = _eager_of(buf, eager, self.ns.get(buf.name))
                if expected is None:
                    continue
                found = mismatch(expected, self.ns[buf.name], strides=False)
                wide = _eager_of(buf, self.wide or {}, self.ns[buf.name], same_dtype=False)
                distance = rounding_distances(expected, self.ns[buf.name], wide)
                if found and distance and distance[0] <= ROUNDING * distance[1] + ROUNDING_ATOL:
                    continue
                if found:
                    return self._describe(kernel, buf, found.removeprefix("output 0: "))
        return None

    def _exec(self, lines: list, name: str) -> None:
        exec(compile("\n".join(lines), f"<minicompile-check {name}>", "exec"), self.ns)

    def _writers(self, step) -> list:
        """(kernel or extern buffer, buffer written) per buffer this step's call writes."""
        if isinstance(step, TemplateKernel):
            return [(step, b) for b in step.outputs]
        if not isinstance(step, FusedKernel):
            return [(step.buffer, step.buffer)] if getattr(step.buffer, "layout", None) is not None else []
        call = self.wrapper._call_name(step)
        if call is None:  # a group's kernel before its last: the group is called later
            return []
        members = [self.kernels[k] for k in self.groups.get(call, [call])]
        return [(k, n) for k in members for n in k.nodes if k.in_memory(n.name) and not n.mutates]

    def _reads(self, step) -> list:
        if not isinstance(step, FusedKernel):
            return list(step.reads)   # an extern's, or a TemplateKernel's
        call = self.wrapper._call_name(step)
        return [p for p in self.wrapper.kernel_args[call]] if call else []

    def _feed(self, name: str, eager: dict) -> None:
        buf, held = self.by_name.get(name), self.ns.get(name)
        if buf is None or isinstance(buf, InputBuffer) or not isinstance(held, torch.Tensor):
            return
        value = _eager_of(buf, eager, held)
        if value is not None and not torch._debug_has_internal_overlap(held) == 1:
            with torch.no_grad():
                held.copy_(value)

    def _describe(self, kernel, buf, found: str) -> str:
        sources = self.compiled.loop_graph.sources
        if isinstance(kernel, FusedKernel):
            what = f"kernel {kernel.name}"
            by_line = origins_by_source_line(kernel, sources)
        elif isinstance(kernel, TemplateKernel):
            what = f"kernel {kernel.name}"
            by_line = {sources.get(o, ""): [o] for o in kernel.buffer.origins}
        else:
            parent = kernel.parent if isinstance(kernel, MultiOutput) else kernel
            what = f"extern call {parent.op} ({parent.name})"
            by_line = {sources.get(o, ""): [o] for o in parent.origins}
        nodes = [n for names in by_line.values() for n in names]
        where = [f"      {line or '(no source line recorded)'}  <- FX {', '.join(names)}"
                 for line, names in by_line.items()]
        return "\n".join([f"{what}", f"    its buffer {buf.name} (FX node {buf.origins[-1]}): {found}",
                          f"    FX nodes: {', '.join(nodes)}", "    user source lines:", *where])


def _eager_of(buf, eager: dict, held, same_dtype: bool = True):
    """Eager's value of the FX node ``buf`` holds, where it is a tensor shaped as ``held``."""
    if isinstance(buf, InputBuffer) or not buf.origins or (isinstance(buf, ComputedBuffer) and buf.mutates):
        return None
    value = eager.get(buf.origins[0] if isinstance(buf, (ExternKernel, MultiOutput)) else buf.origins[-1])
    for k in getattr(buf, "path", ()):
        value = value[k] if isinstance(value, (list, tuple)) else None
    if not (isinstance(value, torch.Tensor) and isinstance(held, torch.Tensor)):
        return None
    return value if value.shape == held.shape and (value.dtype == held.dtype or not same_dtype) else None


def _write_repro(compiled, aten_args: list, title: str) -> str:
    key = cache.digest(compiled.kernel_source, compiled.wrapper_source)[:16]
    directory = os.path.join(config.cache_dir, "check", key)
    return write_repro(compiled, aten_args, directory, title=title, values=aten_args)


def _copies(args: list) -> list:
    return [copy_preserving_strides(a) for a in args]


def _with(args: tuple, replaced: dict) -> tuple:
    return tuple(replaced.get(k, a) for k, a in enumerate(args))


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
