"""Shared by the examples: compile with torch.compile(backend="minicompile"), show the kernels, check eager."""
import time

import torch

from minicompile.backend import minicompile_backend


def run_example(title, model, inputs, show_source=True, atol=1e-4, rtol=1e-4):
    graphs = []

    def backend(gm, example_inputs):  # minicompile's backend, keeping what it built to print it
        compiled = minicompile_backend(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    compiled_model = torch.compile(model, backend=backend)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = compiled_model(*inputs)
        compile_s = time.perf_counter() - t0
        ref = model(*inputs)
    print(f"=== {title} ===")
    for k, g in enumerate(graphs):
        print(f"--- graph {k}: {g.explain()}")
        if show_source:
            print(g.kernel_source if g.num_kernels else "(no kernels)")
    outs = out if isinstance(out, (tuple, list)) else [out]
    refs = ref if isinstance(ref, (tuple, list)) else [ref]
    worst = max((o.float() - r.float()).abs().max().item() for o, r in zip(outs, refs))
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol)
    print(f"check vs eager: OK (max abs difference {worst:.2e}); first call incl. compile {compile_s:.2f} s")
    return graphs
