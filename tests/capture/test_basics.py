"""Functions over tensors and Python values: one graph each, equal to eager."""
from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import check_capture

SCALE = 3.0


def helper_add(a, b=1.0):
    return a + b


def helper_kw(x, *, alpha=2.0):
    return x * alpha


def t(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(shape) + 7)
    return torch.randn(*shape, generator=g).to(dtype)


# ---- each case: (function, args), expecting exactly one graph and no breaks ----------
def f_arith(x, y):
    return (x + y) * (x - y) / 2 - x ** 2 + (-y) @ x.T


def f_torch_funcs(x):
    return torch.cat([torch.sin(x), torch.exp(x).clamp(max=2.0), torch.tanh(x)], dim=1)


def f_tensor_methods(x):
    return x.view(2, -1).permute(1, 0).contiguous().sum(dim=1, keepdim=True).relu()


def f_attrs(x):
    n, c = x.shape
    assert x.ndim == 2 and x.dim() == 2
    return x.reshape(c, n) * x.size(0) + x.size()[1] + (1.0 if x.dtype == torch.float32 else 0.0)


def f_device_dtype(x):
    return torch.ones(x.shape, device=x.device, dtype=x.dtype) + x.to(torch.float64).float()


def f_tuple_out(x):
    return x + 1, (x * 2, [x - 1, 3]), "tag"


def f_dict_out(x):
    return {"a": x.sin(), "b": x.cos(), "n": x.numel()}


def f_list_ops(x):
    xs = [x, x * 2]
    xs.append(x * 3)
    xs.extend([x + 1])
    xs.insert(0, x - 1)
    return sum(xs[1:]) + xs[0] + len(xs)


def f_dict_ops(x):
    d = {"a": x, "b": x * 2}
    d["c"] = d["a"] + d.get("b")
    d.update(e=x + 4)
    return [v for k, v in sorted(d.items()) if k != "a"]


def f_range_loop(x):
    for i in range(3):
        x = x + i
    for i in range(10, 0, -4):
        x = x * (i / 10)
    return x


def f_enumerate_zip(x, y):
    out = 0
    for i, (a, b) in enumerate(zip([x, y], [y, x])):
        out = out + (i + 1) * a * b
    return out


def f_slices(x):
    return x[1:, ::2] + x[:-1, 1::2], x[..., 0], x[None, 0], x[[0, 1]]


def f_closure(x):
    k = 2.0

    def inner(y):
        return y * k + SCALE

    return inner(x) + inner(x * 2)


def f_nested_closure_write(x):
    acc = []

    def push(v):
        acc.append(v)

    push(x)
    push(x + 1)
    return torch.stack(acc)


def f_globals_and_helpers(x):
    return helper_add(x) + helper_add(x, b=SCALE) + helper_kw(x, alpha=0.5)


def f_builtins(x):
    a = max(1, 2, 3) + min([4, 5]) + abs(-2) + round(2.6) + int("3") + float(2)
    b = isinstance(x, torch.Tensor) and not isinstance(x, (list, dict)) and callable(helper_add)
    c = getattr(x, "shape")[0] + hasattr(x, "shape") + len((1, 2, 3))
    return x * a + b + c + sum([1, 2]) + any([0, 1]) + all([1, 1])


def f_operator_math(x):
    a = operator.mul(x, 2) + operator.add(1, 2)
    b = math.sqrt(16) + math.floor(2.7) + math.pi + math.log(math.e)
    return operator.getitem(a, 0) * b + operator.neg(x)


def f_star_args(x, *rest, scale=1.0, **extra):
    total = x
    for r in rest:
        total = total + r
    return total * scale + extra.get("bias", 0)


def f_call_star(x, y):
    args = (x, y)
    kw = {"scale": 2.0}
    return f_star_args(*args, **kw) + helper_add(*[x], **{"b": 3.0})


def f_unpacking(x):
    a, *rest, b = [x, x + 1, x + 2, x + 3]
    (c, d), e = (rest[0], rest[1]), b
    return a + c + d + e


def f_comprehensions(x):
    sq = [x * i for i in range(3) if i != 1]
    dd = {i: x + i for i in range(2)}
    return torch.stack(sq).sum(0) + dd[1] + sum(x * v for v in [1, 2][:0]) if False else torch.stack(sq).sum(0) + dd[1]


def f_while_loop(x):
    i = 0
    while i < 4:
        x = x * 1.5
        i += 1
    return x


def f_if_python_values(x, flag, mode="sum"):
    if flag:
        x = x + 1
    if mode == "sum":
        return x.sum()
    return x.mean()


def f_shape_control_flow(x):
    if x.shape[0] > 2:
        return x[:2]
    return x


def f_inplace(x):
    y = x.clone()
    y.add_(1)
    y[0] = 0.0
    y *= 2
    return y


def f_functional(x):
    return F.softmax(F.gelu(x), dim=-1) + F.layer_norm(x, x.shape[-1:])


def f_tensor_iter(x):
    rows = [r * (i + 1) for i, r in enumerate(x)]
    a, b = x[:2]
    return torch.stack(rows) + a + b


def f_fstring_and_str(x):
    name = f"layer_{x.shape[0]}_{'a' + 'b'}"
    return x * len(name)


def f_method_descriptor(x):
    return torch.Tensor.add(x, 1) + torch.Tensor.mul(x, 2)


def f_return_input(x, y):
    return x, y.shape


def f_namedtuple_result(x):
    m = x.max(dim=1)
    return m.values + m.indices, torch.split(x, 2, dim=1)


def f_lambda(x):
    fn = lambda v, k=2: v * k  # noqa: E731
    return fn(x) + fn(x, k=3)


def f_none_default(x, bias=None):
    if bias is None:
        bias = 0.5
    return x + bias


def f_chained_compare(x):
    n = x.shape[0]
    return x * (1 if 0 < n <= 4 else 2)


def f_tuple_index_loop(x):
    pairs = ((1, 2.0), (3, 4.0))
    for a, b in pairs:
        x = x * a + b
    return x


def f_reversed_sorted(x):
    out = []
    for i in reversed(sorted([3, 1, 2])):
        out.append(x * i)
    return out


def f_int_float_ops(x):
    a = 7 // 2 + 7 % 3 + 2 ** 3 + (5 & 3) + (5 | 2) + (1 << 3) - (~1)
    return x + a


CASES = [
    (f_arith, (t(3, 3), t(3, 3))),
    (f_torch_funcs, (t(2, 3),)),
    (f_tensor_methods, (t(2, 3),)),
    (f_attrs, (t(2, 3),)),
    (f_device_dtype, (t(2, 3),)),
    (f_tuple_out, (t(4),)),
    (f_dict_out, (t(4),)),
    (f_list_ops, (t(4),)),
    (f_dict_ops, (t(4),)),
    (f_range_loop, (t(4),)),
    (f_enumerate_zip, (t(3), t(3))),
    (f_slices, (t(3, 4),)),
    (f_closure, (t(4),)),
    (f_nested_closure_write, (t(4),)),
    (f_globals_and_helpers, (t(4),)),
    (f_builtins, (t(4),)),
    (f_operator_math, (t(4),)),
    (f_call_star, (t(4), t(4))),
    (f_unpacking, (t(4),)),
    (f_comprehensions, (t(4),)),
    (f_while_loop, (t(4),)),
    (f_shape_control_flow, (t(5, 2),)),
    (f_inplace, (t(4),)),
    (f_functional, (t(2, 5),)),
    (f_tensor_iter, (t(3, 2),)),
    (f_fstring_and_str, (t(4),)),
    (f_method_descriptor, (t(4),)),
    (f_namedtuple_result, (t(3, 4),)),
    (f_lambda, (t(4),)),
    (f_chained_compare, (t(3),)),
    (f_tuple_index_loop, (t(3),)),
    (f_reversed_sorted, (t(3),)),
    (f_int_float_ops, (t(3),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_single_graph(fn, args):
    check_capture(fn, *args, graphs=1, breaks=0)


def test_star_args_and_kwargs():
    check_capture(f_star_args, t(3), t(3), t(3), scale=2.0, bias=1.0, graphs=1, breaks=0)


@pytest.mark.parametrize("flag,mode", [(True, "sum"), (False, "mean")])
def test_python_value_branches(flag, mode):
    check_capture(f_if_python_values, t(4), flag, mode=mode, graphs=1, breaks=0)


@pytest.mark.parametrize("bias", [None, 2.0])
def test_none_default(bias):
    check_capture(f_none_default, t(4), bias, graphs=1, breaks=0)


def test_return_input_makes_no_graph():
    check_capture(f_return_input, t(2), t(3), graphs=0, breaks=0)


def test_int_dtype_and_bool_ops():
    def f(x, m):
        return (x * 2) & 7, m | (x > 3), x.float().mean()
    check_capture(f, torch.arange(6), torch.tensor([True, False, True, False, True, False]), graphs=1, breaks=0)


def fact(n, x):
    return x if n == 0 else fact(n - 1, x * 2)


def f_recursion(x):
    return fact(3, x)


def f_sdpa(x):
    q = x.view(1, 1, *x.shape)
    return F.scaled_dot_product_attention(q, q, q)


def f_factories(x):
    y = x.new_zeros(x.shape) + torch.arange(x.shape[-1], dtype=x.dtype)
    return y.masked_fill(y > 1, 0.0).to(torch.float16)


def f_reductions(x, y):
    return torch.where(x > y, x, y), torch.maximum(x, y), x.max(), x.argmax(-1)


def f_iter_next(x):
    it = iter([x, x * 2])
    a = next(it)
    return a + next(it) + next(it, 0)


def f_shape_loop_index(x):
    s = 0
    for i in range(x.shape[0]):
        if i % 2:
            s = s + x[i]
    return s


def f_bool_mask_setitem(x):
    y = x.clone()
    y[y < 0] = 0
    return y


MORE_CASES = [
    (f_recursion, (t(3),)),
    (f_sdpa, (t(4, 8),)),
    (f_factories, (t(2, 3),)),
    (f_reductions, (t(3), t(3))),
    (f_iter_next, (t(3),)),
    (f_shape_loop_index, (t(5),)),
    (f_bool_mask_setitem, (t(5),)),
]


@pytest.mark.parametrize("fn,args", MORE_CASES, ids=[c[0].__name__ for c in MORE_CASES])
def test_single_graph_more(fn, args):
    check_capture(fn, *args, graphs=1, breaks=0)


class Cfg:
    k = 2.0


CFG = Cfg()


def f_global_object_attr(x):
    return x * CFG.k


def test_global_object_attribute_guarded():
    from minicompile.capture import compile
    cf = compile(f_global_object_attr)
    x = torch.ones(2)
    assert torch.equal(cf(x), x * 2.0)
    CFG.k = 5.0
    try:
        assert torch.equal(cf(x), x * 5.0)
        assert cf.capture_report.compile_count == 2
    finally:
        CFG.k = 2.0
