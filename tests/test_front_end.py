"""minicompile.compile: our own capture, compiled by the minicompile pipeline by default."""
import torch

import minicompile


def test_compile_uses_the_pipeline_and_matches_eager(compiles):
    built = compiles

    def f(x, w):
        y = torch.softmax(x @ w, -1)
        print("between graphs")
        return torch.nn.functional.layer_norm(y * 2, (8,)) + 1
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.no_grad():
        out = minicompile.compile(f)(x, w)
        torch.testing.assert_close(out, f(x, w))
        report = minicompile.explain(f)(x, w)
    assert report.graph_count == 2 and report.break_count == 1
    assert len(built) >= 2 and all(g.num_kernels >= 1 for g in built)
