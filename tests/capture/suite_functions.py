"""The capture suite's small functions, one construct each (the kinds Dynamo's own tests use).
Classes, modules, context managers, NumPy and the rest are in suite_functions_more.py.

``CASES`` maps a name to (function, args). Each function takes tensors and Python values and
returns tensors, numbers, strings or containers of them; test_suite150.py runs every one
eagerly, through minicompile.compile and through torch.compile.
"""
import collections
import functools
import itertools
import math
import operator
import typing

import torch
import torch.nn.functional as F
from torch import nn

CASES: dict = {}
_g = torch.Generator().manual_seed(0)
X = torch.randn(4, 4, generator=_g)
Y = torch.randn(4, 4, generator=_g)
V = torch.randn(8, generator=_g)


_Pair = collections.namedtuple("_Pair", ["a", "b"])


class _TPoint(typing.NamedTuple):
    x: torch.Tensor
    y: int


_LIN = nn.Linear(4, 4)


def case(*args):
    def register(fn):
        CASES[fn.__name__] = (fn, args)
        return fn
    return register


# ---------------------------------------------------------------- arithmetic, torch functions
@case(X, Y)
def add_mul(x, y): return x + y * 2

@case(X)
def unary_chain(x): return torch.relu(-x).exp().log1p()

@case(X, Y)
def matmul_op(x, y): return x @ y

@case(X)
def reductions(x): return x.sum(0), x.mean(1), x.amax(), x.std()

@case(X)
def softmax_dim(x): return F.softmax(x, dim=-1)

@case(X)
def inplace_ops(x):
    y = x.clone()
    y.add_(1).mul_(2)
    return y

@case(X)
def pow_scalar(x): return x ** 2 + 2 ** x.abs()

@case(X, 3.0)
def scalar_arg(x, s): return x * s + s

@case(X)
def where_clamp(x): return torch.where(x > 0, x, torch.zeros_like(x)).clamp(max=0.5)

@case(X, Y)
def cat_stack(x, y): return torch.cat([x, y]), torch.stack((x, y), 1)

@case(X)
def reshape_view(x): return x.reshape(2, 8).view(16).unsqueeze(0).squeeze()

@case(X)
def transpose_permute(x): return x.t().contiguous(), x.permute(1, 0), x.T

@case(X)
def chunk_split(x): return x.chunk(2), x.split([1, 3], dim=1)

@case(X)
def indexing(x): return x[0], x[:, 1], x[1:3, ::2], x[None, ..., 0]

@case(X)
def bool_mask_index_set(x):
    y = x.clone()
    y[y < 0] = 0
    return y

@case(X)
def setitem_slice(x):
    y = x.clone()
    y[:, 0] = 1.0
    return y

@case(X)
def new_tensors(x): return x.new_zeros(2), torch.ones(3, dtype=x.dtype), torch.arange(4) + 1

@case(X)
def dtype_conversions(x): return x.to(torch.float64), x.int(), x.half().float()

@case(X)
def comparisons(x): return x > 0, x.eq(x), (x >= 0) & (x <= 1)

@case(X)
def einsum_op(x): return torch.einsum("ij,jk->ik", x, x)

@case(X)
def functional_ops(x): return F.gelu(x), F.silu(x), F.layer_norm(x, (4,)), F.dropout(x, 0.5, training=False)

@case(X)
def topk_sort(x): return torch.topk(x, 2).values, torch.sort(x, dim=1)[0]

@case(X)
def max_with_indices(x):
    v, i = x.max(dim=1)
    return v, i

@case(X)
def cumsum_flip(x): return x.cumsum(0).flip(1)

@case(V)
def one_d_ops(v): return v.norm(), torch.outer(v, v).trace()

# ---------------------------------------------------------------- shapes and metadata
@case(X)
def shape_arith(x): return x.reshape(x.shape[0] * x.shape[1])

@case(X)
def size_dim(x): return x.view(x.size(0), -1).sum(dim=x.dim() - 1)

@case(X)
def numel_ndim(x): return x * (x.numel() + x.ndim)

@case(X)
def dtype_branch(x): return x + 1 if x.dtype == torch.float32 else x - 1

@case(X)
def device_branch(x): return x * 2 if x.device.type == "cpu" else x

@case(X)
def requires_grad_flag(x): return x.sin() if not x.requires_grad else x

@case(X)
def shape_unpack(x):
    a, b = x.shape
    return x.view(b, a) * a

@case(X)
def is_floating(x): return x * 2 if x.is_floating_point() else x

@case(X)
def torch_size_ops(x): return torch.zeros(x.shape[:1] + (2,))

@case(X)
def len_of_tensor(x): return x[: len(x) // 2]

# ---------------------------------------------------------------- control flow
@case(X, True)
def if_on_bool(x, flag): return x + 1 if flag else x - 1

@case(X, 3)
def for_range(x, n):
    for i in range(n):
        x = x * 0.5 + i
    return x

@case(X, 4)
def while_loop(x, n):
    i = 0
    while i < n:
        x = x + i
        i += 1
    return x

@case(X)
def break_continue(x):
    for i in range(10):
        if i % 2:
            continue
        if i > 5:
            break
        x = x + i
    return x

@case(X)
def for_else(x):
    for i in range(3):
        if i == 10:
            break
    else:
        x = x + 100
    return x

@case(X, None)
def none_check(x, y): return x if y is None else x + y

@case(X)
def nested_loops(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
    return x

@case(X)
def ternary_chain(x):
    n = x.shape[0]
    return x * (1 if n < 2 else 2 if n < 8 else 3)

@case(X, 2)
def early_return(x, n):
    if n > 1:
        return x * n
    return x

@case(X)
def loop_over_tensor(x):
    out = []
    for row in x:
        out.append(row.sum())
    return torch.stack(out)

@case(X, Y)
def enumerate_zip(x, y):
    total = 0
    for i, (a, b) in enumerate(zip(x, y)):
        total = total + a * b * i
    return total

@case(X)
def chained_comparison(x):
    n = x.shape[0]
    return x + 1 if 0 < n <= 4 else x

@case(X)
def walrus(x):
    if (n := x.shape[1]) > 2:
        return x * n
    return x

@case(X)
def and_or_values(x):
    a = None or 3
    b = 0 and 5
    return x * a + b

@case(X, "relu")
def string_dispatch(x, act):
    if act == "relu":
        return torch.relu(x)
    return torch.tanh(x)

@case(X)
def match_statement(x):
    match x.dim():
        case 1:
            return x
        case 2:
            return x.t()
        case _:
            return x * 0

# ---------------------------------------------------------------- closures and inlined calls
def _helper(a, b=2):
    return a * b

@case(X)
def call_helper(x): return _helper(x) + _helper(x, b=3)

@case(X)
def closure_read(x):
    k = 3
    def inner(y):
        return y * k
    return inner(x)

@case(X)
def closure_write(x):
    total = x
    def bump(y):
        nonlocal total
        total = total + y
    bump(x)
    bump(x)
    return total

@case(X)
def lambda_call(x): return (lambda t, s=2: t * s)(x)

@case(X)
def nested_functions(x):
    def outer(y):
        def inner(z):
            return z + 1
        return inner(y) * 2
    return outer(x)

@case(X)
def recursion_bounded(x):
    def rec(y, n):
        return y if n == 0 else rec(y + 1, n - 1)
    return rec(x, 3)

def _varargs(*args):
    return sum(args)

@case(X, Y)
def star_args(x, y): return _varargs(x, y, x)

def _kw(**kwargs):
    return kwargs["a"] * kwargs.get("b", 1)

@case(X)
def star_kwargs(x): return _kw(a=x, b=2)

def _forward_kwargs(x, **kwargs):
    return _helper(x, **kwargs)

@case(X)
def kwargs_forwarding(x): return _forward_kwargs(x, b=5)

@case(X, Y)
def unpack_call(x, y):
    args = (x, y)
    return torch.add(*args), _helper(*[x], **{"b": 4})

def _kwonly(x, *, scale=1.0):
    return x * scale

@case(X)
def keyword_only(x): return _kwonly(x, scale=3.0)

def _defaults(x, a=1, b=2, *rest, c=3, **kw):
    return x * a + b + c + len(rest) + len(kw)

@case(X)
def mixed_signature(x): return _defaults(x, 2, 3, 4, 5, c=1, d=0)

@case(X)
def global_function_reference(x): return math.sqrt(4) * x

@case(X)
def operator_module(x): return operator.add(x, 1), operator.mul(2, 3), operator.getitem((1, 2), 0)

@case(X)
def functools_partial(x): return functools.partial(_helper, b=7)(x)

@case(X)
def functools_reduce(x): return functools.reduce(operator.add, [x, x, x])

def _wrapped_decorator(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k) + 1
    return wrapper

@_wrapped_decorator
def _decorated(x):
    return x * 2

@case(X)
def functools_wraps(x): return _decorated(x)

@functools.lru_cache(maxsize=None)
def _cached_const(n):
    return n * n

@case(X)
def lru_cache_const(x): return x * _cached_const(3)

@case(X)
def map_filter(x): return sum(map(lambda t: t * 2, filter(lambda t: t is not None, [x, None, x])))

@case(X)
def sorted_reversed(x): return [x * v for v in sorted([3, 1, 2])] + [x * v for v in reversed([1, 2])]

@case(X)
def any_all(x):
    flags = [x.shape[0] > 1, True]
    return x * 2 if all(flags) and any([False, True]) else x

@case(X)
def min_max_builtins(x): return x * max(2, 3) + min([4, 5])

@case(X)
def abs_round_divmod(x): return x * abs(-2) + round(2.6) + divmod(7, 2)[0]

@case(X)
def itertools_product(x):
    out = x
    for a, b in itertools.product(range(2), range(2)):
        out = out + a * b
    return out

@case(X)
def itertools_chain(x): return sum(itertools.chain([x], [x * 2]))

@case(X)
def itertools_accumulate(x): return [x * v for v in itertools.accumulate([1, 2, 3])]

@case(X)
def itertools_pairwise(x): return [x * a + b for a, b in itertools.pairwise([1, 2, 3])]

# ---------------------------------------------------------------- containers
@case(X, Y)
def build_dict(x, y):
    d = {"a": x, "b": y}
    d["c"] = d["a"] + d["b"]
    return d

@case(X)
def dict_methods(x):
    d = {"a": x}
    d.update(b=x * 2)
    d.setdefault("c", x * 3)
    return d.get("b"), d.pop("a"), list(d.keys()), len(d)

@case({"a": X, "b": Y})
def dict_input(d): return d["a"] + d["b"]

@case(X)
def dict_iteration(x):
    d = {"a": 1, "b": 2}
    out = x
    for k, v in d.items():
        out = out + v
    return out, [k for k in d]

@case(X)
def dict_views_live(x):
    d = {"a": x}
    keys, values = d.keys(), d.values()
    d["b"] = x * 2
    return list(keys), sum(values)

@case(X)
def dict_comprehension(x): return {f"k{i}": x * i for i in range(3)}

@case(X)
def dict_fromkeys(x):
    d = dict.fromkeys(["a", "b"], 0)
    d["a"] = x
    return d

@case(X)
def ordered_dict(x):
    d = collections.OrderedDict()
    d["z"] = x
    d["a"] = x * 2
    d.move_to_end("z")
    return list(d.keys()), d["a"]

@case(X)
def defaultdict_use(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(x * 2)
    return d["a"]

@case(X)
def deque_use(x):
    q = collections.deque([x])
    q.append(x * 2)
    q.appendleft(x * 3)
    return q.popleft() + q.pop()

@case(X)
def dict_keyed_by_module(x):
    lin = _LIN
    d = {lin: 2}
    return x * d[lin]

@case(X)
def dict_merge_ops(x):
    a = {"x": x}
    b = {**a, "y": x * 2}
    return a | b

@case(X, Y)
def list_ops(x, y):
    lst = [x]
    lst.append(y)
    lst.extend([x, y])
    lst.insert(0, y)
    lst.pop()
    return lst[::-1], len(lst)

@case(X)
def list_comprehension(x): return [x * i for i in range(3) if i != 1]

@case(X)
def nested_comprehension(x): return [[x * i * j for j in range(2)] for i in range(2)]

@case(X)
def genexpr_sum(x): return sum(x * i for i in range(4))

@case(X)
def tuple_unpack_star(x):
    a, *rest = (x, x * 2, x * 3)
    return a + sum(rest)

@case(X)
def list_slice_assign(x):
    lst = [1, 2, 3, 4]
    lst[1:3] = [x, x]
    return lst

@case(X)
def in_operator(x):
    names = ["a", "b"]
    return x * 2 if "a" in names and "c" not in names else x

@case(X)
def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    return x * len(s | {9}) + (2 in s)

@case(X)
def frozenset_ops(x):
    fs = frozenset(["a", "b"])
    return x * len(fs & {"a"})

@case(X)
def set_comprehension(x): return x * len({i % 3 for i in range(10)})

@case(X)
def namedtuple_use(x):
    pair = _Pair(x, x * 2)
    a, b = pair
    return pair.a + pair.b, pair[0] * a, b, pair._fields, pair._replace(a=x), _Pair._make([x, 1])

@case(X)
def namedtuple_return(x): return _Pair(x, x + 1)

@case(X)
def typing_namedtuple(x):
    p = _TPoint(x, 2)
    return p.x * p.y

@case(X)
def zip_strict_lengths(x): return [a * b for a, b in zip([x, x], [1, 2])]

@case(X)
def list_sort_key(x):
    items = [("b", 2), ("a", 1)]
    items.sort(key=lambda kv: kv[1])
    return x * items[0][1], [k for k, _ in items]

@case(X)
def list_index_count(x):
    lst = [1, 2, 2, 3]
    return x * lst.index(3) + lst.count(2)

@case(X)
def tuple_concat_repeat(x): return ((x,) + (x * 2,)) * 2

@case(X)
def range_features(x):
    r = range(1, 10, 3)
    return x * len(r) + r[1] + (4 in r)

@case(X)
def slice_object(x):
    s = slice(1, 3)
    return x[s], x[:, s]

@case(X)
def del_statements(x):
    d = {"a": x, "b": 1}
    del d["b"]
    lst = [x, x]
    del lst[0]
    return d, lst
