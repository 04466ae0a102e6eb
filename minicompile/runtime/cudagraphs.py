"""CUDA graphs for compiled graphs (``torch.compile(mode="reduce-overhead")``).

A compiled graph on CUDA tensors launches one kernel per fused group, and for small inputs
the Python wrapper and the launches cost more than the kernels. ``CUDAGraphRunner`` wraps the
wrapper's ``call(args)``: for each input signature (shapes, strides, dtypes, non-tensor
arguments, and the addresses of static inputs) it

1. copies the caller's tensors into static input buffers of the same layout,
2. runs the graph once on a side stream (warm-up: Triton compiles and autotunes, cuBLAS
   creates its workspace: neither can happen inside a capture), then once more with host
   synchronisations as errors (a graph that synchronises cannot be captured, and a capture
   that fails midway would leave CUDA's random generator unusable),
3. records one CUDA graph of a second run (its intermediates and outputs live in the
   recording's private memory pool),

and every call then copies the inputs in, replays, writes mutated inputs back to the
caller's tensors and returns the outputs. A new shape records a new graph; a seen one is
replayed.

Static inputs (the graph's lifted attributes and ``nn.Parameter`` arguments that the graph
does not mutate) are used in place, not copied: their addresses are part of the signature,
so a replaced parameter records again.

Outputs are fresh tensors, never views of the static pool: each replay writes into the same
memory, so handing out the pool would silently change an output a caller kept from an
earlier call. The copy costs one device-to-device copy per output (cheap next to what the
graph saves); outputs that are views of one buffer stay views of one fresh copy. An output
that is (a view of) an input is (a view of) the caller's tensor, as in eager.

A graph that cannot be captured (a host synchronisation, a CPU tensor, an op CUDA graphs do
not support) runs as usual from then on, with one warning.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable

import torch

log = logging.getLogger("minicompile")


class CUDAGraphRunner:
    """``runner(args)`` is ``fn(args)``, replayed from a CUDA graph recorded per input signature."""

    def __init__(self, fn: Callable, static_positions=(), mutated_positions=()):
        self.fn = fn
        self.mutated = tuple(sorted(mutated_positions))
        self.static = frozenset(static_positions) - frozenset(self.mutated)
        self.recordings: dict = {}
        self.failed: str | None = None  # why capture failed; the graph then runs without CUDA graphs

    def __call__(self, args):
        if self.failed is not None:
            return self.fn(args)
        key = signature(args, self.static)
        recording = self.recordings.get(key)
        if recording is None:
            try:
                recording = self.recordings[key] = Recording(self.fn, args, self.static)
            except Exception as e:  # noqa: BLE001 - the graph still runs, without CUDA graphs
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("minicompile: recording a CUDA graph failed (%s); this graph runs without "
                            "CUDA graphs", self.failed)
                return self.fn(args)
        return recording.replay(args, self.mutated)


class Recording:
    """One recorded CUDA graph: its static inputs, and the outputs its replays write."""

    def __init__(self, fn: Callable, args, static: frozenset):
        self.inputs = tuple(a if i in static or not isinstance(a, torch.Tensor) else static_copy(a)
                            for i, a in enumerate(args))
        self.copied = [(i, s) for i, (s, a) in enumerate(zip(self.inputs, args)) if s is not a]
        self._copy_in(args)  # the warm-up sees real values: garbage indices would fault the device
        self.graph, self.outputs = capture(fn, self.inputs)
        self.handout = output_plan(self.outputs, self.inputs)   # fixed memory: planned once

    def replay(self, args, mutated: tuple):
        self._copy_in(args)
        self.graph.replay()
        for i in mutated:
            copy_in(args[i], self.inputs[i])
        return fresh_outputs(self.handout, args)

    def _copy_in(self, args):
        for i, static in self.copied:
            copy_in(static, args[i])


def capture(fn: Callable, inputs) -> tuple:
    """Warm ``fn`` up on a side stream, then record it: (the CUDA graph, the outputs its replays write)."""
    device = next(a.device for a in inputs if isinstance(a, torch.Tensor))
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(inputs)
            # A capture that fails midway (a host synchronisation: .item(), nonzero) leaves CUDA's
            # random generator registered to the aborted graph, and every later random op in the
            # process raises. So a second warm-up runs with synchronisations as errors: such a
            # graph is refused here, before any capture begins.
            with _syncs_raise():
                fn(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn(inputs)
    return graph, outputs


@contextlib.contextmanager
def _syncs_raise():
    saved = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(saved)


def signature(args, static: frozenset) -> tuple:
    """What a recording is specialised to: layouts, non-tensor values, static inputs' addresses."""
    return tuple((a.shape, a.stride(), a.dtype, a.device, a.data_ptr() if i in static else None)
                 if isinstance(a, torch.Tensor) else (type(a), a) for i, a in enumerate(args))


def static_copy(t: torch.Tensor) -> torch.Tensor:
    """A buffer with ``t``'s sizes and strides (so the recorded kernels index it alike)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def copy_in(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for tensors of one layout, also when a dimension is broadcast (stride 0,
    which copy_ refuses to write): only the distinct elements are copied."""
    for d, (n, st) in enumerate(zip(src.shape, src.stride())):
        if st == 0 and n > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, 0, 1)
    dst.copy_(src)


def output_plan(outputs, static_inputs) -> tuple:
    """How a recording hands out each output, decided once (its memory never moves): (plan, pool
    storages), the plan holding (how, position, output, static input) per output: ("input", i, o,
    static) for (a view of) static input i, ("copy", k, o, None) for a view of pool storage k
    (outputs sharing a storage share its copy), ("value", None, o, None) for a non-tensor."""
    by_storage = {}
    for i, s in enumerate(static_inputs):
        if isinstance(s, torch.Tensor) and s.untyped_storage().data_ptr():  # empty tensors share address 0
            by_storage.setdefault(s.untyped_storage().data_ptr(), i)
    plan, index = [], {}
    for o in outputs:
        ptr = o.untyped_storage().data_ptr() if isinstance(o, torch.Tensor) else None
        if ptr is None:
            plan.append(("value", None, o, None))
        elif ptr in by_storage:
            plan.append(("input", by_storage[ptr], o, static_inputs[by_storage[ptr]]))
        else:
            plan.append(("copy", index.setdefault(ptr, (len(index), o.untyped_storage()))[0], o, None))
    return tuple(plan), tuple(st for _, st in index.values())


def fresh_outputs(handout, args) -> tuple:
    """The replay's outputs as the caller may keep them (``output_plan``): views of fresh copies of
    the pool's storages, and the caller's own tensors for outputs that are inputs."""
    plan, storages = handout
    copies = [st.clone() for st in storages]
    out = []
    for how, k, o, static in plan:
        if how == "copy":
            o = torch.empty(0, dtype=o.dtype, device=o.device).set_(copies[k], o.storage_offset(), o.size(), o.stride())
        out.append(_as_caller_tensor(o, static, args[k]) if how == "input" else o)
    return tuple(out)


def _as_caller_tensor(o, static, caller):
    if o is static:
        return caller
    offset = caller.storage_offset() + o.storage_offset() - static.storage_offset()
    return caller.as_strided(o.size(), o.stride(), offset)
