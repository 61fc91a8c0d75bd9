"""The GitHub Actions recipes in examples/ are valid YAML and every command they run exists:
each pytest and llmperf command line they name parses with the options as they are today. The
pull-request recipe gates on ``--llmperf-against git:origin/<base branch>``, and the checkout it
asks for (the whole history) is what makes that REF resolve in a real clone; the upgrade recipe
gates on ``--llmperf-against python:PATH``, an environment its own step builds from the base
branch's requirements."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from pytest_llmperf import cli
from pytest_llmperf.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WORKFLOW = EXAMPLES / "github-actions-llmperf.yml"
PR_WORKFLOW = EXAMPLES / "github-actions-llmperf-pr.yml"
UPGRADE_WORKFLOW = EXAMPLES / "github-actions-llmperf-upgrade.yml"
WORKFLOWS = (WORKFLOW, PR_WORKFLOW, UPGRADE_WORKFLOW)
SHELL_ENDS = {">", ">>", "|", "&&", "||", ";", "2>&1"}
#: What GitHub puts in for the expressions the commands use (a pull request into main).
CONTEXT = {"github.base_ref": "main", "runner.temp": "/home/runner/work/_temp"}


def _expand(line: str, context: dict[str, str] | None = None) -> str:
    """``${{ github.base_ref }}`` as GitHub expands it; an unknown expression fails the test."""
    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", lambda m: (context or CONTEXT)[m.group(1)], line)


def commands(workflow: Path = WORKFLOW, context: dict[str, str] | None = None) -> list[list[str]]:
    """Every ``run:`` of the workflow, split into words, cut at redirections and pipes."""
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    found = []
    for job in jobs.values():
        for step in job["steps"]:
            for line in step.get("run", "").replace("\\\n", " ").splitlines():
                words = shlex.split(_expand(line, context))
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


def pytest_runs(workflow: Path) -> list[list[str]]:
    return [args for w in commands(workflow) if (args := tool_args(w, "pytest")) is not None]


def test_every_workflow_in_examples_is_checked_here() -> None:
    assert set(EXAMPLES.glob("*.yml")) | set(EXAMPLES.glob("*.yaml")) == set(WORKFLOWS)


def test_workflow_has_the_parts_a_ci_needs() -> None:
    data = yaml.safe_load(WORKFLOW.read_text())
    steps = data["jobs"]["perf"]["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/cache@") and "~/.cache/pip" in s["with"]["path"] for u, s in zip(uses, steps))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert {"llmperf.html", "llmperf.json"} <= set(upload["with"]["path"].split())
    assert upload.get("if") == "always()"  # the reports of a failing run are the ones wanted
    runs = pytest_runs(WORKFLOW)
    assert runs, "the workflow runs no pytest"
    words = " ".join(runs[0])
    for option in ("--llmperf-json", "--llmperf-html", "--llmperf-markdown"):
        assert option in words


def test_pull_request_workflow_gates_against_the_base_branch() -> None:
    data = yaml.safe_load(PR_WORKFLOW.read_text())
    assert list(data[True]) == ["pull_request"]  # YAML 1.1 reads the key `on` as True
    (job,) = data["jobs"].values()
    steps = job["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # the base branch's commits, not just the merge commit
    assert steps.index(checkout) == 0
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/cache@") and "~/.cache/pip" in s["with"]["path"] for u, s in zip(uses, steps))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert {"llmperf.json", "llmperf.md"} <= set(upload["with"]["path"].split())
    assert upload.get("if") == "always()"
    (run,) = pytest_runs(PR_WORKFLOW)
    raw = next(s["run"] for s in steps if "--llmperf-against" in s.get("run", ""))
    assert "--llmperf-against git:origin/${{ github.base_ref }}" in " ".join(raw.split())
    assert run[run.index("--llmperf-against") + 1] == "git:origin/main"
    for option in ("--llmperf-json", "--llmperf-markdown"):
        assert option in run
    assert "--llmperf-update-baselines" not in run  # refused together with --llmperf-against


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_pytest_command_parses(pytester: pytest.Pytester, workflow: Path) -> None:
    runs = pytest_runs(workflow)
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


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip()


def test_the_recipes_checkout_makes_the_base_branch_a_ref(tmp_path: Path) -> None:
    """As actions/checkout does for a pull request: with the whole history (fetch-depth: 0) the
    workflow's REF resolves to the base branch's head; a shallow clone of the pull request's
    branch alone stops in one line that says to fetch it, naming fetch-depth: 0."""
    from pytest_llmperf.session.refs import resolve_reference

    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    for n in (1, 2):
        (origin / "wrapper.py").write_text(f"VERSION = {n}\n")
        _git(origin, "add", ".")
        _git(origin, "commit", "-qm", f"main {n}")
    base = _git(origin, "rev-parse", "HEAD")
    _git(origin, "checkout", "-qb", "feature")
    (origin / "wrapper.py").write_text("VERSION = 3\n")
    _git(origin, "commit", "-qam", "the pull request")
    (run,) = pytest_runs(PR_WORKFLOW)
    text = run[run.index("--llmperf-against") + 1]
    full = tmp_path / "full"
    _git(tmp_path, "clone", "-q", "--no-local", "--branch", "feature", str(origin), str(full))
    assert resolve_reference(text, full).commit == base
    shallow = tmp_path / "shallow"
    _git(
        tmp_path,
        "clone",
        "-q",
        "--depth",
        "1",
        "--single-branch",
        "--branch",
        "feature",
        f"file://{origin}",
        str(shallow),
    )
    with pytest.raises(ConfigError) as error:
        resolve_reference(text, shallow)
    line = str(error.value)
    assert "\n" not in line and "no commit 'origin/main'" in line and "(a shallow clone)" in line
    assert "fetch-depth: 0" in line


def _step(workflow: Path, name: str) -> dict:
    (job,) = yaml.safe_load(workflow.read_text())["jobs"].values()
    return next(s for s in job["steps"] if s.get("name") == name)


def test_upgrade_workflow_gates_against_the_base_branchs_environment() -> None:
    """A pull request that changes requirements.txt: this job's environment against one built
    from the base branch's requirements, ``--llmperf-against python:PATH`` naming the
    interpreter that step makes, with what the plugin needs (its dependencies but the old
    environment's own llama-cpp-python)."""
    data = yaml.safe_load(UPGRADE_WORKFLOW.read_text())
    assert list(data[True]) == ["pull_request"] and "requirements.txt" in data[True]["pull_request"]["paths"]
    (job,) = data["jobs"].values()
    steps = job["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert steps.index(checkout) == 0 and checkout["with"]["fetch-depth"] == 0  # git show origin/<base>:...
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/cache@") and "~/.cache/pip" in s["with"]["path"] for u, s in zip(uses, steps))
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert {"llmperf.json", "llmperf.md"} <= set(upload["with"]["path"].split()) and upload.get("if") == "always()"
    (run,) = pytest_runs(UPGRADE_WORKFLOW)
    ref = run[run.index("--llmperf-against") + 1]
    venv = [w for w in commands(UPGRADE_WORKFLOW) if w[:3] == ["python", "-m", "venv"]]
    assert len(venv) == 1 and ref == f"python:{venv[0][3]}/bin/python"
    assert "--llmperf-update-baselines" not in run and "--llmperf-allow-not-compared" not in run
    (install,) = [w for w in commands(UPGRADE_WORKFLOW) if w[0] == f"{venv[0][3]}/bin/python"]
    assert install[1:4] == ["-m", "pip", "install"] and install[4:6] == [
        "-r",
        f"{CONTEXT['runner.temp']}/requirements-base.txt",
    ]
    named = {re.split(r"[<>=\[ ]", w)[0] for w in install[6:]}
    pyproject = (EXAMPLES.parent / "pyproject.toml").read_text()  # tomllib: Python 3.11+
    project = re.findall(
        r'"([^"]+)"', re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.MULTILINE | re.DOTALL).group(1)
    )
    needed = {re.split(r"[<>=\[ ]", d)[0] for d in project} - {"llama-cpp-python"}
    assert named == needed  # the plugin's dependencies; llama-cpp-python is the old requirements' own


def test_the_upgrade_recipes_old_environment_is_a_ref(tmp_path: Path) -> None:
    """The recipe's step, run as written in a clone of a pull request that upgrades
    llama-cpp-python (its pip install left out): the base branch's requirements are read, and
    the interpreter the step makes is the one the pytest command names, a working python:PATH."""
    import sys

    from pytest_llmperf.session.refs import resolve_reference

    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    (origin / "requirements.txt").write_text("llama-cpp-python==0.3.16\n")
    _git(origin, "add", ".")
    _git(origin, "commit", "-qm", "main")
    _git(origin, "checkout", "-qb", "upgrade")
    (origin / "requirements.txt").write_text("llama-cpp-python==0.3.36\n")
    _git(origin, "commit", "-qam", "the upgrade")
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", "--no-local", "--branch", "upgrade", str(origin), str(clone))
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    context = {**CONTEXT, "runner.temp": str(temp)}
    script = _expand(_step(UPGRADE_WORKFLOW, "The base branch's environment")["run"], context)
    lines = [ln for ln in script.splitlines() if ln.strip() and "pip install" not in ln]
    lines = [re.sub(r"^python -m venv", f"{shlex.quote(sys.executable)} -m venv --without-pip", ln) for ln in lines]
    subprocess.run(["bash", "-euc", "\n".join(lines)], cwd=clone, check=True, timeout=120, capture_output=True)
    assert (temp / "requirements-base.txt").read_text() == "llama-cpp-python==0.3.16\n"  # the base branch's
    (run,) = pytest_runs(UPGRADE_WORKFLOW)
    text = _expand(
        run[run.index("--llmperf-against") + 1].replace(CONTEXT["runner.temp"], "${{ runner.temp }}"), context
    )
    ref = resolve_reference(text, clone)
    assert ref.python == str(temp / "venv-base" / "bin" / "python") and ref.python_version == sys.version.split()[0]
