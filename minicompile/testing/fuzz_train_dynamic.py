"""The training fuzzer's dynamic mode: each batch compiled once for training with symbolic sizes,
called at three sizes, outputs and gradients compared with eager's at each.

The training fuzzer's programs (testing/fuzz_train.py) through ``torch.compile(dynamic=True,
backend="minicompile")``, called at the sizes of the inference fuzzer's dynamic mode
(testing/fuzz_dynamic.py: as written, every size made odd, the first size made 1, which Dynamo
specialises). A batch the symbolic training path cannot compile runs eagerly with its reason
logged (docs/training.md); those reasons are counted::

    python -m minicompile.testing.fuzz_train --dynamic --seed 0 -n 200
"""
from __future__ import annotations

import collections
import logging

import torch

from minicompile.aot.runtime import TrainingGraph
from minicompile.backend import minicompile_backend
from minicompile.config import patch
from minicompile.testing import fuzz
from minicompile.testing.fuzz_dynamic import _accepted, resize, size_maps
from minicompile.testing.fuzz_train import batched_programs, training_inputs
from minicompile.testing.grad_sweep import compare_training, run_with_grads

STATS: collections.Counter = collections.Counter()    # "training graphs", "other graphs"
REASONS: collections.Counter = collections.Counter()  # why a training graph ran eagerly


class _EagerReasons(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if "training graph runs eagerly" in message:
            REASONS[message.split("eagerly: ", 1)[1][:120]] += 1


def check_batch(programs: list) -> str | None:
    """``programs`` compiled as one training function with symbolic sizes and called at each of
    ``size_maps``; None if every output and gradient matches eager, else the first difference."""
    def counting(gm, example_inputs):
        compiled = minicompile_backend(gm, example_inputs)
        STATS["training graphs" if isinstance(compiled, TrainingGraph) else "other graphs"] += 1
        return compiled
    handler = _EagerReasons()
    logging.getLogger("minicompile").addHandler(handler)
    torch._dynamo.reset()
    compiled = None
    try:
        for k in range(3):
            sized = [_sized(p, k) for p in programs]
            inputs = [p.make_inputs() for p in sized]
            batched = batched_programs([p.function() for p in sized], [len(x) for x in inputs])

            def cloned(*args, batched=batched):
                return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in batched(*args))
            compiled = compiled or torch.compile(cloned, backend=counting, dynamic=True)
            flat = training_inputs([t for x in inputs for t in x])
            expected = run_with_grads(cloned, flat, 0)
            try:
                with patch(fallback_on_error=False):
                    actual = run_with_grads(compiled, flat, 0)
            except Exception as e:  # noqa: BLE001 - any compile/run error is a finding
                return f"crash at size map {k}: {type(e).__name__}: {str(e).strip()[:300]}"
            found = compare_training(expected, actual, random=False,
                                     tolerances=fuzz._tolerances(fuzz._precision_floor(flat)))
            if found:
                return f"at size map {k}, input shapes {[i.shape for p in sized for i in p.inputs]}: {found}"
    finally:
        logging.getLogger("minicompile").removeHandler(handler)
        torch._dynamo.reset()
    return None


def _sized(prog, k: int):
    q = resize(prog, size_maps(prog)[k])
    return q if k > 0 and q != prog and _accepted(q) else prog


def summary() -> str:
    return (f"[fuzz --train --dynamic] {STATS['training graphs']} training graph(s) compiled, "
            f"{STATS['other graphs']} other (eager or inference)" +
            "".join(f"\n  {n} x ran eagerly: {reason}" for reason, n in REASONS.most_common()))
