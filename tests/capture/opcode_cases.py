"""Small functions that, between them, make the running CPython emit every opcode the tracer
handles (tests/capture/test_opcodes.py runs them). A module of its own so that pytest's assert
rewriting leaves their bytecode as CPython compiles it.
"""
import io
import math

import torch

TOUCHED = []      # a global the cases store into
COUNT = 0


def helper(a, b=1.0, *, scale=2.0):
    return (a + b) * scale


def _gen(x, n):
    for i in range(n):
        yield x * i
    yield from (x + 1, x + 2)
    r = yield from _sub(x)
    yield x * r


def _sub(x):
    yield x - 1
    return 5


class _Ctx:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return 3

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


class _Base:
    def scale(self, x):
        return x * 2


class _Child(_Base):
    def scale(self, x):
        return super().scale(x) + 1


class _Box:
    pass


CHILD = _Child()


# ---- the cases: each f(x, n) with a tensor x and a small int n -------------------------------
def arith(x, n):
    y = (x + n) * (x - 1) / 2 - x ** 2 + (x // 3) % 2
    y += 1
    y @= torch.eye(x.shape[-1])
    return -y, +n, ~n, not n, abs(-n), n << 1 | 3 & n ^ 1, n >> 1


def compares(x, n):
    a = 0 < n < 5                    # COPY, SWAP
    b = x.shape[0] == 3 and n != 2
    c = n >= 2 or n <= -1
    d = (n is None, n is not None, n in (1, 2, 3), 7 not in [n])
    e = x > 0
    return a, b, c, d, e, x.sum() < 100


def branches(x, n, y=None):
    if n > 2:
        x = x + 1
    elif n == 2:
        x = x - 1
    else:
        x = x * 2
    if y is None:
        x = x * 3
    if y is not None:
        x = x + y
    if not n:
        return None
    return x if n else -x


def loops(x, n):
    acc = x
    for i in range(n):
        if i == 5:
            break
        if i % 2:
            continue
        acc = acc + i
    while n > 0:
        acc = acc * 1.5
        n -= 1
    k, done = 3, False
    while k:
        k -= 1
    while not done:
        done = k == 0
    for _ in range(2):
        pass
    while True:                      # a NOP on 3.11
        break
    for a, b in zip([x, x * 2], (1, 2)):
        acc = acc + a * b
    for i, t in enumerate(x.unbind(0)):
        acc = acc + t * i
    return acc


def maybe_unbound(x, n):
    if n > 1:
        y = x + 1
    else:
        y = x - 1
    z = y * 2
    del y
    if n > 100:
        w = 1
    return z, n > 100 and w


def containers(x, n):
    l = [x, n, *[1, 2], *(3,)]
    t = (*l[:2], 4)
    s = {n, 5, *{6, 7}}
    d = {"a": x, "b": n}
    d2 = {str(n): x, **d, "c": 1}
    l[1:3] = [8, 9]
    l[0] = x + 1
    del l[-1]
    first, *mid, last = l
    p, q = x.shape[0], n
    return l, t, sorted(s), d2, first, mid, last, p, q, l[::2], x[1:], x[::2]


def comprehensions(x, n):
    i = "outer"
    a = [x * i for i in range(n)]
    b = {i: i * 2 for i in range(n)}
    c = {i % 2 for i in range(n)}
    d = tuple(x + j for j in range(n))
    e = [[j * k for k in range(2)] for j in range(n)]
    return a, b, sorted(c), d, e, i


def strings(x, n):
    w = 6
    name = "v"
    return (f"{n}", f"{n!r:>5}", f"{n!s}{name!a}", f"{n:{w}}", f"{x.shape[0]:03d}-{name}", "%d" % n,
            f"{x.shape}", str(x.size()))   # torch.Size([4, 3]), not (4, 3)


def calls(x, n):
    args = (x, n)
    kw = {"scale": 3.0}
    return (helper(x), helper(x, 2.0), helper(x, scale=0.5), helper(*args), helper(*args, **kw),
            helper(x, b=n, **kw), x.sum(dim=0, keepdim=True), torch.cat([x, x], dim=0), math.sqrt(n),
            max(n, 3), (lambda v, k=2: v * k)(x))


def closures(x, n):
    count = 0

    def bump(by=1, *, times: int = 1) -> int:
        nonlocal count
        count += by * times
        return count

    def read():
        return count + n

    bump()
    bump(2, times=3)
    scale = lambda t: t * count  # noqa: E731
    return scale(x), read(), count


def globals_and_imports(x, n):
    global COUNT
    import math as m
    from math import pi
    COUNT = n * 2
    TOUCHED.append(n)
    return x * m.e + pi + COUNT


def attributes(x, n):
    b = _Box()
    b.v = x
    b.w = n
    del b.v
    b.w += 1
    return x * b.w, hasattr(b, "v"), CHILD.scale(x)


def generators(x, n):
    return list(_gen(x, n)), sum(_gen(x, 2)), [v for v in _gen(x, 1)][0]


def with_blocks(x, n):
    log = []
    with _Ctx(log) as k:
        y = x * k
    with torch.no_grad():
        z = x * 2
    return y, z, log, z.requires_grad


def returns_constant(x, n):
    if n > 0:
        return None
    return x


def asserts(x, n):
    assert x.dim() == 2, "a 2-d input"
    return x + n


def raises(x, n):
    if n > 3:
        raise ValueError(f"n too large: {n}")
    return x - n


# ---- cases with graph breaks: the resume paths (native steps) of each version -----------------
def break_in_comprehension(x, n):
    vals = [float(t) for t in x[:n]]     # float(t) breaks inside an (inlined) comprehension
    return x * sum(vals), vals


def break_on_branch(x, n):
    if x.sum() > 0:                      # COMPARE_OP (3.13: to bool), TO_BOOL, POP_JUMP_IF_*
        return x + n
    return x - n


def break_on_kw_call(x, n):
    buf = io.StringIO()
    print(n, "items", sep="-", end="|", file=buf)   # CALL_KW (3.13) / KW_NAMES (3.11, 3.12)
    return x + 1, buf.getvalue()


def break_in_loop(x, n):
    out = []
    for i in range(n):
        out.append(int(x[i % x.shape[0]] > 0))   # int(tensor) breaks; FOR_ITER resumes
    return out, x * len(out)


def break_then_closure(x, n):
    k = x.sum().item()

    def add(v, by=1):
        return v + by + k

    return add(x, by=n), f"{n:>3}", {**{"a": n}}, (*[n],)


CASES = [arith, compares, branches, loops, maybe_unbound, containers, comprehensions, strings, calls,
         closures, globals_and_imports, attributes, generators, with_blocks, returns_constant, asserts,
         raises]
BREAK_CASES = [break_in_comprehension, break_on_branch, break_on_kw_call, break_in_loop, break_then_closure]
HELPERS = [helper, _gen, _sub, _Ctx.__enter__, _Ctx.__exit__, _Child.scale]

# Opcodes we handle that a function body does not emit here: CACHE entries and EXTENDED_ARG (an
# argument over 255) are not instructions of their own; LOAD_CLASSDEREF is for class bodies;
# 3.11's POP_JUMP_BACKWARD_IF_NONE/NOT_NONE need a `while v is None` loop shape it rarely picks.
NOT_EMITTED = {"CACHE", "EXTENDED_ARG", "LOAD_CLASSDEREF", "POP_JUMP_BACKWARD_IF_NONE",
               "POP_JUMP_BACKWARD_IF_NOT_NONE"}
