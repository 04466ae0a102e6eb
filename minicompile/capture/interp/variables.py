"""The symbolic values that live on the tracer's stack.

Most values are plain Python objects: constants, modules, functions, and tuples/lists/dicts
whose elements may be symbolic. Only what cannot be a real object gets a class here:
tensors (an FX node plus a fake tensor), iterators, cells, functions made during tracing,
bound methods we will inline, and the NULL that CPython pushes below a callable.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch


class GraphBreak(Exception):
    """A construct the tracer cannot follow: the segment is split there (a graph break), or,
    where no split is possible, the function falls back (segment.CannotCapture).

    ``where`` is the user's ``file:line`` of the innermost frame that hit it.
    """

    def __init__(self, reason: str, where: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.where = where
        self.retrace = False   # set when tracing again avoids it (a generator now called natively)
        self.generator = None  # the traced generator (a LazyIter) that outlives a graph, if that is why


class MissingAttribute(GraphBreak):
    """Python would raise ``AttributeError`` here: the attribute does not exist (and the
    guards that make its absence hold on later calls are installed). ``getattr`` with a
    default and ``hasattr`` answer from it; anywhere else it is a graph break, so Python
    raises the error itself."""


class _Null:
    """CPython's NULL stack slot (below a callable, or an unbound local)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "NULL"

    def __reduce__(self):
        return (_Null, ())


NULL = _Null()


class TensorVar:
    """A tensor while tracing: the FX node that computes it and a fake tensor for metadata."""

    __slots__ = ("node", "fake", "cls", "source")

    def __init__(self, node: torch.fx.Node, fake: torch.Tensor, cls: type = torch.Tensor,
                 source: str | None = None):
        self.node = node
        self.fake = fake
        self.cls = cls          # the real Python type (Parameter, a subclass, or Tensor)
        self.source = source    # set when this tensor is a graph input read from `source`

    def __repr__(self):
        return f"TensorVar({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


@dataclass(eq=False)
class TensorMethod:
    """``tensor.name`` looked up but not yet called."""
    tensor: TensorVar
    name: str


@dataclass(eq=False)
class SymIter:
    """An iterator over a list of (possibly symbolic) items, materialized when created."""
    items: list
    pos: int = 0

    def next(self):
        if self.pos >= len(self.items):
            return NULL
        self.pos += 1
        return self.items[self.pos - 1]

    def remaining(self) -> list:
        return self.items[self.pos:]


class LazyIter(SymIter):
    """An iterator whose items are made when asked for: ``produce()`` gives the next one or
    NULL. A generator function's frame runs to its next ``yield`` per item (so its side effects
    interleave with the consumer's as in Python, and a loop left early leaves it suspended);
    ``zip``/``enumerate``/``map``/``filter`` over one stay lazy the same way."""

    def __init__(self, produce):
        super().__init__([])
        self.produce, self.finished = produce, False
        self.managed = False   # a contextmanager's generator: always run to its end
        self.result = None     # a finished generator's return value
        self.code = None       # a generator's code object (what to call natively instead)

    def _step(self) -> bool:
        if not self.finished:
            v = self.produce()
            if v is not NULL:
                self.items.append(v)
                return True
            self.finished = True
        return False

    def next(self):
        if self.pos == len(self.items) and not self._step():
            return NULL
        self.pos += 1
        return self.items[self.pos - 1]

    def remaining(self) -> list:
        while self._step():
            pass
        return self.items[self.pos:]


def unfinished(v) -> bool:
    """A lazy iterator that may still run code: it cannot be handed to Python at a graph
    break (its frame exists only in the tracer) nor drained there (side effects)."""
    return isinstance(v, LazyIter) and not v.finished


@dataclass(eq=False)
class GenContext:
    """``cm(...)`` for a ``@contextlib.contextmanager`` function: its generator, not yet entered.
    Handed to Python at a break it is ``cm(*args, **kwargs)`` again (nothing has run yet)."""
    gen: LazyIter
    fn: Any = None
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


@dataclass(eq=False)
class GenContextExit:
    """The ``__exit__`` of an entered GenContext: resumes the generator after its ``yield``.
    ``enter_offset``: the top frame's BEFORE_WITH that entered it (None in an inlined frame)."""
    gen: LazyIter
    enter_offset: int | None = None


class OpenGenContext(GraphBreak):
    """A break inside a ``with`` block over a traced contextmanager, whose suspended generator
    exists only in the tracer: the break moves to the BEFORE_WITH that entered the block, so
    Python enters it and the block's code resumes with the real ``__exit__`` on the stack."""

    def __init__(self, enter_offset: int):
        super().__init__("a graph break inside a with-block over a traced @contextmanager")
        self.enter_offset = enter_offset


class _EmptyCell:
    def __repr__(self):
        return "<empty cell>"


EMPTY = _EmptyCell()


@dataclass(eq=False)
class OpaqueValue:
    """A value read from a source whose contents no guard fixes: a NumPy array (or a NumPy
    scalar in the frame), which may hold a tensor's data. It can be moved, stored, passed to
    calls and returned (generated code reads it from its source again); anything that reads
    it -- an operator, an attribute, an item, truth, a torch op -- is a graph break, so its
    value is never computed into a constant or a guard of the entry."""
    cls: type       # the real value's type (guarded)
    source: str

    def __repr__(self):
        return f"OpaqueValue({self.cls.__name__} at {self.source})"


@dataclass(eq=False)
class ScalarVar(OpaqueValue):
    """A Python float in the frame at a resume point (``v = t.sum().item()`` handed over at the
    break), not specialised: the graph takes it as a 0-d float64 input (``tensor``), so its value
    is in no guard. Arithmetic and comparisons with a tensor are graph ops; any other use
    specialises it (SpecialiseScalar: the segment is traced again with it a guarded constant)."""
    tensor: Any = None   # TensorVar of the graph input


class SpecialiseScalar(GraphBreak):
    """A ScalarVar was used where its value is needed: trace again with ``source`` a constant."""

    def __init__(self, reason: str, source: str):
        super().__init__(reason)
        self.source = source


def refuse_opaque(what: str, *values) -> None:
    """``what`` reads the value of an OpaqueValue among ``values``: a break (a ScalarVar: trace
    again with it specialised)."""
    for v in values:
        if isinstance(v, ScalarVar):
            raise SpecialiseScalar(f"{what} needs the value of the float at {v.source}", v.source)
        if isinstance(v, OpaqueValue):
            raise GraphBreak(f"{what} reads a {v.cls.__name__} from {v.source} (its data is not traced)")


@dataclass(eq=False)
class SymCell:
    """A closure cell created while tracing (``MAKE_CELL``)."""
    value: Any = EMPTY


@dataclass(eq=False)
class SymFunction:
    """A function object created by ``MAKE_FUNCTION`` during tracing."""
    code: types.CodeType
    globals: dict
    name: str
    defaults: tuple | None = None
    kwdefaults: dict | None = None
    closure: tuple = ()          # SymCell or real cell objects
    annotations: dict | None = None


@dataclass(eq=False)
class SymBoundMethod:
    """``obj.method`` where ``method`` is a Python function we will inline with ``obj`` first."""
    func: Any                    # types.FunctionType or SymFunction
    self_value: Any


@dataclass(eq=False)
class ResumeIter:
    """What a symbolic iterator becomes when a graph break hands it to real Python.

    A real iterator over the remaining items; when tracing resumes, the tracer reads
    ``items`` back instead of consuming it, so both sides agree on what is left.
    """
    items: list = field(default_factory=list)
    pos: int = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]


@dataclass(eq=False)
class GradModeCtx:
    """``torch.no_grad()`` / ``torch.enable_grad()`` before its ``with`` enters it."""
    enabled: bool


@dataclass(eq=False)
class GradModeFunction:
    """A function decorated with ``@torch.no_grad()`` / ``@torch.enable_grad()`` while tracing:
    calling it switches grad mode around the inlined body."""
    func: object
    enabled: bool


def real_grad_ctx(enabled: bool):
    """The real context manager a GradModeCtx stands for, for code that runs natively."""
    return torch.enable_grad() if enabled else torch.no_grad()


@dataclass(eq=False)
class GradModeExit:
    """The ``__exit__`` a ``with torch.no_grad()`` block left on the stack."""
    restore: bool


class GradRestore:
    """A GradModeExit handed to real Python at a graph break inside the ``with`` block."""

    def __init__(self, restore: bool):
        self.restore = restore

    def __call__(self, *exc_info):
        torch._C._set_grad_enabled(self.restore)
        return False


def contains_symbolic(value, _depth: int = 0) -> bool:
    """True when a value is, or holds, something only the tracer understands."""
    if isinstance(value, (TensorVar, TensorMethod, SymIter, SymCell, SymFunction, OpaqueValue,
                          SymBoundMethod, GradModeExit, GradModeCtx, GenContext, GenContextExit)):
        return True
    if _depth > 8:
        return False
    if isinstance(value, (tuple, list)):
        return any(contains_symbolic(v, _depth + 1) for v in value)
    if isinstance(value, dict):
        return any(contains_symbolic(v, _depth + 1) for v in value.values())
    if isinstance(value, slice):
        return any(contains_symbolic(v, _depth + 1) for v in (value.start, value.stop, value.step))
    return False
