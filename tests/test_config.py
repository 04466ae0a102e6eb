"""Strict configuration: one parser for every MINICOMPILE_* variable, patch() and options=."""
import os
import pathlib
import subprocess
import sys

import pytest

from minicompile.config import ConfigError, config, graph_knobs, knobs, patch, readme_table, unknown_variables

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, raw, accepted", [
    ("debug", "abc", "an integer from 0 to 5"),
    ("debug", "9", "an integer from 0 to 5"),           # no silent clamp to 5
    ("fusion", "maybe", "1/0"),                         # no silent "off"
    ("fallback_on_error", "2", "1/0"),
    ("cpu_gemm", "fastest", "'auto', 'mkl', 'onednn'"),
    ("host_pool_mb", "-1", "an integer >= 0"),
])
def test_a_bad_environment_value_names_the_variable_value_and_choices(name, raw, accepted):
    spec = knobs()[name]
    with pytest.raises(ConfigError) as e:
        spec.check(raw, spec.env)
    assert spec.env in str(e.value) and repr(raw) in str(e.value) and accepted in str(e.value)


@pytest.mark.parametrize("raw, value", [("1", True), ("yes", True), ("ON", True), ("0", False),
                                        ("false", False), (" off ", False)])
def test_boolean_spellings(raw, value):
    assert knobs()["fusion"].check(raw, "MINICOMPILE_FUSION") is value


def test_import_with_a_bad_value_fails_naming_the_variable():
    env = dict(os.environ, MINICOMPILE_DEBUG="abc", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", "import minicompile.config"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "MINICOMPILE_DEBUG is 'abc'" in run.stderr and "an integer from 0 to 5" in run.stderr


def test_patch_and_options_are_checked_by_the_same_rules():
    before = config.cpu_attention
    with pytest.raises(ConfigError, match="MINICOMPILE_CPU_ATTENTION.*'auto', 'math', 'flash'"):
        with patch(cpu_attention="fastest"):
            pass
    assert config.cpu_attention == before
    with pytest.raises(ConfigError, match="MINICOMPILE_CONV_LAYOUT.*'auto', 'channels_last'"):
        with patch(conv_layout="nhwc"):
            pass
    with pytest.raises(ConfigError, match="option 'cpu_gemm'.*'auto', 'mkl', 'onednn'"):
        graph_knobs(options={"cpu_gemm": "fastest"})
    with patch(fusion=0, debug=2):          # 0/1 for booleans, as the environment takes them
        assert config.fusion is False and config.debug == 2


def test_unknown_variables_are_reported_with_the_closest_name():
    found = unknown_variables({"MINICOMPILE_DEBUGG": "1", "MINICOMPILE_FUSION": "1", "MINICOMPILE_FUZZ_N": "3",
                               "OTHER": "x"})
    assert found == ["MINICOMPILE_DEBUGG (did you mean MINICOMPILE_DEBUG?)"]


def test_readme_table_is_generated_from_config_and_lists_every_knob():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- knobs: generated from minicompile/config.py -->\n")
    end = readme.index("<!-- /knobs -->")
    assert readme[start:end].split("\n", 1)[1] == readme_table(), \
        "README's configuration table is stale: paste minicompile.config.readme_table() between the markers"
    for spec in knobs().values():
        assert f"| `{spec.env}` |" in readme
    assert "`MINICOMPILE_FALLBACK`" in readme


def test_every_variable_the_code_reads_is_a_knob_or_a_tool_variable():
    import re
    from minicompile.config import TOOL_VARIABLES
    named = set()
    paths = [*ROOT.glob("minicompile/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*")]
    for path in (p for p in paths if p.name != "test_config.py"):   # this file spells typos on purpose
        named |= set(re.findall(r"MINICOMPILE_[A-Z0-9_]+[A-Z0-9]", path.read_text(errors="replace")))
    known = {k.env for k in knobs().values()} | set(TOOL_VARIABLES)
    assert named - known == set(), "a MINICOMPILE_* variable not declared in minicompile/config.py"
