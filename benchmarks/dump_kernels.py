"""Print the generated kernels and host wrapper of every graph of a fixed set of workloads.

    PYTHONPATH=. MINICOMPILE_CACHE_DIR=/tmp/kernels-cache python benchmarks/dump_kernels.py > after.txt

For refactors that must keep the generated code: run it on the old and the new tree with the
same MINICOMPILE_CACHE_DIR (the measured CPU choices are read back from the cache, so both sides
decide alike) and diff the two outputs. Covers bench's workloads at sizes tiny and quick, the
bench --models suite at its tiny sizes (the HF ones where transformers is installed) and bench
--train's workloads at tiny size (forward and backward graphs), with the shipped knobs.
"""
import importlib.util

import torch
import torch._dynamo

import minicompile.backend as backend
from minicompile.tools.models import MODELS
from minicompile.tools.workloads import TRAIN_WORKLOADS, WORKLOADS, build_train

compiled = []
_compile_graph = backend.compile_graph


def recording(gm, inputs, *args, **kwargs):
    c = _compile_graph(gm, inputs, *args, **kwargs)
    compiled.append(c)
    return c


backend.compile_graph = recording


def dump(name, model, inputs, train=False):
    torch._dynamo.reset()
    compiled.clear()
    f = torch.compile(model, backend="minicompile")
    if train:
        out = f(*inputs)
        (out if out.dim() == 0 else out.sum()).backward()
    else:
        with torch.no_grad():
            f(*inputs)
    print(f"######## {name}: {len(compiled)} graph(s)")
    for k, c in enumerate(compiled):
        print(f"#### graph {k} kernels\n{c.kernel_source}\n#### graph {k} wrapper\n{c.wrapper_source}")


def main():
    torch.manual_seed(0)
    for size in ("tiny", "quick"):
        for name, w in WORKLOADS.items():
            model, inputs = w.build(**w.sizes[size])
            dump(f"workload {name} {size}", model.eval() if isinstance(model, torch.nn.Module) else model, inputs)
    for name, m in MODELS.items():
        if m.needs and importlib.util.find_spec(m.needs) is None:
            continue
        model, inputs = m.build("tiny")
        dump(f"model {name} tiny", model.eval(), inputs)
    for name in TRAIN_WORKLOADS:
        torch.manual_seed(0)
        model, shape = build_train(name, "tiny")
        dump(f"train {name} tiny", model, (torch.randn(shape),), train=True)


if __name__ == "__main__":
    main()
