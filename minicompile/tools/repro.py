"""A standalone reproducer for one compiled graph.

``write_repro(compiled, example_inputs, directory)`` writes ``repro.py`` (and, when the
graph holds tensor constants, ``constants.pt`` beside it). The script rebuilds the ATen
graph from its printed code, makes random inputs with the captured shapes, strides and
dtypes (integer inputs stay within the captured values' range, so indices stay valid),
compiles the graph with minicompile and compares it with running the same graph eagerly.
It exits 0 when they match and 1 (printing the worst difference) when they do not.
"""
from __future__ import annotations

import os
import re
import textwrap

import torch

TEMPLATE = '''\
"""minicompile reproducer: {title}

Rebuilds the decomposed ATen graph below, compiles it with minicompile on random inputs
of the captured shapes and checks the result against eager. Exit status 0: they match.
Run: python {script}   (needs torch and minicompile; constants.pt beside it if listed)
"""
import math
import operator
import os
import sys

import torch
from torch import device
from minicompile.pipeline import compile_graph

inf, nan = math.inf, math.nan
HERE = os.path.dirname(os.path.abspath(__file__))

# name, shape, stride, dtype, (low, high) for integer inputs
INPUTS = [
{inputs}
]
CONSTANTS = {constants!r}   # get_attr tensors, stored in constants.pt


{graph_code}

def make_inputs(seed=0):
    if os.path.exists(os.path.join(HERE, "inputs.pt")):  # the values the graph was seen to differ on
        return torch.load(os.path.join(HERE, "inputs.pt"))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, shape, stride, dtype, bounds in INPUTS:
        if dtype == "python":
            out.append(shape)  # a plain number captured as a graph input
            continue
        t = torch.empty_strided(shape, stride, dtype=dtype)
        if dtype == torch.bool:
            t.copy_(torch.rand(shape, generator=gen) < 0.5)
        elif not dtype.is_floating_point and not dtype.is_complex:
            low, high = bounds
            t.copy_(torch.randint(low, high + 1, shape, generator=gen))
        else:
            t.copy_(torch.randn(shape, generator=gen))
        out.append(t)
    return out


def build_module():
    module = Repro()
    if CONSTANTS:
        for name, value in torch.load(os.path.join(HERE, "constants.pt")).items():
            *path, leaf = name.split(".")
            owner = module
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_buffer(leaf, value)
    return module


def tolerance(dtype):
    return {{torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-7}}.get(dtype, 1e-4)


def main():
    module = build_module()
    inputs = make_inputs()
    with torch.no_grad():
        expected = module(*inputs)
        gm = torch.fx.symbolic_trace(module)
        compiled = compile_graph(gm, make_inputs())
        actual = compiled(*inputs)
    flat_expected, _ = torch.utils._pytree.tree_flatten(expected)
    flat_actual, _ = torch.utils._pytree.tree_flatten(actual)
    worst, ok = 0.0, len(flat_expected) == len(flat_actual)
    for i, (e, a) in enumerate(zip(flat_expected, flat_actual)):
        if not isinstance(e, torch.Tensor):
            ok &= e == a
            continue
        tol = tolerance(e.dtype)
        try:
            torch.testing.assert_close(a, e, atol=tol, rtol=tol, equal_nan=True)
        except AssertionError as err:
            ok = False
            print(f"output {{i}} differs from eager:\\n{{err}}", file=sys.stderr)
        if e.numel() and e.dtype.is_floating_point:
            worst = max(worst, (a.double() - e.double()).abs().nan_to_num(0).max().item())
    print(f"{{compiled.num_kernels}} kernel(s), {{len(compiled.externs)}} extern(s); "
          f"{{len(flat_expected)}} output(s), max abs diff {{worst:.3g}}: {{'MATCH' if ok else 'MISMATCH'}}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def write_repro(compiled, example_inputs: list, directory: str, title: str = "", values: list | None = None) -> str:
    """Write ``repro.py`` for ``compiled`` into ``directory``; returns its path. With ``values`` (the
    graph's inputs), the script runs on those, saved in ``inputs.pt``, rather than random ones."""
    os.makedirs(directory, exist_ok=True)
    if values is not None:
        torch.save([v.detach() if isinstance(v, torch.Tensor) else v for v in values],
                   os.path.join(directory, "inputs.pt"))
    gm = compiled.aten.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    rows = [_input_row(n, x) for n, x in zip(placeholders, example_inputs)]
    constants = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _get_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                constants[node.target] = value.detach().clone()
    if constants:
        torch.save(constants, os.path.join(directory, "constants.pt"))
    code = gm.print_readable(print_output=False)
    # print_readable names the class after the traced function (sometimes "<lambda>").
    code = re.sub(r"^class .*?\(torch\.nn\.Module\):", "class Repro(torch.nn.Module):", code, count=1)
    path = os.path.join(directory, "repro.py")
    with open(path, "w") as f:
        f.write(TEMPLATE.format(title=title or "one compiled graph", script=path, inputs="\n".join(rows),
                                constants=sorted(constants), graph_code=textwrap.dedent(code).rstrip() + "\n"))
    return path


def _input_row(node, example) -> str:
    val = node.meta.get("val", example)
    if not isinstance(example, torch.Tensor):
        return f"    ({node.name!r}, {example!r}, None, 'python', None),"
    shape, stride = tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride())
    bounds = None
    if not example.dtype.is_floating_point and not example.dtype.is_complex and example.dtype != torch.bool:
        bounds = (int(example.min()), int(example.max())) if example.numel() else (0, 0)
    return f"    ({node.name!r}, {shape!r}, {stride!r}, {example.dtype}, {bounds!r}),"


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
