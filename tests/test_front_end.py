"""minicompile.compile: our own capture, compiled by the minicompile pipeline by default."""
import pytest
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


# -- torch.compile's arguments: fullgraph, dynamic, backend, mode, options ---------------------------
def small_graph(x, y):
    a = x.sin() * y
    return a.sum(-1) + a.amax(-1), (a * 2).cos()


def test_fullgraph_raises_at_the_first_break_before_it_runs():
    seen = []

    def f(x):
        y = x * 2
        seen.append(float(y.sum()))   # needs the tensor's value: a graph break
        return y + 1
    compiled = minicompile.compile(f, fullgraph=True)
    with pytest.raises(minicompile.GraphBreakError) as info:
        compiled(torch.randn(3))
    message = str(info.value)
    assert "f()" in message and "fullgraph=True" in message and "fullgraph=False" in message
    assert "seen.append(float(y.sum()))" in message and f"{__file__}:" in message
    assert info.value.code_name == "f" and info.value.reason
    assert seen == []                  # raised while tracing: nothing of the call ran
    assert minicompile.compile(f)(torch.ones(3)).tolist() == [3.0] * 3 and seen == [6.0]


def test_fullgraph_raises_where_the_function_would_fall_back():
    def f(x):
        try:
            y = x * 2
            print("inside a try block")   # a break there cannot be split: fx/eager fallback
        finally:
            pass
        return y
    with pytest.raises(minicompile.GraphBreakError, match="print"):
        minicompile.compile(f, fullgraph=True, backend="eager")(torch.randn(3))


def test_fullgraph_one_graph_matches_eager(compiles):
    x, y = torch.randn(4, 30), torch.randn(4, 30)

    @minicompile.compile(fullgraph=True)
    def g(x, y):
        return small_graph(x, y)
    for _ in range(2):
        torch.testing.assert_close(g(x, y), small_graph(x, y))
    assert g.capture_report.graph_count == 1 and g.capture_report.break_count == 0 and len(compiles) == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamic_false_recompiles_per_size_true_compiles_once(dynamic):
    f = minicompile.compile(lambda x: (x.sin() * 2).sum(0), dynamic=dynamic, backend="eager")
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(f(x), (x.sin() * 2).sum(0))
    assert f.capture_report.compile_count == (1 if dynamic else 3)


def test_unknown_mode_or_option_is_an_error_listing_the_valid_ones():
    with pytest.raises(ValueError, match="unknown mode 'fastest'.*'max-autotune-no-cudagraphs'"):
        minicompile.compile(small_graph, mode="fastest")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['nope'\]; known options: .*parallel_threshold"):
        minicompile.compile(small_graph, options={"nope": 1})
    with pytest.raises(TypeError, match="parallel_threshold"):
        minicompile.compile(small_graph, options={"parallel_threshold": "big"})
    with pytest.raises(ValueError, match="mode or options, not both"):
        minicompile.compile(small_graph, mode="max-autotune", options={"fusion": False})


def test_mode_reaches_the_pipeline_and_matches_eager(monkeypatch):
    from minicompile import backend as backend_module
    given = []
    pipeline = backend_module.minicompile_backend

    def recording(gm, example_inputs, **kwargs):
        given.append(kwargs)
        return pipeline(gm, example_inputs, **kwargs)
    monkeypatch.setattr(backend_module, "minicompile_backend", recording)
    x, y = torch.randn(4, 30), torch.randn(4, 30)
    f = minicompile.compile(small_graph, mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(f(x, y), small_graph(x, y))
    assert given == [{"mode": "max-autotune-no-cudagraphs", "options": None}]


def test_options_change_how_the_graph_is_compiled(compiles):
    x, y = torch.randn(4, 30), torch.randn(4, 30)
    for options in (None, {"fusion": False}):
        torch.testing.assert_close(minicompile.compile(small_graph, options=options)(x, y), small_graph(x, y))
    fused, unfused = compiles
    assert unfused.num_kernels > fused.num_kernels


@pytest.mark.parametrize("name", ["eager", "aot_eager", "minicompile"])
def test_backend_by_registered_name_matches_eager(name):
    x, y = torch.randn(4, 30), torch.randn(4, 30)
    f = minicompile.compile(small_graph, backend=name)
    for _ in range(2):
        torch.testing.assert_close(f(x, y), small_graph(x, y))
    assert f.capture_report.graph_count == 1


def test_backend_callable_gets_mode_and_options_as_torch_compile_passes_them():
    calls = []

    def backend(gm, example_inputs, **kwargs):
        calls.append((isinstance(gm, torch.fx.GraphModule), len(example_inputs), kwargs))
        return gm.forward
    x, y = torch.randn(4, 30), torch.randn(4, 30)
    torch.testing.assert_close(minicompile.compile(small_graph, backend=backend)(x, y), small_graph(x, y))
    torch.testing.assert_close(minicompile.compile(small_graph, backend=backend, mode="fast")(x, y),
                               small_graph(x, y))
    assert calls == [(True, 2, {}), (True, 2, {"mode": "fast"})]


def test_unknown_backend_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown backend 'nosuch'; registered backends: .*aot_eager.*inductor"):
        minicompile.compile(small_graph, backend="nosuch")
    with pytest.raises(TypeError, match="backend must be a name or a callable"):
        minicompile.compile(small_graph, backend=3)


def test_inductor_compiles_our_capture():
    """Our capture feeding Inductor (for comparison), with Inductor's own mode handling."""
    def f(x, y):
        z = small_graph(x, y)
        print("a break: two graphs")
        return z[0] * 2, z[1]
    x, y = torch.randn(4, 30), torch.randn(4, 30)
    compiled = minicompile.compile(f, backend="inductor", mode="max-autotune-no-cudagraphs")
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert compiled.capture_report.graph_count == 2
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        minicompile.compile(f, backend="inductor", mode="fastest")


def test_training_over_changing_lengths_compiles_per_shape_and_keeps_the_generator():
    """Our front end's training graph whose sizes changed was run eagerly ("dynamic shapes outside
    Dynamo"): it is built per shape now. And a compile draws random inputs to time its choices: the
    user's generator was moved by it (the next dropout mask would differ from eager's)."""
    import copy
    import logging
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("minicompile").addHandler(handler)
    try:
        for t in (3, 5, 7):
            x = torch.randn(2, t, 16)
            torch.manual_seed(t)
            compiled(x).square().mean().backward()
            after_compiled = torch.rand(1)
            torch.manual_seed(t)
            eager(x).square().mean().backward()
            assert torch.equal(after_compiled, torch.rand(1))   # the compile left the generator where eager's is
            for p, q in zip(model.parameters(), eager.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    finally:
        logging.getLogger("minicompile").removeHandler(handler)
    assert not any("runs eagerly" in r.getMessage() for r in records), [r.getMessage() for r in records]
