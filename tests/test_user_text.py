"""Text the user wrote (source lines, file and node names, strings) in generated code.

Kernel headers quote the user's source lines (codegen/common.py ``comment_text``), and the
wrapper passes strings to extern calls: whatever the text, the C++, the Triton and the wrapper
still compile and compute eager's values."""
import importlib.util
import subprocess

import pytest
import torch

from minicompile.codegen.common import comment_text
from minicompile.runtime import cpp_build
from tests.helpers import compile_with_dynamo

# Functions f(x, s) whose source lines are hard to quote in a comment -> what a kernel header
# must then show of them
NASTY_SOURCES = {
    "trailing_backslash": ("def f(x, s):\n    z = x.sin()\n    return z + \\\n        x * s.view(1, -1)\n",
                           "return z + \\<newline>"),
    "comment_ends_in_backslash": ("def f(x, s):\n    return x.sin() + s  # a backslash, then blanks: \\  \n",
                                  "# a backslash, then blanks: \\<newline>"),
    "block_comment_and_trigraph": ("def f(x, s):\n    return x.cos() * s  # */ ends, /* opens, ??/ is a backslash\n",
                                   "# * / ends, / * opens, ? ?/ is a backslash"),
    "non_ascii_identifier": ("def f(x, s):\n    caf\u00e9 = x.exp()\n    return caf\u00e9 * s\n",
                             "caf\\xe9 = x.exp()"),
    "non_ascii_string": ('def f(x, s):\n    return x.sin() * len("caf\u00e9 \u2615") + s\n',
                         'len("caf\\xe9 \\u2615")'),
    "triple_quotes": ("def f(x, s):\n    return x.tanh() * len('\"\"\"') + s  # \"\"\" '''\n",
                      "len('\"\"\"') + s  # \"\"\" '''"),
    "unicode_function_and_file": ("def f\u00fcnf(x, s):\n    return (x - s).abs().sqrt()  # \u03c0 \u2028\n"
                                  "f = f\u00fcnf\n", "(x - s).abs().sqrt()  # \\u03c0"),
}


def _load(tmp_path, name: str, source: str):
    """``f`` from a module file (non-ASCII name) holding ``source``: tracebacks quote its lines."""
    path = tmp_path / f"m\u00f6dule_{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"m\u00f6dule_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


@pytest.mark.parametrize("case", sorted(NASTY_SOURCES))
def test_nasty_source_lines_compile_and_match_eager(case, backend, tmp_path):
    source, shown = NASTY_SOURCES[case]
    fn = _load(tmp_path, case, source)
    torch.manual_seed(0)
    x, s = torch.rand(4, 8) + 0.1, torch.rand(8)
    out, graphs = compile_with_dynamo(fn, x, s, grad=True)
    torch.testing.assert_close(out, fn(x, s))
    (graph,) = graphs
    src = graph.kernel_source
    assert shown in src, src
    assert "m\\xf6dule_" in src and "m\u00f6dule_" not in src   # the file name, escaped
    assert src.isascii() and graph.wrapper_source.isascii()


class Modèle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.échelle = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.register_buffer("décalage", torch.rand(8))

    def forward(self, x):
        résultat = (x * self.échelle).softmax(-1) + self.décalage  # é */ \
        return résultat


def test_unicode_module_parameter_and_buffer_names_compile_for_training(backend):
    torch.manual_seed(0)
    model, x = Modèle(), torch.randn(4, 8)
    out, graphs = compile_with_dynamo(model, x, grad=True)
    expected = model(x)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, model.échelle, grad)
    (want,) = torch.autograd.grad(expected, model.échelle, grad)
    torch.testing.assert_close(got, want)
    assert graphs and all(g.forward.kernel_source.isascii() for g in graphs)
    assert any("r\\xe9sultat = (x * self.\\xe9chelle)" in g.forward.kernel_source for g in graphs)


@torch.library.custom_op("minicompile_test::scaled_by_label", mutates_args=())
def scaled_by_label(x: torch.Tensor, label: str) -> torch.Tensor:
    return x * len(label)


@scaled_by_label.register_fake
def _(x, label):
    return torch.empty_like(x)


@pytest.mark.parametrize("label", ['"""', "caf\u00e9\n", "a'b\"c\\", "*/ \r ??/ \x00"])
def test_string_arguments_reach_extern_calls_unchanged(label, backend):
    fn = lambda x: scaled_by_label(x.sin(), label).cos()  # noqa: E731
    x = torch.randn(3, 5)
    out, (graph,) = compile_with_dynamo(fn, x, grad=True)
    torch.testing.assert_close(out, fn(x))
    assert ascii(label) in graph.wrapper_source and graph.wrapper_source.isascii()


UNSAFE = ["x = 1 \\", "x = 1 \\ \t ", "a */ b /* c", "*/*", "a ??/", "???=", "caf\u00e9 \u2615", "l\u00edne\u2028two",
          "cr\rlf\nnul\x00", 'q = """', "tab\there", "\\\\", "\ud800 lone surrogate"]


@pytest.mark.parametrize("text", UNSAFE)
def test_comment_text_is_one_inert_ascii_line(text):
    safe = comment_text(text)
    assert safe.isascii() and safe.isprintable() and safe == safe.strip()
    assert "*/" not in safe and "/*" not in safe and "??" not in safe and not safe.endswith("\\")
    assert "\t" not in safe


def test_comment_text_keeps_ordinary_text_and_says_what_it_replaced():
    assert comment_text("return torch.softmax(x, -1)  # rows") == "return torch.softmax(x, -1)  # rows"
    assert comment_text("return z + \\") == "return z + \\<newline>"
    assert comment_text("caf\u00e9\n") == "caf\\xe9\\n"
    assert comment_text("a */ b") == "a * / b" and comment_text("??/") == "? ?/"


@pytest.mark.parametrize("text", UNSAFE)
def test_comment_text_is_inert_in_cpp_and_python_comments(text):
    """The line before a function's signature: a comment that swallowed it breaks the build."""
    safe = comment_text(text)
    cpp = (f"// {safe}\n/* {safe} */\n"
           f'extern "C" int kernel0() {{ return 7; }}\n')
    result = subprocess.run([cpp_build.compiler(), "-std=c++17", "-fsyntax-only", "-trigraphs", "-x", "c++", "-"],
                            input=cpp, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    namespace: dict = {}
    exec(compile(f"# {safe}\ndef kernel0():  # {safe}\n    return 7\n", "<comment>", "exec"), namespace)
    assert namespace["kernel0"]() == 7
