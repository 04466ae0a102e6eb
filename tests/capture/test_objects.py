"""Objects made while tracing, Python attribute hooks, super(), try/with blocks and guarded
reads of global state (capture/python/objects.py and the semantics that call it)."""
from __future__ import annotations

import collections
import dataclasses
import os

import torch

from minicompile.capture import compile, explain
from tests.helpers import check_capture, same


def t(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))


class Output(collections.OrderedDict):
    """An OrderedDict dataclass whose fields are also items (like HF's ModelOutput)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else tuple(self.values())[k]


@dataclasses.dataclass
class LMOutput(Output):
    logits: torch.Tensor = None
    loss: torch.Tensor = None
    hidden: tuple = None


def test_ordered_dict_dataclass_output_is_rebuilt():
    def f(x):
        out = LMOutput(logits=x * 2, hidden=(x, x + 1))
        return out, out["logits"] + out[1][0], list(out.keys())

    expected = f(t(3))
    cf = compile(f)
    for _ in range(2):
        got = cf(t(3))
        out = got[0]
        assert type(out) is LMOutput and list(out.keys()) == ["logits", "hidden"] and out.loss is None
        assert same(dict(out), dict(expected[0])) and same(got[1:], expected[1:])
        assert same(out.logits, expected[0].logits)
    report = cf.capture_report
    assert report.graph_count == 1 and report.break_count == 0 and not report.fallbacks, report


def test_new_object_live_at_a_break_is_rebuilt():
    class Acc:
        def __init__(self, v):
            self.v = v
            self.n = 1

    def f(x):
        a = Acc(x * 2)
        print(end="")   # a break: `a` crosses it as a rebuilt object
        a.n += 1
        return a.v * a.n

    check_capture(f, t(3), graphs=2, breaks=1)


def test_super_and_property_in_traced_classes():
    class Base:
        def __init__(self, v):
            self._v = v

        @property
        def v(self):
            return self._v

        def scaled(self, k):
            return self.v * k

    class Child(Base):
        def __init__(self, v):
            super().__init__(v + 1)

        def scaled(self, k):
            return super().scaled(k) + 1

    check_capture(lambda x: Child(x).scaled(3), t(3), graphs=1, breaks=0)


class Config:
    """A config object with a Python __getattribute__/__setattr__ that maps aliases."""
    alias = {"width": "hidden"}

    def __init__(self):
        self.hidden = 4

    def __getattribute__(self, key):
        if key != "alias" and key in super().__getattribute__("alias"):
            key = super().__getattribute__("alias")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in type(self).alias:
            key = type(self).alias[key]
        super().__setattr__(key, value)


def test_python_getattribute_and_setattr_hooks_are_followed():
    def f(x, cfg):
        cfg.width = 3            # stored as cfg.hidden by __setattr__
        return x * cfg.width     # read through __getattribute__

    cfg = Config()
    report = explain(f)(t(3), cfg)
    assert cfg.hidden == 3 and "width" not in cfg.__dict__
    assert same(report.output, t(3) * 3) and report.graph_count == 1 and report.break_count == 0


def test_try_finally_and_python_context_manager():
    class Track:
        def __init__(self):
            self.log = []

        def __enter__(self):
            self.log.append("in")
            return self

        def __exit__(self, *exc):
            self.log.append("out")

    def f(x, tr):
        try:
            with tr:
                y = x * 2
        finally:
            z = 1
        return y + z

    tr = Track()
    report = explain(f)(t(3), tr)
    assert tr.log == ["in", "out"] and report.graph_count == 1 and not report.fallbacks


def test_with_block_break_is_split_and_still_exits():
    class Track:
        log: list = []

        def __enter__(self):
            Track.log.append("in")

        def __exit__(self, *exc):
            Track.log.append("out")

    def f(x):
        with Track():
            y = x * 2
            print(end="")
        return y

    report = explain(f)(t(3))
    assert same(report.output, t(3) * 2) and not report.fallbacks and Track.log == ["in", "out"]
    assert report.break_count == 1


def test_environment_reads_are_guarded():
    def f(x):
        return x * 2 if os.environ.get("MINICOMPILE_TEST_FLAG") == "1" else x

    cf = compile(f)
    os.environ.pop("MINICOMPILE_TEST_FLAG", None)
    assert same(cf(t(3)), t(3))
    os.environ["MINICOMPILE_TEST_FLAG"] = "1"
    try:
        assert same(cf(t(3)), t(3) * 2)
    finally:
        del os.environ["MINICOMPILE_TEST_FLAG"]
    assert len(cf.capture_report.recompiles) == 1


def test_del_attribute_is_replayed():
    class Holder:
        pass

    def f(x, h):
        h.tmp = 1
        del h.tmp
        h.keep = 2
        return x + 1

    h = Holder()
    explain(f)(t(3), h)
    assert not hasattr(h, "tmp") and h.keep == 2
