"""Trace-time library timing: which vendor routine is fastest for one operation and shape.

The CPU policy (cpu/claims.py, cpu/conv_layout.py) asks ``library_choice`` (the fastest of a few
routines) or ``library_times`` (their seconds per call) while it decides how to trace a graph:
MKL's sgemm or oneDNN's matmul, eager's flash attention or our math form, NCHW or NHWC
convolutions. Each answer is measured once per key (the key names the machine, the thread
count and the shape) and kept in this process and on disk, in the same store as max-autotune's
graph variants (runtime/autotune.py), so a later compile of the same shape measures nothing
and decides the same.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import platform
import time
from dataclasses import dataclass
from typing import Callable

import torch

from minicompile.aot.autocast import autocast_off
from minicompile.runtime.autotune import before_timing, load_timings, save_choice

log = logging.getLogger("minicompile")

LIBRARY_ROUNDS = (5, 15)    # at least / at most this many interleaved rounds ...
LIBRARY_BUDGET_S = 0.02     # ... running until this much time has passed (0.05 cost BERT 0.1 s cold)
_library_choices: dict = {}


class NoCandidateRan(RuntimeError):
    """Every routine of a measured choice raised on its operands; the message names the first error."""


def library_choice(key: str, candidates: dict, what: str = "", prefer: str | None = None, margin: float = 0.0,
                   otherwise: str | None = None) -> str:
    """The fastest of ``candidates`` (name -> a call with no arguments), measured once per key.

    For choices between vendor routines for one operation and shape (cpu/claims.py: MKL's
    sgemm or oneDNN's matmul), where the winner depends on the machine and the ratio is large.
    The candidates run interleaved, a round at a time, so a noisy moment hits all of them; the
    median decides. The winner is remembered in this process and on disk (the key names the
    machine, the thread count and the shape), so a later compile of the same shape measures
    nothing and decides the same. A candidate that raises is not chosen.

    Each run is timed by the process's CPU time and the fastest run counts: on a machine
    shared with other work, wall-clock runs mostly measured how long the scheduler kept us
    waiting (medians of wall-clock rounds picked a 3x slower GEMM under load).

    ``prefer`` is kept unless another candidate is faster by more than ``margin`` (a fraction):
    for a routine with a cost that timing it alone does not show. ``otherwise`` is the answer
    where no candidate runs (a form that needs none of them: our decomposition), else NoCandidateRan.
    """
    if key in _library_choices:
        return _library_choices[key]
    try:
        times = library_times(key, candidates, what)
    except NoCandidateRan as e:
        if otherwise is None:
            raise
        log.info("%s: %s; using %s", what or key, e, otherwise)
        _library_choices[key] = otherwise
        return otherwise
    _library_choices[key] = choice = pick(times, prefer, margin)
    return choice


_library_times: dict = {}


def library_times(key: str, candidates: dict, what: str = "") -> dict:
    """Seconds per call of each of ``candidates`` (the fastest of interleaved runs, as
    ``library_choice`` measures), once per key, remembered in this process and on disk. For a
    choice that adds the times of several routines (cpu/conv_layout.py: a graph's layout,
    from every convolution in it)."""
    if key in _library_times:
        return _library_times[key]
    times = load_timings(key)
    if times is None or set(times) != set(candidates):
        times = _interleaved_best(candidates)
        choice = min(times, key=times.get)
        save_choice(key, choice, times)
        log.info("measured %s: %s (%s)", what or key, choice,
                 ", ".join(f"{name} {t * 1e3:.3f} ms" for name, t in times.items()))
    _library_times[key] = times
    return times


@contextlib.contextmanager
def real_tensors():
    """Leave a trace's fake and proxy modes (and grad mode, and autocast) to time real library calls."""
    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad(), autocast_off():
        yield


def _interleaved_best(candidates: dict) -> dict:
    before_timing()
    times, errors = {name: [] for name in candidates}, {}
    for name, call in candidates.items():
        try:
            call()                          # warm-up: first-call setup is not the routine's speed
        except Exception as e:  # noqa: BLE001 - a routine that does not run is not a candidate
            del times[name]
            errors[name] = f"{type(e).__name__}: {e}"
    if not times:
        raise NoCandidateRan(f"no candidate routine ran: {sorted(candidates)} ({next(iter(errors.items()))})")
    start = time.perf_counter()
    for rounds in range(1, LIBRARY_ROUNDS[1] + 1):
        for name in times:
            t0 = time.process_time()
            candidates[name]()
            times[name].append(time.process_time() - t0)
        if rounds >= LIBRARY_ROUNDS[0] and time.perf_counter() - start >= LIBRARY_BUDGET_S:
            break
    return {name: min(ts) for name, ts in times.items()}


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The CPU's feature flags (``avx2``, ``avx512_bf16``, ...); empty where /proc/cpuinfo is missing."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """The CPU's model name (part of a measured choice's key: another CPU measures again)."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


# -- measured before the trace, never inside it -------------------------------------------------

_PENDING: contextvars.ContextVar = contextvars.ContextVar("minicompile_cpu_pending", default=None)


@dataclass(frozen=True)
class Question:
    """A library choice a trace asked for before it was measured: ``library_choice``'s arguments,
    and how the ATen graph's header says the answer (``line``). Meanwhile the trace takes ``prefer``."""
    key: str
    candidates: dict
    what: str
    prefer: str | None
    margin: float
    otherwise: str | None
    line: Callable | None = None

    @property
    def placeholder(self) -> str:
        """The header line the provisional trace records, replaced by ``line(answer)`` when kept."""
        return f"cpu: {self.what} -> measured after the trace ({self.key})"


def choose(key: str, candidates: dict, what: str, prefer: str | None = None, margin: float = 0.0,
           otherwise: str | None = None, line: Callable | None = None) -> str | None:
    """``library_choice``, its header line ``line(choice)`` recorded; inside ``measured_first`` only
    a choice recorded already (in this process or on disk), None for one not measured yet, which is
    left for ``measured_first`` to measure (the trace goes on with ``prefer``)."""
    pending = _PENDING.get()
    if pending is None:
        choice = library_choice(key, candidates, what, prefer, margin, otherwise)
    elif key in _library_choices:
        choice = _library_choices[key]
    else:
        times = _library_times.get(key) or load_timings(key)
        if times is None or set(times) != set(candidates):
            question = Question(key, candidates, what, prefer, margin, otherwise, line)
            pending.append(question)
            if line is not None:
                record(question.placeholder)
            return None
        _library_times[key] = times
        choice = _library_choices[key] = pick(times, prefer, margin)
    if line is not None:
        record(line(choice))
    return choice


def pick(times: dict, prefer: str | None, margin: float) -> str:
    """library_choice's rule: the fastest, unless ``prefer`` is within ``margin`` of it."""
    choice = min(times, key=times.get)
    return prefer if prefer in times and times[choice] > times[prefer] * (1 - margin) else choice


def measured_first(trace: Callable, keep: Callable | None = None):
    """``trace()`` with its library choices measured outside it: run once where an unmeasured choice
    only leaves a Question (the trace goes on with the question's ``prefer``), measure those, and run
    again with every answer recorded. Only the first compile of a shape on a machine traces twice,
    and not even that where every answer is what the trace took: then ``keep(result, fix)`` returns
    the provisional result with its header lines passed through ``fix`` (placeholder -> the
    measured line); without ``keep`` the trace always runs again."""
    for _ in range(3):
        pending = []
        token = _PENDING.set(pending)
        try:
            result = trace()
        finally:
            _PENDING.reset(token)
        if not pending:
            return result
        answers = []
        for q in pending:
            with real_tensors():
                answers.append(library_choice(q.key, q.candidates, q.what, q.prefer, q.margin, q.otherwise))
            _library_choices[q.key] = answers[-1]
        if keep is not None and all(a == q.prefer for q, a in zip(pending, answers)):
            lines = {q.placeholder: q.line(a) for q, a in zip(pending, answers) if q.line is not None}
            return keep(result, lambda line: lines.get(line, line))
    return trace()


def recorded_times(key: str) -> dict | None:
    """The times ``library_times`` measured or read for ``key`` in this process; None if it did not."""
    return _library_times.get(key)


# -- what a trace measured: one line per choice, for the ATen graph's header ---------------------

_RECORDER: contextvars.ContextVar = contextvars.ContextVar("minicompile_cpu_choices", default=None)


@contextlib.contextmanager
def recording(lines: list):
    """Collect into ``lines`` the choice ``record``ed while the block runs (each line once)."""
    token = _RECORDER.set(lines)
    try:
        yield lines
    finally:
        _RECORDER.reset(token)


def record(line: str) -> None:
    lines = _RECORDER.get()
    if lines is not None and line not in lines:
        lines.append(line)


@dataclass(frozen=True)
class Decision:
    """One choice of the CPU policy: what it chose, and why (measured, with the times, or pinned)."""
    choice: str
    pinned: str = ""                # the knob setting that pinned it ("MINICOMPILE_CPU_GEMM=onednn")
    times: dict | None = None       # name -> seconds per call, where measured
    note: str = ""                  # a rule beside the timing ("mkl kept unless onednn is 10% faster")

    def timings(self) -> str:
        """``onednn 0.012 ms, mkl 0.015 ms`` (fastest first), or how it was decided."""
        if self.pinned:
            return f"pinned by {self.pinned}"
        if not self.times:
            return self.note or "not measured"
        text = ", ".join(f"{name} {t * 1e3:.3f} ms" for name, t in sorted(self.times.items(), key=lambda kv: kv[1]))
        return f"{text}; {self.note}" if self.note else text

    def line(self, what: str) -> str:
        return f"cpu: {what} -> {self.choice} ({self.timings()})"
