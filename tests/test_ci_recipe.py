"""The GitHub Actions recipe in examples/ is valid YAML and every command it runs exists:
each pytest and llmperf command line it names parses with the options as they are today."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from pytest_llmperf import cli

WORKFLOW = Path(__file__).resolve().parent.parent / "examples" / "github-actions-llmperf.yml"
SHELL_ENDS = {">", ">>", "|", "&&", "||", ";", "2>&1"}


def commands() -> list[list[str]]:
    """Every ``run:`` of the workflow, split into words, cut at redirections and pipes."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    found = []
    for job in jobs.values():
        for step in job["steps"]:
            for line in step.get("run", "").replace("\\\n", " ").splitlines():
                words = shlex.split(line)
                for i, word in enumerate(words):
                    if word in SHELL_ENDS:
                        words = words[:i]
                        break
                if words:
                    found.append(words)
    return found


def tool_args(words: list[str], tool: str) -> list[str] | None:
    """The arguments after ``pytest`` / ``python -m pytest`` (or ``llmperf``), else None."""
    if words[:3] == ["python", "-m", tool]:
        return words[3:]
    if words[0] == tool:
        return words[1:]
    return None


def test_workflow_has_the_parts_a_ci_needs() -> None:
    data = yaml.safe_load(WORKFLOW.read_text())
    steps = data["jobs"]["perf"]["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/cache@") and "~/.cache/pip" in s["with"]["path"] for u, s in zip(uses, steps))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert {"llmperf.html", "llmperf.json"} <= set(upload["with"]["path"].split())
    assert upload.get("if") == "always()"  # the reports of a failing run are the ones wanted
    pytest_runs = [tool_args(w, "pytest") for w in commands() if tool_args(w, "pytest") is not None]
    assert pytest_runs, "the workflow runs no pytest"
    words = " ".join(pytest_runs[0])
    for option in ("--llmperf-json", "--llmperf-html", "--llmperf-markdown"):
        assert option in words


def test_every_pytest_command_parses(pytester: pytest.Pytester) -> None:
    runs = [args for w in commands() if (args := tool_args(w, "pytest")) is not None]
    assert runs
    for args in runs:
        config = pytester.parseconfig(*args)  # an unknown option or a bad value raises UsageError
        assert config.getoption("llmperf_json") == "llmperf.json"
        assert config.getoption("llmperf_threshold") == pytest.approx(0.05)  # 5% as written


def test_an_unknown_option_would_be_caught(pytester: pytest.Pytester) -> None:
    with pytest.raises(pytest.UsageError):
        pytester.parseconfig("--llmperf-no-such-option", "x")


def test_every_llmperf_command_parses() -> None:
    runs = [args for w in commands() if (args := tool_args(w, "llmperf")) is not None]
    assert runs, "the workflow runs no llmperf command"
    parser = cli.build_parser()
    for args in runs:
        parsed = parser.parse_args(args)  # exits 2 on an unknown command or option
        assert parsed.command in cli._commands()
