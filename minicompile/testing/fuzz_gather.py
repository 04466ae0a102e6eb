"""The fuzzer's ``gather`` class (testing/fuzz_classes.py): gathers whose indices are read from memory.

A program starts from a float table and one or two int64 index tensors (values -5..5, any layout),
and grows embedding / index_select / ``x[idx]`` (1-d and multi-d, None dims, broadcast index tensors,
int32 casts) over indices used as they are or computed from data (abs, clamp, %, +), among the
fuzzer's pointwise, reduction and view ops. One build (traced at call 0's inputs, where eager runs)
is called at three inputs: at the others an index may be out of range, and then the compiled call
must raise as eager does (the exception's type and, for one program, its message up to the numbers
in it; a batch's programs may fail in another order), and else match eager's values::

    python -m minicompile.testing.fuzz_classes --class gather --seed 0 -n 300 --batch 16
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.config import patch
from minicompile.pipeline import compile_graph
from minicompile.testing import fuzz
from minicompile.testing.compare import copy_preserving_strides, mismatch
from minicompile.testing.fuzz import Input, Program
from minicompile.testing.fuzz_train import CLASS_REPRO_TEMPLATE, batched_programs

CALLS = 3   # inputs of seeds seed, seed + 1009, seed + 2018, as the unbacked class


@dataclass
class GatherProgram(Program):
    kind: str = "gather"

    def inputs_at(self, k: int) -> list:
        return [fuzz.make_input(i.shape, i.dtype, i.layout, seed=i.seed + 1009 * k) for i in self.inputs]

    def reproducer(self, message: str = "", template: str = "") -> str:
        inputs = ",\n        ".join(i.source().replace(f"seed={i.seed})", f"seed={i.seed} + 1009 * k)")
                                    for i in self.inputs)
        return CLASS_REPRO_TEMPLATE.format(
            what="gather-class", module="fuzz_gather", call="check_function(program, inputs, alone=True)",
            message="\n".join(f"# {line}" for line in message.splitlines()), make_input=fuzz.MAKE_INPUT_SOURCE,
            program=self.function_source(), inputs=inputs)




def gather_inputs(rng, seed: int, dtypes) -> list:
    """A float table (2-d or 3-d, 3..9 rows) and one or two int64 index tensors in any layout."""
    table = (rng.randint(3, 9), rng.randint(1, 6)) if rng.random() < 0.6 else \
        (rng.randint(1, 4), rng.randint(3, 9), rng.randint(1, 6))
    dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16])
    out = [Input(table, dtype, rng.choice(["contiguous", "contiguous", "transposed", "strided"]), seed * 7)]
    for k in range(rng.randint(1, 2)):
        shape = (rng.randint(1, 6),) if rng.random() < 0.5 else (rng.randint(1, 3), rng.randint(1, 5))
        out.append(Input(shape, torch.int64, rng.choice(fuzz.LAYOUTS), seed * 7 + 1 + k))
    return out


def _index(rng, v, size: int) -> str:
    """``v`` (an integer value) as an index into ``size`` rows: as it is, or computed from it."""
    return rng.choice([v, v, f"{v}.abs()", f"{v}.clamp(0, {size - 1})", f"({v} % {size})", f"({v} + 5)",
                       f"{v}.int()", f"({v} % {size}).int()", f"{v}.flip(0)"])


def op_gather(rng, vals):
    """A gather of a float value at indices read from an integer value."""
    floats = [v for v in vals if v.tensor.dtype in fuzz.FLOATS and v.tensor.dim() >= 1 and min(v.tensor.shape) > 0]
    ints = [v for v in vals if v.tensor.dtype == torch.int64 and v.tensor.dim() >= 1]
    if not floats or not ints:
        return None
    t, i = rng.choice(floats), rng.choice(ints)
    x, n, d = t.name, t.tensor.shape, rng.randrange(t.tensor.dim())
    ix = _index(rng, i.name, n[d])
    forms = [f"{x}.index_select({d}, {ix}.flatten())", f"{x}[{ix}]"]
    forms += [f"torch.nn.functional.embedding({_index(rng, i.name, n[0])}, {x})"] * (t.tensor.dim() == 2)
    if t.tensor.dim() >= 2:
        j = rng.choice(ints).name
        forms += [f"{x}[:, {_index(rng, i.name, n[1])}]", f"{x}[{ix}, {_index(rng, j, n[1])}]",
                  f"{x}[..., {_index(rng, i.name, n[-1])}]", f"{x}[{ix}, :, {_index(rng, j, n[-1])}]",
                  f"{x}[{_index(rng, i.name, n[0])}[:, None], {_index(rng, j, n[1])}[None, :]]"]
    return rng.choice(forms)


OPS = fuzz.OPS + [(op_gather, 18)]   # about half the steps


def generate(seed: int) -> GatherProgram:
    prog = fuzz.generate(seed, max_steps=6, ops=OPS, make_inputs=gather_inputs)
    return GatherProgram(prog.inputs, prog.steps, prog.outputs, seed)


def _outcome(fn, flat):
    """(outputs, None) or (None, the exception an index check raised; another one is raised)."""
    try:
        return fn(*[copy_preserving_strides(t) for t in flat]), None
    except (IndexError, RuntimeError) as e:
        if isinstance(e, IndexError) or "out of DATA bounds" in str(e):
            return None, e
        raise


def _same_error(ours, eager, alone: bool) -> bool:
    if ours is None or type(ours) is not type(eager):
        return ours is not None and not alone   # in a batch another program may raise first
    numbers = re.compile(r"-?\d+")
    return not alone or numbers.sub("N", str(ours)) == numbers.sub("N", str(eager))


def check_function(fn, inputs_at, alone: bool = False, calls: int = CALLS) -> str | None:
    """``fn`` traced and compiled at ``inputs_at(0)``, called at ``calls`` inputs; None if each call
    matches eager (its values, or the error it raises)."""
    flat0 = inputs_at(0)
    try:   # eager runs a generated program at call 0's inputs; one shrinking made may not: not a finding
        if _outcome(fn, flat0)[1] is not None:
            return None
    except Exception:  # noqa: BLE001
        return None
    tolerances = fuzz._tolerances(fuzz._precision_floor(flat0))
    with patch(fallback_on_error=False):
        try:
            gm = make_fx(fn, tracing_mode="fake")(*[copy_preserving_strides(t) for t in flat0])
            compiled = compile_graph(gm, [copy_preserving_strides(t) for t in flat0])
        except Exception as e:  # noqa: BLE001 - any compile error is a finding
            return f"crash: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        for k in range(calls):
            flat = inputs_at(k)
            try:
                expected, eager_error = _outcome(fn, flat)
            except Exception:  # noqa: BLE001 - eager rejects this data otherwise (a dtype an op refuses)
                continue
            try:
                actual, error = _outcome(compiled, flat)
            except Exception as e:  # noqa: BLE001 - any other error is a finding
                return f"at call {k}: compiled raised {type(e).__name__}: {e}"
            if eager_error is not None and not _same_error(error, eager_error, alone):
                return f"at call {k}: eager raised {type(eager_error).__name__}: {eager_error}; compiled " + (
                    f"raised {type(error).__name__}: {error}" if error else "did not")
            if eager_error is None and error is not None:
                return f"at call {k}: compiled raised {type(error).__name__}: {error}; eager did not"
            # values only: eager's x[idx] follows a non-contiguous index tensor's strides where its fake
            # kernel, which the trace keeps, is contiguous (the extern call's result is conformed to it too)
            found = None if eager_error is not None else mismatch(expected, actual, strides=False, tolerances=tolerances)
            if found:
                return f"at call {k}: {found}"
    return None


def check(programs: list) -> str | None:
    """``programs`` as one graph (fuzz.run's check)."""
    fn = batched_programs([p.function() for p in programs], [len(p.inputs) for p in programs])
    return check_function(fn, lambda k: [t for p in programs for t in p.inputs_at(k)], alone=len(programs) == 1)


def run(seed: int, n: int, batch: int = 16, repro_dir: str = "fuzz-repros", log=print) -> list:
    return fuzz.run(seed, n, batch, repro_dir, log, make=generate, check=check)


def raising_programs(seed: int, n: int) -> list:
    """The seeds among ``n`` from ``seed`` whose program eager rejects at some call's inputs."""
    return [p.seed for p in map(generate, range(seed, seed + n))
            if any(_outcome(p.function(), p.inputs_at(k))[1] is not None for k in range(CALLS))]

