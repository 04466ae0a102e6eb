"""`minicompile report`: the HTML page's sections, escaping, charts and per-kernel bytes, and the
page opened in headless Chromium (Debian's `chromium`; skipped with a reason when absent)."""
import html
import re
import shutil
import subprocess
import textwrap

import pytest

from minicompile.tools import report_html
from minicompile.tools.capture import capture_dynamo
from minicompile.tools.target import load_target
from tests.test_cli import run_cli

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install "
                                                              "chromium; .ci/run installs it when it can)")

# A comment that would close the <pre> and run a script if the page did not escape source lines.
HOSTILE = "</pre><script>alert('x')</script>"
POINTWISE = textwrap.dedent(f"""
    import torch

    def model(x):
        y = torch.sigmoid(x) * 2.0 + 1.0   # {HOSTILE}
        return y.sum(dim=1)

    example_inputs = (torch.randn(64, 256),)
""")


def section_ids(page: str) -> list:
    return re.findall(r'<(?:section|details open) id="([^"]+)"', page)


def chromium(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=timeout)


def check_in_chromium(path, screenshot=None) -> str:
    """The page's own check line after Chromium ran its script; optionally a screenshot."""
    dom = chromium("--dump-dom", f"file://{path}").stdout
    found = re.search(r'id="report-check"[^>]*>([^<]*)<', dom)
    assert found, dom[:2000]
    if screenshot:
        chromium(f"--screenshot={screenshot}", "--window-size=1280,2000", f"file://{path}")
        with open(screenshot, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return found.group(1)


@pytest.fixture(scope="module")
def pointwise_page(tmp_path_factory):
    """One page, with --profile, of a model whose kernel sizes are known, rendered in-process."""
    script = tmp_path_factory.mktemp("report") / "pointwise.py"
    script.write_text(POINTWISE)
    target = load_target(str(script))
    report = capture_dynamo(target.model, target.example_inputs)
    page = report_html.render_page(report, target.name, profile_kernels=True)
    return report, page, script.parent / "page.html"


def test_page_has_every_section_and_stage(pointwise_page):
    _, page, _ = pointwise_page
    ids = section_ids(page)
    assert ids[:3] == ["summary", "timings", "profile"]
    for sid in ("breaks", "guards", "graph0", "graph0-graph", "graph0-aten", "graph0-ir", "graph0-fusion",
                "graph0-kernels", "graph0-wrapper"):
        assert sid in ids, sid
    assert f'data-sections="{html.escape(str(ids).replace(chr(39), chr(34)))}"' in page   # what the script checks
    assert "<link" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no network


def test_user_text_is_escaped_and_code_highlighted(pointwise_page):
    _, page, _ = pointwise_page
    assert HOSTILE not in page and "<script>alert" not in page
    assert html.escape(HOSTILE) in page          # the source line is shown, as text
    assert '<span class="keyword">for</span>' in page and '<span class="comment">' in page   # C++ kernels


def test_profile_charts_each_kernel_with_its_bytes(pointwise_page):
    report, page, _ = pointwise_page
    compiled = report.graphs[0].compiled
    kernels = report_html.profile_kernels(report, calls=2)
    assert {k.kernel for k in kernels} == set(compiled.kernel_args)   # every kernel ran and was found
    # One fused kernel reads x (64x256 float32) and writes the row sums (64 float32).
    assert [k.bytes for k in kernels] == [(64 * 256 + 64) * 4]
    assert all(k.us_per_call > 0 for k in kernels)
    for title in ("time per call", "bytes moved", "fraction of copy bandwidth"):
        assert f"<figcaption>{title}</figcaption>" in page
    assert page.count("<svg") == 4   # the compile passes, then the three profile charts


@needs_chromium
def test_page_opens_in_chromium_without_script_errors(pointwise_page):
    _, page, path = pointwise_page
    path.write_text(page)
    assert check_in_chromium(path) == f"report-check: OK, {len(section_ids(page))} sections"


# slow: two more Chromium starts (~5 s each on the 2-core machine)
@pytest.mark.slow
@needs_chromium
def test_chromium_check_fails_on_a_missing_section_or_a_script_error(pointwise_page, tmp_path):
    _, page, _ = pointwise_page
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace('id="guards"', 'id="x"').replace("</main>", "<script>nope(</script></main>"))
    assert check_in_chromium(broken, tmp_path / "shot.png").startswith("report-check: FAIL missing=guards errors=")


MODEL_TARGETS = {
    "cnn": ("from minicompile.tools.models import MODELS\n\ndef get_model():\n"
            "    return MODELS['resnet18'].build('tiny')\n", []),
    "gpt2": ("from minicompile.tools.models import MODELS\n\ndef get_model():\n"
             "    return MODELS['gpt2'].build('tiny')\n", ["--train"]),
}


# slow: each compiles a whole model (ResNet-18 inference, HF GPT-2 forward and backward), ~1 min
@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("name", list(MODEL_TARGETS))
def test_model_report_in_chromium(name, tmp_path):
    if name == "gpt2":
        pytest.importorskip("transformers")
    source, flags = MODEL_TARGETS[name]
    (tmp_path / f"{name}_target.py").write_text(source)
    out = tmp_path / f"{name}.html"
    proc = run_cli("report", f"{name}_target.py", *flags, "--profile", "--out", str(out), cwd=tmp_path,
                   timeout=900, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = out.read_text()
    ids = section_ids(page)
    want = ["graph0-forward-kernels", "graph0-backward-kernels", "graph0-partition"] if flags else ["graph0-kernels"]
    assert all(sid in ids for sid in want + ["profile", "guards", "breaks"]), ids
    assert check_in_chromium(out, tmp_path / "shot.png") == f"report-check: OK, {len(ids)} sections"
