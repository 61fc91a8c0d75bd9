"""The plugin's face to a newcomer: help texts, what it costs a project with no perf test, the
options that choose which tests run, and the ``llmperf`` command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf import cli
from pytest_llmperf.core import settings, values
from pytest_llmperf.session.options import KEYS, validate

ROOT = Path(__file__).resolve().parent.parent
FAST = "max_tokens=8, runs=2, warmup=0, prompt_tokens=16"


# -- help texts ------------------------------------------------------------------------------


def test_pytest_help_lists_the_options(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--help")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    text = result.stdout.str()
    for option in (
        "--llmperf-threshold",
        "--llmperf-skip",
        "--llmperf-only",
        "--llmperf-disable",
        "--llmperf-columns",
        "--llmperf-budgets-only",
        "--llmperf-baselines-only",
    ):
        assert option in text
    assert "e.g. 5% or 0.05" in text  # a literal %, not a format error


def test_pytest_markers_lists_every_marker_key(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--markers")
    assert result.ret == pytest.ExitCode.OK
    line = next(l for l in result.stdout.lines if l.startswith("@pytest.mark.llmperf("))
    missing = [k for k in KEYS if f"{k} (" not in line]
    assert not missing, f"--markers does not list {missing}"


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in cli._commands()])
def test_every_llmperf_help_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: llmperf") and not out.err


def test_light_copies_agree_with_the_modules_they_mirror() -> None:
    from pytest_llmperf.judge.regression import CompareSettings
    from pytest_llmperf.models import gguf as synthetic

    assert settings.PRESET_NAMES == tuple(synthetic.PRESETS)
    defaults = CompareSettings()  # the comparison's defaults are the settings table's
    assert (defaults.alpha, defaults.threshold, defaults.tail_threshold) == (
        settings.DEFAULT_ALPHA,
        settings.DEFAULT_THRESHOLD,
        settings.DEFAULT_TAIL_THRESHOLD,
    )


# -- a project with no llmperf test pays nothing -----------------------------------------------

PROBE = """
import sys

def pytest_unconfigure(config):
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "numpy", "llama_cpp"))
    ours = sorted(m for m in sys.modules if m.startswith("pytest_llmperf."))
    with open("modules.json", "w") as fh:
        import json
        json.dump({"heavy": heavy, "ours": ours}, fh)
"""


def test_plain_project_imports_no_heavy_module_and_prints_no_model(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest(PROBE)
    pytester.makepyfile(**{f"test_plain_{i}": f"def test_{i}():\n    assert True\n" for i in range(3)})
    installed = any(ep.name == "llmperf" for ep in metadata.entry_points(group="pytest11"))
    load = (
        []
        if installed or "pytest_llmperf.pytest_plugin.plugin" in os.environ.get("PYTEST_PLUGINS", "")
        else ["-p", "pytest_llmperf.pytest_plugin.plugin"]
    )
    result = pytester.runpytest_subprocess(*load, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    loaded = json.loads((pytester.path / "modules.json").read_text())
    assert loaded["heavy"] == [], "a plain test run imported " + ", ".join(loaded["heavy"])
    assert "pytest_llmperf.pytest_plugin.plugin" in loaded["ours"]  # the plugin was loaded, just cheaply
    assert not [l for l in result.stdout.lines if l.startswith("llmperf")], result.stdout.str()


#: What pytest's start-up must not import with the plugin, and why: each is needed only once a
#: session measures (tests/test_architecture.py's ``LAZY`` says what each costs).
NOT_AT_START = {
    "numpy": "the statistics and the traces' arrays",
    "scipy": "the verdicts' statistics",
    "llama_cpp": "an engine that loads a model",
    "asyncio": "an HTTP engine's requests (ssl with it)",
    "ssl": "an HTTP engine's requests",
    "pytest_llmperf.core.measurement": "a measurement's record (its own import is heavy)",
    "pytest_llmperf.measuring": "the timed runs (measuring.*)",
}


def test_loading_the_plugin_imports_nothing_a_measuring_session_needs() -> None:
    """The plugin's import path at pytest start (options, hooks, the marker, the session's
    settings) stays clear of what only measuring needs: counted in a fresh interpreter."""
    code = "import sys, pytest, pytest_llmperf.pytest_plugin.plugin; print(' '.join(sorted(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    loaded = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    modules = loaded.stdout.split()
    assert "pytest_llmperf.pytest_plugin.plugin" in modules  # the plugin was imported
    early = {
        name: why for name, why in NOT_AT_START.items() if any(m == name or m.startswith(name + ".") for m in modules)
    }
    assert early == {}, f"imported at pytest start, needed only for: {early}"


def test_model_line_comes_once_an_llmperf_test_is_collected(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_a(): pass

        def test_plain(): pass
        """
    )
    result = run(pytester, "--collect-only")
    assert [l for l in result.stdout.lines if l.startswith("llmperf: model synthetic-tiny")]
    deselected = run(pytester, "--collect-only", "-m", "not llmperf")
    assert not [l for l in deselected.stdout.lines if l.startswith("llmperf:")]


# -- which tests run ------------------------------------------------------------------------------

SUITE = f"""
import pytest

@pytest.mark.llmperf({FAST})
def test_marked(): pass

def test_fixture(llmperf):
    llmperf.measure({FAST})

def test_raw_model(llmperf_llm):
    assert llmperf_llm.tokenize(b"hi")[0] == 1

def test_plain(): pass
"""


def test_fixture_users_carry_the_mark(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = run(pytester, "-m", "not llmperf")
    result.assert_outcomes(passed=1, deselected=3)
    only = run(pytester, "-m", "llmperf", "--collect-only", "-q")
    assert sorted(l.split("::")[1] for l in only.stdout.lines if "::" in l) == [
        "test_fixture",
        "test_marked",
        "test_raw_model",
    ]


def test_skip_and_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    skipped = run(pytester, "--llmperf-skip", "-rs")
    skipped.assert_outcomes(passed=1, skipped=3)
    skipped.stdout.fnmatch_lines(["*llmperf test (--llmperf-skip)*"])
    assert "llmperf: model" not in skipped.stdout.str()  # nothing measured, no model named
    only = run(pytester, "--llmperf-only", "-rs")
    only.assert_outcomes(passed=3, skipped=1)
    only.stdout.fnmatch_lines(["*not an llmperf test (--llmperf-only)*"])
    both = run(pytester, "--llmperf-skip", "--llmperf-only")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--llmperf-skip and --llmperf-only exclude each other*"])


def test_disable_measures_once_without_budgets_or_baselines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(p95_ms=0.001, runs=9, warmup=3, max_tokens=8, prompt_tokens=16)
        def test_tight(llmperf):
            m = llmperf.measure()
            assert (m.n_runs, m.workload.warmup) == (1, 0)
        """
    )
    result = run(pytester, "--llmperf-disable", "--llmperf-require-baseline", "--llmperf-json=out.json")
    result.assert_outcomes(passed=1)  # the 0.001 ms budget is not enforced, no baseline required
    result.stdout.fnmatch_lines(["llmperf: 1 measurement(s) run once (--llmperf-disable): *"])
    assert "llmperf summary" not in result.stdout.str()
    assert json.loads((pytester.path / "out.json").read_text())["results"] == []
    assert not (pytester.path / "baselines").exists()
    clash = run(pytester, "--llmperf-disable", "--llmperf-update-baselines")
    assert clash.ret == pytest.ExitCode.USAGE_ERROR
    assert len([l for l in clash.stderr.lines if "--llmperf-disable" in l]) == 1


def test_threads_beyond_usable_cpus_warn_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    result = run(pytester, "--collect-only", "--llmperf-threads", "1000")
    lines = [l for l in result.stdout.lines if "warning" in l and "1000" in l]
    assert lines == [
        f"llmperf: warning: --llmperf-threads 1000 exceeds the {settings.usable_cpus()} usable CPU(s); "
        f"threads will time-slice and the timings measure the scheduler; use at most {settings.usable_cpus()}"
    ]
    quiet = run(pytester, "--collect-only", f"--llmperf-threads={settings.usable_cpus()}")
    assert "warning" not in quiet.stdout.str()


# -- what the terminal shows --------------------------------------------------------------------

LONG = """
import pytest

class TestAVeryLongClassNameThatPushesTheTestIdPastTheEdgeOfAnEightyColumnTerminal:
    @pytest.mark.parametrize("prompt_length_in_tokens_for_this_case", [16, 24])
    def test_decode_speed_of_the_synthetic_model_with_a_long_name(self, llmperf, prompt_length_in_tokens_for_this_case):
        llmperf.measure(prompt_tokens=prompt_length_in_tokens_for_this_case, max_tokens=8, runs=3, warmup=0)
"""


def test_tables_fit_80_columns_and_columns_are_chosen(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile(test_long_module_name_for_width=LONG)
    run(pytester, "--llmperf-update-baselines")
    # About widths, not verdicts: a 500% threshold keeps most of what a machine that got busier
    # between the two sessions does from failing the A/A pair; the tiny model's sub-millisecond
    # tokens can still be 6x slower when the engine's core is taken, and such a failure says so.
    result = run(pytester, "--llmperf-json=out.json", "--llmperf-threshold=500%", "--llmperf-tail-threshold=500%")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2, outcomes
    assert all("regression" in l for l in result.outlines if l.startswith("FAILED ")), result.outlines
    text = result.stdout.str()
    summary = text.split("llmperf summary")[1]
    assert "llmperf baseline comparison" in summary
    table_lines = [l for l in summary.splitlines() if l and not l.startswith("=") and ": " not in l]
    assert len(table_lines) >= 2 + 2 + 2 + 10  # both tables: headers, rules, 2 + 10 rows
    too_wide = [l for l in table_lines if len(l) > 80]
    assert not too_wide, "\n".join(too_wide)
    assert "decode decode" not in text and "prefill prefill" not in text
    # Shortened on the terminal, the two parametrized ids still told apart.
    assert re.search(r"\[16\]", summary) and re.search(r"\[24\]", summary)
    # Full ids and every comparison column in the JSON.
    results = json.loads((pytester.path / "out.json").read_text())["results"]
    assert any("TestAVeryLongClassName" in r["test"] and r["test"].endswith("[16]") for r in results)
    assert {"baseline_value", "candidate_value", "p_value", "ci_low"} <= set(results[0]["verdict"]["comparisons"][0])
    chosen = run(pytester, "--llmperf-columns=runs,model,p,now")  # shown in the order given
    header = next(l for l in chosen.stdout.lines if l.startswith("test") and "model" in l)
    assert header.split() == ["test", "runs", "model"]
    # 3 runs, or more when an undecided comparison measured more (max_runs, 3 x runs)
    assert re.search(r"^test_decode\S*\[16\] +[369] +synthetic-tiny$", chosen.stdout.str(), re.MULTILINE)
    cmp_header = next(l for l in chosen.stdout.lines if l.startswith("test") and "metric" in l)
    assert cmp_header.split() == ["test", "metric", "p", "(Holm)", "now"]
    bad = run(pytester, "--llmperf-columns=speed")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*unknown column(s) speed; choose from model, prompt*"])


def test_undecided_reason_is_on_the_terminal(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_few(): pass\n")
    run(pytester, "--llmperf-update-baselines")
    # A baseline whose 2 runs lie 4x apart cannot decide anything (not a timing accident).
    (path,) = pytester.path.rglob("baselines/*.json")
    data = json.loads(path.read_text())
    for per_hw in data["tests"].values():
        for entry in per_hw.values():
            entry["runs"] = {k: [v[0] * 0.5, v[0] * 2.0] for k, v in entry["runs"].items()}
    path.write_text(json.dumps(data))
    result = run(pytester, "--llmperf-json=out.json")
    result.assert_outcomes(passed=1)
    comparisons = json.loads((pytester.path / "out.json").read_text())["results"][0]["verdict"]["comparisons"]
    decided = ("REGRESSION", "IMPROVED", "UNCHANGED")
    undecided = [c for c in comparisons if c["verdict"] not in decided]
    # Said, with why.
    assert undecided, [c["verdict"] for c in comparisons]
    summary = result.stdout.str().split("llmperf summary")[1]
    for c in undecided:
        line = next(l for l in summary.splitlines() if c["reason"].split("; also ")[0] in l)
        assert line.startswith("test_few: ") and c["verdict"] in line and c["label"] in line
    quiet = run(pytester, "-q", "--llmperf-json=quiet.json")  # a new session: its own verdicts
    again = json.loads((pytester.path / "quiet.json").read_text())["results"][0]["verdict"]["comparisons"]
    for c in (c for c in again if c["verdict"] not in decided):
        assert c["reason"].split("; also ")[0] in quiet.stdout.str()


def test_markdown_headline_counts_budget_failures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(tpot_ms=0.0001, {FAST})
        def test_over(): pass

        @pytest.mark.llmperf(tpot_ms=10_000, {FAST})
        def test_within(): pass
        """
    )
    run(pytester, "--llmperf-markdown=summary.md").assert_outcomes(passed=1, failed=1)
    text = (pytester.path / "summary.md").read_text()
    assert "No regression" not in text
    assert "**1 of 2 measurement(s) failed**: 1 over budget." in text
    assert re.search(
        r"^- test_\w+\.py::test_over: decode TPOT median [\d.]+ ms > budget 0\.0001 ms", text, re.MULTILINE
    )
    # Budgets that do not gate do not count.
    run(pytester, "--llmperf-markdown=summary.md", "--llmperf-baselines-only").assert_outcomes(passed=2)
    assert "No regression and no budget failure in 2 measurement(s)." in (pytester.path / "summary.md").read_text()


def test_hardware_mismatch_names_the_fields(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    run(pytester, "--llmperf-update-baselines")
    path = next((pytester.path / "baselines").rglob("*.json"))
    data = json.loads(path.read_text())
    ((key, entries),) = data["tests"].items()
    ((hw_key, entry),) = entries.items()
    real_cpu = entry["hardware"]["cpu"]
    entry["hardware"]["cpu"] = "Imaginary CPU 9000"
    entry["hardware"]["memory_gib"] = 4096
    data["tests"][key] = {"linux-x86_64-999cpu-feedbeef": entry}
    path.write_text(json.dumps(data))
    result = run(pytester, "--llmperf-strict-env")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"*not comparable here: baselines exist only for other hardware (linux-x86_64-999cpu-feedbeef); "
            f"this machine is {hw_key}; differs from linux-x86_64-999cpu-feedbeef: "
            f"CPU 'Imaginary CPU 9000' -> {real_cpu!r}; memory GiB 4096 -> *; "
            "record one with --llmperf-update-baselines (--llmperf-strict-env)"
        ]
    )


def test_budgets_only_and_baselines_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.llmperf(tpot_ms=0.0001, {FAST})\ndef test_a(): pass\n")
    run(pytester, "--llmperf-baselines-only").assert_outcomes(passed=1)  # budget shown, not enforced
    result = run(pytester, "--llmperf-budgets-only", "--llmperf-require-baseline")
    result.assert_outcomes(failed=1)  # the budget fails it; no baseline is read or required
    assert "no baseline" not in result.stdout.str()
    both = run(pytester, "--llmperf-budgets-only", "--llmperf-baselines-only")
    assert both.ret == pytest.ExitCode.USAGE_ERROR


# -- thresholds written 5% everywhere --------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), (0.2, 0.2)])
def test_parse_fraction(text, value) -> None:
    assert values.parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5 percent", "-5%", "0", "nan", "", "%", True])
def test_parse_fraction_rejects(text) -> None:
    with pytest.raises(ValueError, match=r"^expected a share"):
        values.parse_fraction(text)


def test_marker_takes_percent_thresholds() -> None:
    config = validate({"threshold": "5%", "tail_threshold": "10%", "alpha": "1%"})
    assert config.settings == pytest.approx({"threshold": 0.05, "tail_threshold": 0.10, "alpha": 0.01})
    from pytest_llmperf.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^llmperf marker key 'threshold': expected a share like 5% or 0.05"):
        validate({"threshold": "fast"})


def test_compare_takes_percent_threshold(pytester: pytest.Pytester, capsys) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    run(pytester, "--llmperf-json=a.json")
    run(pytester, "--llmperf-json=b.json")
    capsys.readouterr()
    a, b = str(pytester.path / "a.json"), str(pytester.path / "b.json")
    as_percent = cli.main(["compare", a, b, "--threshold", "5%", "--tail-threshold", "10%"])
    out_percent = capsys.readouterr().out
    as_share = cli.main(["compare", a, b, "--threshold", "0.05", "--tail-threshold", "0.1"])
    assert (as_percent, out_percent) == (as_share, capsys.readouterr().out)
    assert as_percent in (0, 1)  # compared: not a usage error
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", a, b, "--threshold", "five"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "llmperf compare: error: argument --threshold: expected a share like 5% or 0.05, got 'five' "
        "(see llmperf compare --help)\n"
    )


def test_pytest_threshold_option_takes_percent(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain(): pass")
    run(pytester, "--llmperf-threshold=5%", "--llmperf-alpha=1%").assert_outcomes(passed=1)
    bad = run(pytester, "--llmperf-threshold=lots")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--llmperf-threshold: expected a share like 5% or 0.05, got 'lots'*"])


def test_profile_rejects_zero_threads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["profile", "--threads", "0"])
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.err == "llmperf profile: error: argument --threads: must be >= 1, got 0 (see llmperf profile --help)\n"
    assert out.out == ""


def test_short_ids_keep_what_tells_tests_apart() -> None:
    from pytest_llmperf.reports.text import _clip, short_ids

    assert short_ids(["tests/a/test_x.py::test_f[1]", "tests/b/test_y.py::test_f[1]"]) == {
        "tests/a/test_x.py::test_f[1]": "test_x.py::test_f[1]",
        "tests/b/test_y.py::test_f[1]": "test_y.py::test_f[1]",
    }
    assert short_ids(["t.py::TestA::test_f", "t.py::TestB::test_f"])["t.py::TestB::test_f"] == "TestB::test_f"
    clipped = _clip("test_in_process_and_served[in-process]", 20)
    assert len(clipped) == 20 and clipped.endswith("[in-process]") and ".." in clipped
