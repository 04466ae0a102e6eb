"""nn.Module forward inlined: parameters/buffers as graph inputs, containers iterated."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from minicompile.capture import compile, explain
from tests.helpers import check_capture, same


def t(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class WithList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.scale = 0.5

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) * self.scale + i
        return self.layers[-1](x) + len(self.layers)


class WithDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        return {k: head(x) for k, head in self.heads.items()}, self.heads["a"](x)


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.arange(4.0))
        self.weight = nn.Parameter(torch.ones(4) * 2)

    def forward(self, x):
        return (x - self.mean) * self.weight


class Helpers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def _branch(self, x, k):
        return self.lin(x) * k

    @property
    def factor(self):
        return 3.0

    def forward(self, x, k=2):
        return self._branch(x, k) + self.factor


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.0))
        self.head = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.head(self.body(x)).softmax(-1)


class Attention(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, s, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        y = att.softmax(-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(b, s, d))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[Attention() for _ in range(2)])

    def forward(self, x):
        return self.blocks(x).mean(dim=1)


MODULES = [
    (MLP, (t(3, 4),)),
    (WithList, (t(2, 4),)),
    (WithDict, (t(2, 4),)),
    (WithBuffers, (t(3, 4),)),
    (Helpers, (t(2, 4),)),
    (Attention, (t(2, 3, 8),)),
    (Nested, (t(2, 3, 8),)),
]


@pytest.mark.parametrize("cls,args", MODULES, ids=[m[0].__name__ for m in MODULES])
def test_module_single_graph(cls, args):
    torch.manual_seed(0)
    m = cls().eval()
    with torch.no_grad():
        check_capture(m, *args, graphs=1, breaks=0)


def test_convnet_eval_and_train():
    torch.manual_seed(0)
    m = ConvNet().eval()
    x = t(2, 3, 8, 8)
    with torch.no_grad():
        check_capture(m, x, graphs=1, breaks=0)
    m.train()
    cm = compile(m)
    expected_model = ConvNet()
    expected_model.load_state_dict(m.state_dict())
    expected_model.train()
    got, exp = cm(x), expected_model(x)
    assert same(got, exp)
    # BatchNorm running stats were updated in place through the graph, exactly once.
    assert torch.allclose(m.body[1].running_mean, expected_model.body[1].running_mean)
    assert int(m.body[1].num_batches_tracked) == 1


def test_parameters_are_graph_inputs_and_grads_flow():
    torch.manual_seed(0)
    m = MLP()
    cm = compile(m)
    x = t(3, 4)
    out = cm(x).sum()
    out.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(grads, m.parameters()):
        assert torch.allclose(g, p.grad)
    gm = cm.capture_report.graphs[0].graph
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 5  # x + 2 weights + 2 biases


def test_module_sees_parameter_updates_without_recompiling():
    m = WithBuffers()
    cm = compile(m)
    x = t(3, 4)
    cm(x)
    with torch.no_grad():
        m.weight.mul_(3)
    assert same(cm(x), m(x))
    assert cm.capture_report.compile_count == 1


def test_compile_bound_forward_and_decorated_method():
    m = MLP()
    x = t(2, 4)
    f = compile(m.forward)
    assert same(f(x), m(x))
    assert f.capture_report.graph_count == 1


def test_module_attribute_write_is_replayed():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.last = None

        def forward(self, x):
            self.calls = self.calls + 1
            y = x * 2
            self.last = y
            return y

    m = Counter()
    report = explain(m)(t(3))
    assert m.calls == 1 and same(m.last, report.output)
    assert report.graph_count == 1 and report.break_count == 0


def test_module_with_hook_runs_hook():
    m = MLP()
    seen = []
    m.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    cm = compile(m)
    assert same(cm(t(2, 4)), m(t(2, 4)))
    assert len(seen) == 2


def test_submodule_with_hook_breaks_and_hook_runs():
    m = MLP()
    seen = []
    m.act.register_forward_hook(lambda mod, inp, out: seen.append(1))
    x = t(2, 4)
    expected = m(x)
    report = explain(m)(x)
    assert same(report.output, expected)
    assert report.break_count == 1 and "hooks" in report.breaks[0].reason
    assert report.graph_count == 2
    assert len(seen) == 2


def test_inputs_whose_readable_names_collide_get_distinct_arguments():
    """Graph arguments are named after their sources, cut to 60 characters: HF Swin's
    ``..._attention_relative_position_bias_table`` and ``..._index`` cut to the same name, and
    the graph's code had one argument twice (a SyntaxError out of the user's call)."""
    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a_very_long_attribute_name_that_runs_well_past_the_sixty_character_cut_table", t(4))
            self.register_buffer("a_very_long_attribute_name_that_runs_well_past_the_sixty_character_cut_index", t(4))

        def forward(self, x):
            return x * self.a_very_long_attribute_name_that_runs_well_past_the_sixty_character_cut_table \
                + self.a_very_long_attribute_name_that_runs_well_past_the_sixty_character_cut_index

    outer = nn.Sequential(nn.Sequential(Deep()))
    check_capture(outer, t(3, 4), graphs=1, breaks=0)


class CallOverride(nn.Module):
    """A layer whose class overrides ``__call__`` and reaches ``forward`` through
    ``super().__call__`` (transformers' GradientCheckpointingLayer has this shape)."""
    doubled = False

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def __call__(self, *args, **kwargs):
        if self.doubled and "scale" in kwargs:
            kwargs["scale"] = kwargs["scale"] * 2
        return super().__call__(*args, **kwargs)

    def forward(self, x, scale=1.0):
        return self.fc(x) * scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([CallOverride() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return x


def test_module_overriding_call_is_inlined():
    """An overridden ``__call__`` was a graph break per layer."""
    m = Stack()
    check_capture(m, t(2, 4), graphs=1, breaks=0)
    check_capture(m.layers[0], t(2, 4), graphs=1, breaks=0, scale=3.0)   # the compiled module itself


def test_module_overriding_call_follows_its_attributes():
    """The override's branch reads the instance: changing it changes the result, as in eager."""
    m = Stack()
    x = t(2, 4)
    cm = compile(m)
    before = m(x)
    assert same(cm(x), before)
    m.layers[1].doubled = True
    after = m(x)
    assert not same(before, after)
    assert same(cm(x), after)


def test_module_overriding_call_with_hook_breaks_and_hook_runs():
    m = Stack()
    seen = []
    m.layers[0].register_forward_hook(lambda mod, inp, out: seen.append(1))
    x = t(2, 4)
    expected = m(x)
    report = explain(m)(x)
    assert same(report.output, expected)
    assert report.break_count == 1 and "hooks" in report.breaks[0].reason
    assert len(seen) == 2


def test_compiled_module_runs_its_classes_call():
    """compile(m) ran ``forward`` and skipped the class's own ``__call__`` (a wrong result)."""
    class Tens(nn.Module):
        def __call__(self, x):
            return super().__call__(x) * 10

        def forward(self, x):
            return x + 1

    class Native(nn.Module):   # a __call__ that is not Python code: a break that runs it
        __call__ = functools.partialmethod(nn.Module.__call__)

        def forward(self, x):
            return x - 1

    class Static(nn.Module):   # m(x) calls it without the module
        __call__ = staticmethod(lambda x: x * 3)

    x = t(3)
    check_capture(Tens(), x, graphs=1, breaks=0)
    assert same(compile(Tens())(x), (x + 1) * 10)
    assert same(compile(Native())(x), x - 1)
    assert same(compile(Static())(x), x * 3)
    check_capture(nn.Sequential(Static(), Tens()), x, graphs=1, breaks=0)
