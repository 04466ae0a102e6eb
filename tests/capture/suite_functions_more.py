"""The capture suite's functions, second part: classes, dataclasses, modules, context managers,
exceptions, NumPy and math, iterators, global state (the first part is suite_functions.py)."""
import collections
import collections.abc
import contextlib
import dataclasses
import math
import typing

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.capture.suite_functions import _LIN, V, X, Y, _helper, case

# ---------------------------------------------------------------- strings
@case(X)
def fstring_shape(x): return x * 2 if "4" in f"{x.shape[0]} rows" else x

@case(X, "abc")
def str_methods(x, s): return s.upper(), s.startswith("a"), s.replace("b", "x"), "-".join([s, s]), x

@case(X)
def str_format(x): return "{}-{:03d}".format("a", 7), "%s=%d" % ("n", 3), x

@case(X)
def str_split_strip(x): return " a, b ".strip().split(","), x

@case(X)
def str_concat_mult(x): return "ab" + "c" * 2, x

@case(X)
def str_in_membership(x): return x * 2 if "ell" in "hello" else x

@case(X)
def fstring_float_format(x): return f"{3.14159:.2f}|{x.dtype}", x

@case(X)
def str_isdigit(x): return x * int("12") if "12".isdigit() else x

@case(X)
def repr_str_of_constants(x): return str(3) + repr("a") + str(torch.float32), x

# ---------------------------------------------------------------- isinstance, types
@case(X)
def isinstance_tensor(x): return x * 2 if isinstance(x, torch.Tensor) else x

@case(X, 3)
def isinstance_tuple(x, n): return x * n if isinstance(n, (int, float)) else x

@case(X, (1, 2))
def isinstance_abc(x, seq): return x * len(seq) if isinstance(seq, collections.abc.Sequence) else x

@case(X)
def type_checks(x): return x + 1 if type(x) is torch.Tensor and type(3) is int else x

@case(X)
def callable_check(x): return x * 2 if callable(_helper) and not callable(3) else x

@case(X)
def issubclass_check(x): return x * 2 if issubclass(nn.Linear, nn.Module) else x

@case(X)
def hasattr_getattr(x):
    m = _LIN
    return x * 2 if hasattr(m, "weight") and getattr(m, "missing", None) is None else x

@case(X)
def torch_is_tensor(x): return x * 2 if torch.is_tensor(x) else x

def _annotated(x: torch.Tensor, n: typing.Optional[int] = None) -> torch.Tensor:
    return x * (n or 1)

@case(X)
def typing_annotations(x): return _annotated(x, 2)

@case(X)
def typing_cast(x): return typing.cast(torch.Tensor, x) + 1


# ---------------------------------------------------------------- classes, dataclasses, modules
class _Box:
    def __init__(self, v, scale=1):
        self.v = v
        self.scale = scale

    def value(self):
        return self.v * self.scale

    @property
    def doubled(self):
        return self.v * 2

    @staticmethod
    def stat(a):
        return a + 1

    @classmethod
    def make(cls, v):
        return cls(v, 3)


class _SubBox(_Box):
    def __init__(self, v):
        super().__init__(v, scale=5)

    def value(self):
        return super().value() + 1


@dataclasses.dataclass
class _Point:
    x: torch.Tensor
    y: int = 2

    def total(self):
        return self.x * self.y


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: int
    b: int = 3




@case(X)
def user_class_new(x): return _Box(x, 2).value()

@case(X)
def user_class_property(x): return _Box(x).doubled

@case(X)
def user_class_static_class_methods(x): return _Box.stat(x) + _Box.make(x).value()

@case(X)
def user_class_super(x): return _SubBox(x).value()

@case(X)
def user_class_returned(x):
    b = _Box(x, 4)
    return b.v, b.scale

@case(X)
def user_class_setattr(x):
    b = _Box(x)
    b.v = b.v + 1
    b.extra = 3
    return b.v * b.extra

@case(X)
def dataclass_new(x): return _Point(x).total() + _Point(x, y=3).total()

@case(X)
def dataclass_fields_replace(x):
    p = _Point(x)
    q = dataclasses.replace(p, y=5)
    return q.total(), [f.name for f in dataclasses.fields(p)]

@case(X)
def frozen_dataclass(x):
    f = _Frozen(2)
    return x * (f.a + f.b)

@case(_Point(X, 4))
def dataclass_input(p): return p.x * p.y

@case(_Box(X, 3))
def object_input_attrs(b): return b.value()

class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)
        self.scale = 0.5
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x))) * self.scale + self.offset


_MLP = _Mlp().eval()


@case(X)
def module_call(x): return _MLP(x)

@case(X)
def module_attributes(x): return x * _MLP.scale + _MLP.offset + _MLP.fc1.weight.sum()

@case(X)
def module_list_loop(x):
    for layer in _SEQ:
        x = layer(x)
    return x

@case(X)
def module_dict_access(x): return _MDICT["a"](x) + _MDICT["b"](x)

@case(X)
def module_children_iter(x):
    for m in _MLP.children():
        x = x + 0
    return x

@case(X)
def module_parameters_sum(x): return x + sum(p.sum() for p in _MLP.parameters())

@case(X)
def module_training_flag(x): return x * 2 if not _MLP.training else x

@case(X)
def sequential_indexing(x): return _SEQ[0](x) + _SEQ[-1](x)

@case(X)
def module_named_modules(x): return x * len([n for n, _ in _MLP.named_modules()])

_SEQ = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
_MDICT = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()})

# ---------------------------------------------------------------- context managers, exceptions
@case(X)
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + 1

@case(X)
def enable_grad_block(x):
    with torch.enable_grad():
        return x * 2

@torch.no_grad()
def _nograd_helper(x):
    return x * 3

@case(X)
def no_grad_decorator(x): return _nograd_helper(x)

@case(X)
def no_grad_decorator_inner(x):
    @torch.no_grad()
    def inner(y):
        return y + 1
    return inner(x)

@case(X)
def nullcontext_block(x):
    with contextlib.nullcontext():
        return x + 1

class _Ctx:
    def __init__(self):
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        return False


@case(X)
def user_context_manager(x):
    with _Ctx() as c:
        y = x * c.entered
    return y

@contextlib.contextmanager
def _scaled(k):
    yield k * 2

@case(X)
def contextmanager_generator(x):
    with _scaled(2) as k:
        return x * k

@contextlib.contextmanager
def _tracked(log, x):
    log.append("enter")
    try:
        yield x * 2
    finally:
        log.append("exit")

@case(X, [])
def contextmanager_try_finally(x, log):
    with _tracked(log, x) as y:
        log.append("body")
        z = y + 1
    return z, log

@case(X, [])
def contextmanager_nested(x, log):
    with _tracked(log, x) as a, _scaled(3) as k:
        with _tracked(log, a) as b:
            out = b * k
    return out, log

@contextlib.contextmanager
def _frozen():
    with torch.no_grad():
        yield

@case(X)
def contextmanager_around_no_grad(x):
    with _frozen():
        y = x * 2
        inside = torch.is_grad_enabled()
    return y, inside, torch.is_grad_enabled()

@case(X)
def try_except_no_raise(x):
    try:
        y = x + 1
    except ValueError:
        y = x
    return y

@case(X)
def try_finally(x):
    try:
        y = x * 2
    finally:
        z = 3
    return y + z

@case(X)
def try_except_else(x):
    try:
        y = x
    except KeyError:
        y = x * 0
    else:
        y = y + 1
    return y

@case(X)
def assert_shape(x):
    assert x.shape[0] == 4, "bad shape"
    return x + 1

@case(X)
def torch_assert_shape(x):
    torch._assert(x.dim() == 2, "need 2-d")
    return x * 2

# ---------------------------------------------------------------- numpy, math, constants
@case(X)
def numpy_scalar(x): return x * np.float32(2.0) + np.int64(1)

@case(X)
def numpy_finfo(x): return x.clamp(min=float(np.finfo(np.float32).min)) * np.iinfo(np.int8).max

@case(X)
def math_functions(x): return x * math.sqrt(16) + math.pi + math.floor(2.5) + math.log(math.e)

@case(X)
def torch_finfo(x): return x.clamp(min=torch.finfo(x.dtype).min) + torch.iinfo(torch.int8).max

@case(X)
def int_float_bool_casts(x): return x * int(2.7) + float("1.5") + bool(3)

@case(X)
def global_constant(x): return x * _SCALE

@case(X)
def grad_mode_query(x): return x * 2 if not torch.is_grad_enabled() else x - 1

@case(X)
def jit_is_scripting(x): return x + 1 if not torch.jit.is_scripting() else x - 1

@case(X)
def default_dtype(x): return x.to(torch.get_default_dtype())

_SCALE = 3.0

# ---------------------------------------------------------------- generators, iterators
@case(X)
def iter_next(x):
    it = iter([x, x * 2])
    return next(it) + next(it)

@case(X)
def next_default(x):
    it = iter([])
    return x if next(it, None) is None else x * 0

@case(X)
def genexpr_tuple(x): return tuple(x * i for i in range(3))

@case(X)
def genexpr_any(x): return x * 2 if any(i > 2 for i in range(4)) else x

def _gen(x):
    for i in range(3):
        yield x * i

@case(X)
def generator_function(x): return sum(_gen(x))

def _logging_gen(x, log):
    for i in range(3):
        log.append(("gen", i))
        yield x * i
    log.append("gen done")

@case(X, [])
def generator_interleaved_state(x, log):
    total = x
    for v in _logging_gen(x, log):
        log.append("body")
        total = total + v
    return total, log

def _counting(x, log):
    i = 0
    while True:
        log.append(i)
        yield x + i
        i += 1

@case(X, [])
def generator_early_break(x, log):
    out = []
    for v in _counting(x, log):
        if len(out) == 2:
            break
        out.append(v)
    return out, log

@case(X, [])
def generator_next_and_zip(x, log):
    g = _counting(x, log)
    first = next(g)
    pairs = list(zip(_gen(x), g))   # zip stops at _gen's end: g is advanced three times, not four
    return first, pairs, log

def _running(rows):
    acc = torch.zeros_like(rows[0])
    for r in rows:
        acc = acc + r
        yield acc

@case(X)
def generator_running_tensor(x): return torch.stack(list(_running(x.unbind(0))))

def _chained(x):
    total = yield from _gen(x)
    yield x - 1
    return total

@case(X)
def generator_yield_from_nested(x):
    def outer(y):
        yield from _chained(y)
        yield from (y * k for k in (5, 6))
    return [v + 1 for v in outer(x)]

@case(X)
def generator_closure_enumerate(x):
    scale = 3
    def g(n):
        for i in range(n):
            yield x * scale + i
    return [i * v for i, v in enumerate(g(3), start=1)], any(v.shape[0] == 4 for v in g(2))

@case(X)
def enumerate_start(x): return [x * i for i, _ in enumerate("ab", start=1)]

@case(X)
def zip_three(x): return [a + b + c for a, b, c in zip([x], [x], [x])]

@case(X)
def dict_items_sorted(x):
    d = {"b": 2, "a": 1}
    return [x * v for _, v in sorted(d.items())]

@case(X)
def reversed_range(x): return [x * i for i in reversed(range(3))]

# ---------------------------------------------------------------- global state, side effects
_COUNTER = {"n": 0}


@case(X)
def mutate_global_dict(x):
    _STATE["calls"] = _STATE.get("calls", 0)
    return x + 1

_STATE: dict = {}


@case(X, [])
def append_to_input_list(x, out):
    out.append(1)
    return x * len(out)

@case(X)
def module_attr_read_only(x): return x * _MLP.fc1.in_features

@case(X)
def object_attr_chain(x): return x * _OBJ.inner.k

class _Inner:
    k = 5


class _Outer:
    inner = _Inner()


_OBJ = _Outer()


@case(X)
def nested_data_structure(x):
    cfg = {"layers": [{"scale": 2}, {"scale": 3}]}
    for layer in cfg["layers"]:
        x = x * layer["scale"]
    return x

@case(X)
def tensor_in_list_of_tuples(x):
    pairs = [(x, 1), (x * 2, 2)]
    return sum(t * k for t, k in pairs)

@case(X)
def multiple_returns_structure(x): return {"out": [x, (x * 2, {"deep": x + 1})], "n": 3}

@case(X, Y)
def tensor_identity_checks(x, y): return x + 1 if x is not y else x

@case(X)
def int_tensor_ops(x): return (x * 10).long() // 3 % 5

@case(X)
def rounding_modes(x): return torch.div(x, 3, rounding_mode="floor"), x.round(decimals=1)

@case(X)
def random_free_init(x): return torch.full_like(x, 2.0) + torch.eye(4)

@case(X)
def tensor_method_chain_kwargs(x): return x.sum(dim=1, keepdim=True).expand(-1, 4).contiguous()

@case(X)
def masked_fill_tril(x): return x.masked_fill(torch.tril(torch.ones(4, 4, dtype=torch.bool)), 0.0)

@case(X)
def sdpa_call(x):
    q = x.view(1, 1, 4, 4)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)

@case(X)
def conv_pool(x):
    img = x.view(1, 1, 4, 4)
    return F.max_pool2d(F.conv2d(img, torch.ones(1, 1, 2, 2)), 2)

@case(X)
def embedding_lookup(x): return F.embedding(torch.tensor([0, 2]), x)

@case(X)
def norm_layers(x): return F.batch_norm(x, torch.zeros(4), torch.ones(4), training=False), F.normalize(x, dim=1)

@case(X)
def clone_detach(x): return x.detach().clone() + 1

@case(X)
def type_as_to_other(x): return x.type_as(torch.ones(1, dtype=torch.float64)), x.to(x)

@case(X)
def tensor_from_python_list(x): return x + torch.tensor([1.0, 2.0, 3.0, 4.0])

@case(X)
def unbind_loop(x): return [r * i for i, r in enumerate(x.unbind(1))]

@case(X)
def split_with_names(x):
    head, tail = x.split(2)
    return head * 2, tail
