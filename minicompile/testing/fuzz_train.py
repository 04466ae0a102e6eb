"""The fuzzer's training mode: random programs compiled for training, gradients compared with eager.

Programs come from the inference fuzzer's generator (testing/fuzz.py), drawing the inputs'
dtype from floating-point ones (float32 mostly, float64, bfloat16; each input may still be
integer or bool, one in five). Every floating-point input requires grad. A batch of programs is one function whose outputs
are cloned (an output that is a view of an input runs eagerly in training, which would hide
the batch's other programs from the compiler; aot/joint.py). It goes through the same
training path as the OpInfo gradient sweep (testing/grad_sweep.py): joint trace, partitioner,
compiled forward and backward graphs. The outputs and the gradients of every input that
requires grad (under fixed random cotangents) are compared with eager's, with the inference
fuzzer's tolerances; a bf16 program that fails them passes if it is no further from a float64
run than eager is (_no_worse_than_eager). A batch the training path refuses (``TrainingUnsupported``) is counted
as an eager fallback, and compared too. Failing programs are shrunk to reproducers::

    python -m minicompile.testing.fuzz_train --seed 0 -n 2000 --batch 10
"""
from __future__ import annotations

import argparse
import re
import sys

import torch

from minicompile.config import patch
from minicompile.testing import fuzz
from minicompile.testing.compare import copy_preserving_strides
from minicompile.testing.grad_sweep import compare_training, compile_for_training, graph_of, run_with_grads

# The class fuzzers' reproducers (fuzz_classes.py, fuzz_gather.py): the program, its inputs at call k,
# and the module's own check, which {call} spells.
CLASS_REPRO_TEMPLATE = '''"""A minicompile {what} fuzzer reproducer (testing/{module}.py): compiled != eager.

{message}
Run: python THIS_FILE
"""
import torch

from minicompile.testing.{module} import check_function


{make_input}

{program}


def inputs(k):
    return [
        {inputs},
    ]


if __name__ == "__main__":
    print({call} or "matches eager")
'''


TRAIN_REPRO_TEMPLATE = '''"""A minicompile training-fuzzer reproducer: compiled grads disagree with eager.

{message}
Run: python THIS_FILE
"""
import torch

from minicompile.testing.fuzz_train import check_inputs


{make_input}

{program}


if __name__ == "__main__":
    inputs = [
        {inputs},
    ]
    print(check_inputs(program, inputs) or "matches eager")
'''

fallbacks: list = []   # (first seed of the batch, reason) of batches that ran eagerly


# Ops whose derivative jumps (at 0, or where two operands tie). Eager's bfloat16 kernels round
# intermediates where ours compute in float32 and round once, so on a bf16 intermediate a value
# eager makes 1e-5 ours makes exactly 0 (a constant row's layer_norm, seed 600054), and the
# derivative flips: the inference fuzzer keeps comparisons off bf16 intermediates for the same
# reason.
KINKED = re.compile(r"relu|abs|floor|maximum|minimum|amax|amin|where|sign")


def _kink_on_bf16_intermediate(expr: str, vals: list) -> bool:
    names = fuzz._names(expr)
    return bool(KINKED.search(expr)) and any(
        v.name in names and v.tensor.dtype == torch.bfloat16 and not v.is_input for v in vals)


def generate(seed: int):
    return fuzz.generate(seed, dtypes=fuzz.TRAINING_DTYPES, reject=_kink_on_bf16_intermediate)


def training_inputs(tensors: list) -> list:
    """Copies of ``tensors``, the floating-point ones requiring grad."""
    return [copy_preserving_strides(t).requires_grad_(t.dtype.is_floating_point) for t in tensors]


def check_inputs(fn, inputs: list, tolerances=None) -> str | None:
    """Compile ``fn`` for training; None if its outputs and input grads match eager, else the difference."""
    def cloned(*args):
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in fn(*args))
    inputs = training_inputs(inputs)
    expected = run_with_grads(cloned, inputs, 0)
    try:
        with patch(fallback_on_error=False):
            compiled, status, detail = compile_for_training(graph_of(cloned, len(inputs)), inputs)
            actual = run_with_grads(compiled, inputs, 0)
    except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
        return f"crash: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    if status == "eager-fallback":
        fallbacks.append(detail)
    found = compare_training(expected, actual, random=False, tolerances=tolerances)
    if found and any(t.dtype == torch.bfloat16 for t in inputs) and _no_worse_than_eager(fn, inputs, expected, actual):
        return None
    return found


def _no_worse_than_eager(fn, inputs: list, expected, actual) -> bool:
    """For a bf16 program that fails the tolerance check: whether every compiled output and grad
    is about as close to the float64 result as eager's (max error at most twice eager's, plus
    bf16's atol). Gradients through a normalization over a dimension of 2 are rounding noise
    amplified by rsqrt(var) (seed 700630: eager and ours both 166 off the float64 grad, 1 apart
    from each other); the float64 run is the reference that tells noise from a wrong formula."""
    wide = [copy_preserving_strides(t).to(torch.float64).requires_grad_(t.requires_grad)
            if t.dtype == torch.bfloat16 else t for t in inputs]
    reference = run_with_grads(fn, wide, 0, [o.dtype for o in expected[0]
                                             if isinstance(o, torch.Tensor) and o.dtype.is_floating_point])
    pairs = list(zip(expected[0], actual[0], reference[0])) + list(zip(expected[1], actual[1], reference[1]))
    for e, a, r in pairs:
        if not isinstance(e, torch.Tensor) or not e.dtype.is_floating_point or e.numel() == 0:
            continue
        if e.shape != r.shape:
            return False
        finite = torch.isfinite(r) & torch.isfinite(e.double())   # NaN/inf positions: checked before
        if not finite.any():
            continue
        err_eager = (e.double() - r.double())[finite].abs().max()
        err_ours = (a.double() - r.double())[finite].abs().max()
        if not err_ours <= 2 * err_eager + 1e-2:
            return False
    return True


def batched_programs(fns: list, counts: list):
    """One function running every program on its own inputs (``counts[i]`` of them); its
    outputs, one flat tuple."""
    def batched(*args):
        outs, k = [], 0
        for fn, n in zip(fns, counts):
            outs.extend(fn(*args[k:k + n]))
            k += n
        return tuple(outs)
    return batched


def check_batch(programs: list) -> str | None:
    """Compile ``programs`` as one training graph; None if every output and grad matches eager."""
    inputs = [p.make_inputs() for p in programs]
    batched = batched_programs([p.function() for p in programs], [len(x) for x in inputs])
    floor = fuzz._precision_floor([t for x in inputs for t in x])
    return check_inputs(batched, [t for x in inputs for t in x], fuzz._tolerances(floor))


def run(seed: int, n: int, batch: int = 10, repro_dir: str = "fuzz-repros", log=print, dynamic: bool = False) -> list:
    """Fuzz ``n`` training programs from ``seed``; returns the reproducers written for failures.
    ``dynamic``: each batch compiled with symbolic sizes, called at three sizes (fuzz_train_dynamic.py)."""
    fallbacks.clear()
    if dynamic:
        from minicompile.testing.fuzz_train_dynamic import check_batch as check_dynamic, summary
        failures = fuzz.run(seed, n, batch, repro_dir, log, make=generate, check=check_dynamic)
        log(summary())
        return failures
    failures = fuzz.run(seed, n, batch, repro_dir, log, make=generate, check=check_batch,
                        template=TRAIN_REPRO_TEMPLATE)
    log(f"[fuzz --train] {len(fallbacks)} batch compile(s) ran eagerly" +
        "".join(f"\n  {reason}" for reason in sorted(set(fallbacks))))
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Fuzz minicompile's training graphs: random programs, grads vs eager.")
    p.add_argument("--seed", type=int, default=0, help="first program's seed (program k uses seed+k)")
    p.add_argument("-n", type=int, default=200, help="number of programs")
    p.add_argument("--batch", type=int, default=10, help="programs compiled together as one graph")
    p.add_argument("--repro-dir", default="fuzz-repros", help="where minimal reproducers are written")
    p.add_argument("--show", type=int, help="print program SEED as a standalone file and exit")
    p.add_argument("--dynamic", action="store_true",
                   help="compile with symbolic sizes and call at three sizes (testing/fuzz_train_dynamic.py)")
    fuzz.add_device_argument(p)
    args = p.parse_args(argv)
    if args.show is not None:
        print(generate(args.show).reproducer(f"training fuzzer seed {args.show}", TRAIN_REPRO_TEMPLATE))
        return 0
    fuzz.use_device(args.device)
    return 1 if run(args.seed, args.n, args.batch, args.repro_dir, dynamic=args.dynamic) else 0


if __name__ == "__main__":
    sys.exit(main())
