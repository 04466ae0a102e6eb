"""The building blocks of ``fuzz_py``'s random Python programs.

A program is the fixed ``PRELUDE`` (module-level classes, helpers and mutable globals) and one
function ``program(x, y, lst, dct, obj, opt=None)`` whose body is a few random *blocks*. Every
block reads and writes the same small set of names -- ``acc`` (a tensor shaped like ``x``), ``n``
(a Python int), ``out`` (a list of results) and the arguments -- so blocks compose in any order.
A block is a function ``(rng) -> list of source lines``; its random choices pick methods,
argument forms and constants, so one block covers many programs. Blocks never make results that
differ between two CPython runs (no ``id()`` values, no sets of tensors, no reprs of objects).
"""
from __future__ import annotations

PRELUDE = '''\
import collections
import contextlib
import copy
import dataclasses
import functools
import itertools
import math
import numpy as np
import torch

G_LOG = []
G_STATE = {"calls": 0}
G_N = 0
SCALE = 3
Point = collections.namedtuple("Point", "a b")
P12 = Point(1, 2)


class FuzzError(Exception):
    pass


@dataclasses.dataclass
class Box:
    t: object
    k: int = 1

    def total(self):
        return self.t * self.k


class Positive:
    """A data descriptor: reads return abs(stored), writes store the value."""
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, inst, owner=None):
        if inst is None:
            return self
        return abs(getattr(inst, self.name))

    def __set__(self, inst, value):
        setattr(inst, self.name, value)


class Registry(type):
    def __new__(mcs, name, bases, ns):
        ns.setdefault("tag", name.lower())
        return super().__new__(mcs, name, bases, ns)


class Acc(metaclass=Registry):
    shared = 2
    level = Positive()

    def __init__(self, w, k):
        self.w = w
        self.k = k
        self.level = k - 1

    @property
    def double(self):
        return self.w * 2

    def scale(self, t):
        return t * self.k + self.w

    @staticmethod
    def twice(v):
        return v * 2

    @classmethod
    def make(cls, w):
        return cls(w, 2)


class Bag:
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __contains__(self, v):
        return v in self.items

    def __getitem__(self, i):
        return self.items[i]

    def __getattr__(self, name):
        return name.upper()

    def __eq__(self, other):
        return len(self) == len(other)

    __hash__ = None


class Ctx:
    def __init__(self, k):
        self.k = k

    def __enter__(self):
        G_LOG.append(("in", self.k))
        return self

    def __exit__(self, *exc):
        G_LOG.append(("out", exc[0] is None))
        return False


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        G_LOG.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


@logged
def shifted(t, k=1):
    return t + k


@functools.lru_cache(maxsize=None)
def fib(k):
    return k if k < 2 else fib(k - 1) + fib(k - 2)


def make_inputs(seed, shape, opt_kind=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    y = torch.randn(shape, generator=g)
    lst = [torch.randn(shape, generator=g), seed % 5, "s"]
    dct = {"a": torch.randn(shape, generator=g), "b": seed % 7}
    obj = Acc(torch.randn(shape, generator=g), seed % 3 + 1)
    opt = [None, seed % 4, torch.randn(shape, generator=g), "opt"][opt_kind]
    return x, y, lst, dct, obj, opt
'''

GLOBALS = ("G_LOG", "G_STATE", "G_N")     # compared after every call, with the arguments


def _pick(rng, items, lo=1, hi=None):
    """A random non-empty ordered subset of ``items``."""
    hi = min(hi or len(items), len(items))
    return rng.sample(items, rng.randint(min(lo, hi), hi))


def _appends(rng, reads, most):
    """1 to ``most`` of ``reads``, each appended to the program's ``out`` list (what CPython and we compare)."""
    return [f"out.append({r})" for r in _pick(rng, reads, 1, most)]


def block_list(rng):
    lines = ['l = [acc, n, "s"]']
    ops = ["l.append(y)", 'l.insert({i}, "foo")', "l.extend([n + 1, x])", "l.pop({i})", "l.reverse()",
           'l.remove("s")', "l[{i}] = n * 2", "l += [7]", "l = l * 2", "l.extend(range(2))",
           "del l[{i}]", "l[1:2] = [9, 8]", "l.insert(-1, acc + 1)"]
    for op in _pick(rng, ops, 2, 6):
        lines.append(op.format(i=rng.randint(-2, 2)))
    reads = ["len(l)", "l[{i}]", "l[-1]", "l[1:]", "l.count(7)", "l.index(\"foo\") if \"foo\" in l else -1",
             "[v for v in l if isinstance(v, int)]", "type(l[0]).__name__", "l[::2]"]
    lines += [f"out.append({r.format(i=rng.randint(-2, 2))})" for r in _pick(rng, reads, 1, 3)]
    return lines


def block_dict(rng):
    init = rng.choice(['d = {"a": acc, "b": n}', "d = dict(a=acc, b=n)", 'd = dict([("a", acc), ("b", n)])',
                       'd = dict({"a": acc}, b=n)', 'd = dict.fromkeys(["a", "b"], n)',
                       'd = dict(zip(["a", "b"], [acc, n]))', 'd = {k: v for k, v in [("a", acc), ("b", n)]}'])
    ops = ['d.update([("c", y), ("e", 1)])', "d.update(c=x, f=2)", 'd.update({"g": n})',
           'd.update((("h", 3),), i=4)', 'd.setdefault("a", 0)', 'd.setdefault("z", [])',
           'd.pop("b")', 'd.pop("zz", None)', 'd["q"] = d.get("q", 0) + 1', 'del d["a"]',
           'd |= {"m": 5}', 'd = d | {"n": 6}', "d.popitem()", 'd = {**d, "w": 1}', "d = d.copy()",
           'd.update(dct)']
    lines = [init] + _pick(rng, ops, 2, 6)
    reads = ["list(d)", "sorted(d)", "len(d)", '"a" in d', "list(d.values())", "list(d.items())[-1]",
             'd.get("b", -1)', "[k for k in d.keys()]", "list(reversed(d))", 'd["missing"]', "next(iter(d))"]
    lines += _appends(rng, reads, 3)
    return lines


def block_set(rng):
    lines = [rng.choice(["s = {n, 1, 2}", "s = set([n, 3])", "s = set(range(n + 2))", 's = {"a", "b"}',
                         "s = {v % 4 for v in range(6)}", "s = set()"])]
    ops = ["s.add(5)", "s.discard(1)", "s |= {7, 8}", "s &= {1, 2, 5, 7}", "s -= {2}", "s = s ^ {1, 9}",
           "s.update([4, 4])", "s.remove(99)", "s = s | frozenset({0})", "s.pop() if s else None"]
    lines += _pick(rng, ops, 1, 4)
    reads = ["sorted(s, key=str)", "len(s)", "5 in s", "s <= {0, 1, 2, 3, 4, 5, 7, 8, 9}", "s.isdisjoint({1})",
             "sorted(frozenset(s), key=str)", "sum(v for v in s if isinstance(v, int))"]
    lines += _appends(rng, reads, 3)
    return lines


def block_namedtuple(rng):
    lines = ["p = Point(acc, n)"]
    ops = ["p = p._replace(b=p.b + 1)", "a, b = p", "p = Point._make([p.b, p.a])", "p = Point(b=n, a=y)",
           "p = Point(*p)"]
    lines += _pick(rng, ops, 1, 3)
    reads = ["p[1]", "len(p)", "Point._fields", "list(p._asdict())", "p.a", "isinstance(p, tuple)", "p",
             "type(p).__name__", "tuple(p)[0]", "p == p"]
    lines += _appends(rng, reads, 3)
    return lines


def block_deque(rng):
    lines = [rng.choice(["q = collections.deque([acc, n])", "q = collections.deque(maxlen=3)",
                         'q = collections.deque("ab")', "q = collections.deque([1, 2, 3, 4], 3)"])]
    ops = ["q.append(y)", "q.appendleft(n)", 'q.insert(0, "foo")', "q.extend([x, 5])", "q.extendleft([1, 2])",
           "q.pop()", "q.popleft()", "q.rotate(1)", "q.rotate(-2)", "q.clear()", "q[0] = 7", "q.reverse()",
           "q.remove(5)"]
    lines += _pick(rng, ops, 2, 6)
    reads = ["list(q)", "len(q)", "q.maxlen", 'q.count("foo")', "q[-1]", "[type(v).__name__ for v in q]"]
    lines += _appends(rng, reads, 3)
    return lines


def block_defaultdict(rng):
    lines = [rng.choice(["dd = collections.defaultdict(list)", "dd = collections.defaultdict(int)",
                         "dd = collections.defaultdict(lambda: acc)", "dd = collections.defaultdict(None)"])]
    ops = ['dd["k"]', 'dd.setdefault("m", 3)', 'dd["p"] = n', 'dd.get("q", 0)', "dd.update(a=1)",
           'dd.pop("k", None)', 'dd.setdefault("k")', 'dd["z"] = dd["k"] if "k" in dd else 0',
           "dd = copy.copy(dd)"]
    lines += _pick(rng, ops, 1, 4)
    reads = ["sorted(dd)", "len(dd)", "dd.default_factory is None", 'dd.get("p", -1)', "dict(dd)"]
    lines += _appends(rng, reads, 2)
    return lines


def block_ordereddict(rng):
    lines = ['od = collections.OrderedDict([("a", acc), ("b", n), ("c", 3)])']
    ops = ['od.move_to_end("a")', 'od.move_to_end("c", last=False)', "od.popitem(last=False)", "od.popitem()",
           'od["d"] = y', 'od.update(e=1)', 'od.setdefault("f", 2)', "od = collections.OrderedDict(reversed(od.items()))",
           'od.pop("b")']
    lines += _pick(rng, ops, 1, 4)
    reads = ["list(od)", "list(od.keys())[0]", "len(od)", "od == dict(od)", "list(od.values())[-1]"]
    lines += _appends(rng, reads, 2)
    return lines


def block_counter(rng):
    lines = [rng.choice(['c = collections.Counter("abcab")', "c = collections.Counter([n, n, 1])",
                         "c = collections.Counter(a=n, b=2)", "c = collections.Counter({'x': 1, 'y': n})"])]
    ops = ['c.update("aab")', "c.update({'a': 2})", 'c.subtract("b")', "c = c + collections.Counter(a=1)",
           "c['q'] += 1", "c.update([n])", "c = c - collections.Counter(b=1)"]
    lines += _pick(rng, ops, 1, 3)
    reads = ["c.most_common(2)", 'c["zz"]', "sorted(c.items(), key=str)", "c.total()", "sorted(c.elements(), key=str)",
             "len(c)"]
    lines += _appends(rng, reads, 2)
    return lines


def block_numpy(rng):
    lines = [rng.choice(["a = acc.numpy()", "a = acc.detach().numpy()", "a = np.asarray(y)", "a = x.numpy().copy()"])]
    ops = ["a = a * 2", "a = a.transpose(1, 0)", "a = a.reshape([1, a.size])", "a = np.abs(a) + 1",
           "a = a.max(axis=0)", "a = np.concatenate([a, a], axis=0)", "a = a.copy()", "a = a.astype(np.float64)",
           "a = np.where(a > 0, a, 0.0)", "a = a.sum(axis=-1, keepdims=True)"]
    lines += _pick(rng, ops, 1, 3)
    reads = ["a", "a.shape", "float(a.sum())", "a.ndim", "bool(a.all())", "torch.from_numpy(np.ascontiguousarray(a))",
             "a.dtype.name", "int((a > 0).sum())"]
    lines += _appends(rng, reads, 3)
    if rng.random() < 0.3:
        lines.append("acc = acc + torch.as_tensor(a).sum()")
    return lines


def block_closure(rng):
    k = rng.randint(1, 3)
    form = rng.randint(0, 3)
    if form == 0:
        return ["def mk(k):", "    def inner(t):", "        return t * k + n", "    return inner",
                f"f = mk({k})", "acc = f(acc)"]
    if form == 1:
        return ["def counter():", "    c = 0", "    def inc():", "        nonlocal c", "        c += 1",
                "        return c", "    return inc", "inc = counter()", "inc()", "n = n + inc()"]
    if form == 2:
        return [f"g = lambda t, m={k}: t - m", "acc = g(acc)", "out.append(g(n))",
                "out.append(sorted([3, 1, n], key=lambda v: -v))"]
    return ["hits = []", "def note(v):", "    hits.append(v)", "    return v", "acc = note(acc) + note(y)",
            "out.append(len(hits))"]


def block_generator(rng):
    form = rng.randint(0, 4)
    lines = ["def gen(t, m):", "    for i in range(m):", "        yield t * i"]
    if form == 0:
        lines.append(f"acc = acc + sum(gen(y, {rng.randint(1, 3)}))")
    elif form == 1:
        lines += ["it = gen(acc, 3)", "next(it)", "acc = next(it)", "out.append(next(it, None) is None)"]
    elif form == 2:
        lines += ["def outer():", "    yield n", "    yield from gen(x, 2)", "    return 5",
                  "vals = list(outer())", "out.append(len(vals))", "acc = acc + vals[-1]"]
    elif form == 3:
        lines += ["acc = acc + sum(v * 2 for v in [x, y])", "out.append(list(v + 1 for v in range(n)))"]
    else:
        lines += ["it = iter([acc, n])", "out.append(next(it) is acc)", "out.append(next(it))",
                  "out.append(next(it, 'done'))"]
    return lines


def block_comprehension(rng):
    forms = ["out.append([i * n for i in range(3) if i != 1])",
             "out.append({str(i): i for i in range(n + 1)})",
             "out.append({i % 2 for i in range(4)})",
             "acc = acc + sum([t * i for i, t in enumerate([x, y])])",
             "out.append([[j for j in range(i)] for i in range(3)])",
             "out.append([(a, b) for a in range(2) for b in 'xy'])",
             "acc = torch.stack([t.sum(0) for t in (acc, y)]).sum(0) + acc"]
    return _pick(rng, forms, 1, 3)


def block_exception(rng):
    form = rng.randint(0, 6)
    if form == 0:
        return ["try:", "    raise ValueError(\"bad %d\" % n)", "except ValueError as e:",
                "    out.append(str(e))", "finally:", "    acc = acc + 1"]
    if form == 1:
        return ["try:", '    v = dct["nope"]', "except KeyError as e:", "    out.append(repr(e))",
                "    v = n", "else:", "    v = -1", "out.append(v)"]
    if form == 2:
        return ["try:", "    out.append([1, 2][n])", "except IndexError:", "    out.append('idx')"]
    if form == 3:
        return [f"if n > {rng.randint(0, 4)}:", '    raise FuzzError("n is %d" % n)']
    if form == 4:
        return ["try:", "    try:", "        1 / (n - n)", "    finally:", "        out.append('inner')",
                "except ZeroDivisionError as e:", "    out.append(type(e).__name__)"]
    if form == 5:
        return ["try:", "    obj.missing_attribute", "except AttributeError:", "    out.append('attr')"]
    return ["try:", "    int('x%d' % n)", "except (TypeError, ValueError) as e:", "    out.append(str(e))"]


def block_class(rng):
    ops = ["obj.k += 1", "acc = acc + obj.double", "acc = obj.scale(acc)", "out.append(obj.k)",
           "out.append(Acc.shared + obj.shared)", "out.append(Acc.twice(n))", "obj.w = obj.w * 2",
           "b = Box(acc, n)", "b = dataclasses.replace(Box(y), k=2)", "out.append(obj.level)",
           "obj.level = -n", "out.append(Acc.tag)", "out.append(isinstance(obj, Acc))",
           "o2 = Acc.make(y)", "out.append(type(obj).__name__)", "out.append(hasattr(obj, 'w'))",
           "obj.extra = n", "out.append(getattr(obj, 'extra', None))", "out.append(vars(Box(1)))",
           "out.append(Box(1) == Box(1, 1))", "out.append(dataclasses.astuple(Box(n, 2)))"]
    lines = _pick(rng, ops, 1, 4)
    if any(line.startswith("b = ") for line in lines):
        lines += ["out.append(b.k)", "acc = acc + b.total()"]
    return lines


def block_functools(rng):
    forms = ["acc = functools.reduce(lambda a, b: a + b, [acc, y, x])",
             "out.append(functools.reduce(lambda a, b: a * b, range(1, n + 2), 1))",
             "p2 = functools.partial(torch.add, alpha=2)", "acc = functools.partial(shifted, k=n)(acc)",
             "out.append(fib(n + 3))", "out.append(shifted.__name__)", "acc = shifted(acc)",
             "out.append(functools.partial(max, 3)(n))"]
    lines = _pick(rng, forms, 1, 3)
    if "p2 = functools.partial(torch.add, alpha=2)" in lines:
        lines.append("acc = p2(acc, y)")
    return lines


def block_itertools(rng):
    forms = ["out.append(list(itertools.chain([1, n], (3,))))",
             "out.append(list(itertools.accumulate([1, 2, n])))",
             "out.append(list(itertools.product(range(2), 'ab')))",
             "out.append(list(itertools.islice(itertools.count(n), 3)))",
             "out.append(list(itertools.zip_longest([1, 2], 'a', fillvalue=n)))",
             "out.append(list(itertools.pairwise(range(n + 2))))",
             "out.append(list(itertools.repeat(n, 2)))",
             "out.append(list(itertools.starmap(pow, [(2, n), (3, 1)])))",
             "out.append([(k, len(list(g))) for k, g in itertools.groupby('aabbb')])",
             "acc = acc + sum(itertools.chain([x], [y]))",
             "out.append(list(itertools.combinations(range(3), 2)))",
             "out.append(list(itertools.permutations([n, 1])))"]
    return _pick(rng, forms, 1, 3)


def block_copy(rng):
    forms = ["l2 = copy.copy(lst)", "d2 = copy.deepcopy(dct)", "o3 = copy.copy(obj)", "l2 = list(lst)",
             "d2 = dict(dct)", "d2 = dct.copy()"]
    lines = _pick(rng, forms, 1, 2)
    if any(line.startswith("l2") for line in lines):
        lines += ["l2.append(n)", "out.append(len(l2) - len(lst))"]
    if any(line.startswith("d2") for line in lines):
        lines += ['d2["b"] = -1', 'out.append(dct["b"])', 'acc = acc + d2["a"]']
    if "o3 = copy.copy(obj)" in lines:
        lines += ["o3.k = 10", "out.append(obj.k)", "out.append(o3.w is obj.w)"]
    return lines


def block_builtins(rng):
    subject = rng.choice(["opt", "None", "n", "acc", "lst", "dct", "obj", '"txt"', "(1, 2)", "P12"])
    forms = [f"getattr({subject}, 'shape', 5)", f"hasattr({subject}, 'append')", f"hasattr({subject}, 'k')",
             f"isinstance({subject}, (int, str))", f"isinstance({subject}, torch.Tensor)",
             f"type({subject}).__name__", f"type({subject}) is type(None)", f"{subject} is None",
             f"id({subject}) == id({subject})", f"callable({subject})", f"bool({subject} is not None)",
             f"len({subject}) if hasattr({subject}, '__len__') else -1",
             f"len(list(iter({subject}))) if hasattr({subject}, '__iter__') else -1",
             f"getattr({subject}, 'k', None)", f"getattr(type({subject}), '__name__')"]
    lines = [f"out.append({f})" for f in _pick(rng, forms, 1, 4)]
    more = ["out.append(divmod(n + 7, 3))", "out.append(abs(-n))", "out.append(round(2.567, 1))",
            "out.append(min(n, 2))", "out.append(max([1, n, 3]))", "out.append(sorted('cba'))",
            "out.append(list(reversed([1, n])))", "out.append(any([0, n]))", "out.append(all([]))",
            "out.append(list(map(str, range(n))))", "out.append(list(filter(None, [0, 1, n])))",
            "out.append(list(zip('ab', [n, 2])))", "out.append(str(n) + repr('q'))", "out.append(ord('a') + n)",
            "out.append(chr(65 + n))", "out.append(int('12') + n)", "out.append(float(n) / 2)",
            "out.append(list(enumerate('xy', n)))", "out.append(sum([n, 1.5]))", "out.append(pow(2, n, 5))",
            "out.append('-'.join(['a', str(n)]))", "out.append(f'{n:03d}|{SCALE}')",
            "out.append('a,b'.split(','))", "out.append(hash(n) == hash(n))", "out.append(bool([]))"]
    return lines + _pick(rng, more, 1, 3)


def block_item(rng):
    forms = ["v = acc.sum().item()", "v = x.max().item()", "v = float(y.mean())", "v = acc[0, 0].item()"]
    lines = [rng.choice(forms)]
    uses = ["acc = acc + v", "acc = acc * v", "out.append(round(v, 3))", "acc = acc - v / 2",
            "if v > 0:\n    acc = acc + 1\nelse:\n    acc = acc - 1", "out.append(v > 0)",
            "acc = torch.clamp(acc, max=abs(v) + 1)", "out.append(isinstance(v, float))",
            "n = n + int(v > 0)", "out.append(math.floor(v))"]
    for use in _pick(rng, uses, 1, 3):
        lines += use.split("\n")
    return lines


def block_globals(rng):
    forms = ["G_LOG.append(n)", 'G_STATE["calls"] += 1', "G_N += n", 'G_STATE["last"] = acc.shape[0]',
             "out.append(len(G_LOG))", "out.append(G_N)", "acc = acc * SCALE", 'G_LOG.extend(["a", n])']
    return _pick(rng, forms, 1, 3)


def block_mutate_args(rng):
    forms = ["lst.append(n)", 'dct["new"] = acc', "obj.k = n", "x.add_(1)", "lst[0].mul_(2)",
             "lst.pop()", 'dct.pop("b")', "dct.update(z=3)", "lst[1] = lst[1] + 1", 'lst.insert(0, "head")',
             "obj.w.sub_(0.5)", 'dct.setdefault("s", []).append(n)']
    return _pick(rng, forms, 1, 3)


def block_tensor_control(rng):
    forms = [["if acc.shape[0] > 3:", "    acc = acc.relu()", "else:", "    acc = acc.sin()"],
             ["for i in range(acc.shape[0]):", "    acc[i] = acc[i] + i"],
             ["k = 0", "while k < 3:", "    acc = acc * 0.5", "    k += 1"],
             ["for t in [x, y]:", "    acc = acc + t"],
             ["for row in acc:", "    n = n + 1"],
             ["acc = acc + opt if isinstance(opt, torch.Tensor) else acc"],
             ["if opt is None:", "    n = n + 10", "elif isinstance(opt, int):", "    n = n + opt"],
             ["acc = torch.where(acc > 0, acc, y).contiguous()", "out.append(acc.dim())"],
             ["out.append(tuple(acc.shape))", "out.append(acc.numel() * n)"]]
    return rng.choice(forms)


def block_alias(rng):
    forms = ["out.append(lst)", "out.append(dct)", "out.append(obj)", "out.append(x)", "out.append(lst[0])",
             "alias = lst\nalias.append(n)", "alias = dct\nalias[\"al\"] = 1", "out.append(out is out)",
             "t2 = x\nout.append(t2 is x)", "out.append(acc is x)", "lst2 = lst[:]\nlst2.append(0)\nout.append(lst2)"]
    return [line for f in _pick(rng, forms, 1, 3) for line in f.split("\n")]


def block_generator_effects(rng):
    lines = ["def produce(m):", "    for i in range(m):", "        G_LOG.append(('gen', i))", "        yield i"]
    return lines + rng.choice([
        ["for v in produce(3):", "    G_LOG.append(('body', v))"],
        ["it = produce(2)", "G_LOG.append('made')", "out.append(list(it))"],
        ["out.append([v * n for v in produce(2)])"],
        ["it = produce(4)", "for v in it:", "    if v == 1:", "        break", "out.append(list(it))"],
        ["out.append(sum(produce(3)) + n)", "acc = acc + len(G_LOG)"]])


def block_late_binding(rng):
    return rng.choice([
        ["fs = [lambda: i for i in range(3)]", "out.append([f() for f in fs])"],
        ["fs = [lambda i=i: i * n for i in range(3)]", "out.append([f() for f in fs])"],
        ["k = 1", "def get():", "    return k", "k = 5", "out.append(get())"],
        ["ts = [lambda t, j=j: t + j for j in range(2)]", "acc = ts[1](acc)"]])


def block_context(rng):
    return rng.choice([
        ["with torch.no_grad():", "    acc = acc * 2", "out.append(acc.requires_grad)"],
        ["with contextlib.suppress(KeyError):", '    out.append(dct["zz"])',
         "    out.append('unreached')", "out.append('after')"],
        ["@contextlib.contextmanager", "def tagged(tag):", "    G_LOG.append(('enter', tag))",
         "    try:", "        yield tag * 2", "    finally:", "        G_LOG.append(('exit', tag))",
         "with tagged(n) as v:", "    acc = acc + v"],
        ["with Ctx(n) as c:", "    acc = acc - c.k"],
        ["try:", "    with Ctx(n):", "        raise FuzzError('inside')", "except FuzzError as e:", "    out.append(str(e))"]])


def block_unpacking(rng):
    forms = ["first, *rest = [acc, n, 3]\nout.append(len(rest))", "a, (b, c) = 1, (n, 3)\nout.append(a + b + c)",
             "out.append([*range(n), *'ab'])", "out.append({**dct, 'b': 0}['b'])",
             "out.append(max(*[1, n, 2]))", "def kw(a, b=2, *args, c=3, **kws):\n    return a, b, args, c, sorted(kws)\n"
             "out.append(kw(1, *[n, 5], c=4, **{'z': 1}))", "if (m := n * 2) > 3:\n    out.append(m)",
             "acc, n = acc + 1, n + 1", "out.append(tuple(x.shape) + (n,))", "h, w = acc.shape\nn = n + h * w"]
    return [line for f in _pick(rng, forms, 1, 3) for line in f.split("\n")]


def block_dunder(rng):
    lines = [rng.choice(["bag = Bag([n, 2, 'q'])", "bag = Bag(range(n))", "bag = Bag([acc, 2])"])]
    reads = ["len(bag)", "list(bag)", "2 in bag", "bag[-1]", "bag.whatever", "bag == Bag([1, 2, 3])",
             "[v for v in bag if v != 2]", "hasattr(bag, 'anything')", "sorted(bag, key=str)"]
    return lines + _appends(rng, reads, 3)


def block_numbers(rng):
    forms = ["out.append((n - 7) // 3)", "out.append((n - 7) % 3)", "out.append(divmod(-n - 1, 4))",
             "out.append(round(2.5) + round(3.5))", "out.append(2 ** n)", "out.append(n << 2 | 1)", "out.append(~n ^ 5)",
             "out.append(min([], default=n))", "out.append(sum([True, True, n > 1]))", "out.append(abs(-2.5) * n)",
             "out.append(int(-3.7))", "out.append(float('inf') > n)", "out.append(math.isclose(0.1 + 0.2, 0.3))",
             "out.append(n / 4)", "out.append(max([3, n], key=lambda v: -v))", "out.append(min([]))",
             "out.append(list(zip([1, 2], 'a', strict=True)))", "out.append('%.2f|%s' % (n / 3, n))"]
    return _pick(rng, forms, 1, 4)


BLOCKS = [block_list, block_dict, block_set, block_namedtuple, block_deque, block_defaultdict,
          block_ordereddict, block_counter, block_numpy, block_closure, block_generator,
          block_comprehension, block_exception, block_class, block_functools, block_itertools,
          block_copy, block_builtins, block_item, block_globals, block_mutate_args, block_tensor_control,
          block_alias, block_generator_effects, block_late_binding, block_context, block_unpacking, block_dunder,
          block_numbers]
