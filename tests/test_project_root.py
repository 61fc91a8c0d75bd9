"""Where the baselines are is decided once, from the project (issue 47, point 1): the value of an
option that names an existing path (``--llmperf-json /tmp/out/s.json``, the second run) never
moves them, in whichever form it is given; and a test whose baseline the last commit holds but
that finds none fails with one line (``--llmperf-lost-baseline=warn``: passes with it), while a
new test keeps passing without one.

Real pytest sessions in subprocesses, with pytest choosing the rootdir itself (no ``--rootdir``,
no ``PYTEST_ADDOPTS`` of the suite's), in tmp folders only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent

#: Prints what the plugin decided, from the session's own settings (a conftest of the project).
SHOW = """
def pytest_sessionfinish(session):
    from pytest_llmperf.pytest_plugin.marks import SESSION
    s = session.config.stash[SESSION].settings
    print("\\nDECIDED", s.rootdir, s.baseline_dir, s.history.target if s.history else None)
"""

TEST = """
import pytest

@pytest.mark.llmperf(prompt_tokens=4, max_tokens=4, runs=3, warmup=0)
def test_a():
    pass
"""


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The inner session's environment: this checkout's code, no addopts of the caller's, git
    without the user's configuration and with no repository above ``tmp_path``."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GIT_", "LLMPERF_HISTORY"))}
    out["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])
    out.update(
        GIT_AUTHOR_NAME="llmperf tests",
        GIT_AUTHOR_EMAIL="tests@example.invalid",
        GIT_COMMITTER_NAME="llmperf tests",
        GIT_COMMITTER_EMAIL="tests@example.invalid",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CEILING_DIRECTORIES=str(tmp_path),
        COLUMNS="1000",  # a wide terminal: the lines these tests read are not wrapped
    )
    out.update(extra)
    return out


def pytest_in(cwd: Path, tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-s", *args],
        cwd=cwd,
        env=env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def decided(run: subprocess.CompletedProcess[str]) -> list[str]:
    lines = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("DECIDED ")]
    assert len(lines) == 1, run.stdout + run.stderr
    return lines[0]


def project(tmp_path: Path, layout: str) -> tuple[Path, Path, str]:
    """A project at ``tmp_path/work/proj`` and a report folder beside it; returns the project,
    the report folder and the baseline folder the project's configuration names.

    ``bare``: no ini file (pytest's rootdir is the common ancestor of the paths it sees);
    ``workspace``: the project's pyproject.toml names its baseline folder and history, and the
    folder above holds a CI workspace's pytest.ini (pytest reads that one once misled)."""
    work = tmp_path / "work"
    proj, out = work / "proj", work / "out"
    (proj / "tests").mkdir(parents=True)
    out.mkdir()
    (proj / "tests" / "test_x.py").write_text(TEST)
    (proj / "conftest.py").write_text(SHOW)
    if layout == "bare":
        return proj, out, "baselines"
    (proj / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nllmperf_baseline_dir = "perf/baselines"\nllmperf_history = "perf/history.sqlite"\n'
    )
    (work / "pytest.ini").write_text("[pytest]\n")
    return proj, out, "perf/baselines"


FORMS = {
    "space": lambda option, value: ([option, value], {}),
    "equals": lambda option, value: ([f"{option}={value}"], {}),
    "PYTEST_ADDOPTS": lambda option, value: ([], {"PYTEST_ADDOPTS": f"{option} {value}"}),
}


#: Every option that takes a path in each form (``--junitxml`` is pytest's own: known before
#: the rootdir is chosen, it never misleads pytest and is here as the control).
CASES = [
    ("--llmperf-json", "space"),
    ("--llmperf-json", "equals"),
    ("--llmperf-json", "PYTEST_ADDOPTS"),
    ("--llmperf-html", "space"),
    ("--llmperf-markdown", "space"),
    ("--junitxml", "space"),
]


@pytest.mark.parametrize("layout", ["bare", "workspace"])
@pytest.mark.parametrize(("option", "form"), CASES)
def test_an_option_naming_an_existing_path_never_moves_the_baselines(
    tmp_path: Path, layout: str, form: str, option: str
) -> None:
    """Given while the path exists (the second run): the baseline folder and the history the
    project's configuration names, as with no option at all (``tests/test_x.py`` alone, from the
    project: pytest's rootdir is the project). ``--llmperf-skip``: nothing is measured, the
    decision alone is looked at."""
    proj, out, baselines = project(tmp_path, layout)
    report = out / "report.file"
    report.write_text("from the last run")
    history = proj / ("perf/history.sqlite" if layout == "workspace" else ".llmperf/history.sqlite")
    args, extra = FORMS[form](option, str(report))
    run = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-skip", *args, **extra)
    assert decided(run) == [str(proj), str(proj / baselines), str(history)]
    moved = [line for line in run.stdout.splitlines() if "rootdir moved" in line]
    misled = form != "equals" and option.startswith("--llmperf-")
    assert len(moved) == (1 if misled else 0), run.stdout
    if misled:
        assert f"the value of {option} ({report})" in moved[0] and f"write {option}={report}" in moved[0]


def test_ini_addopts_and_override_keep_the_project(tmp_path: Path) -> None:
    """A path option in the ini file's ``addopts`` (read after pytest chose its rootdir: it
    never misleads it) and a baseline folder given by ``-o``, with a report path given with a
    space too: the project's folder, ``-o``'s baseline folder, the ini file's history."""
    proj, out, _ = project(tmp_path, "workspace")
    report = out / "report.file"
    report.write_text("from the last run")
    pyproject = proj / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + f'addopts = "--llmperf-markdown {report}"\n')
    run = pytest_in(
        proj,
        tmp_path,
        "tests/test_x.py",
        "--llmperf-skip",
        "-o",
        "llmperf_baseline_dir=gate",
        "--llmperf-json",
        str(report),
    )
    assert decided(run) == [str(proj), str(proj / "gate"), str(proj / "perf" / "history.sqlite")], run.stdout


def test_a_model_path_given_with_a_space_keeps_the_baselines(tmp_path: Path, tiny_model_path: Path) -> None:
    """A value that exists on the first run too: the model file (in the model cache, far from the project)."""
    proj, _, baselines = project(tmp_path, "bare")
    run = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-skip", "--llmperf-model", str(tiny_model_path))
    assert decided(run)[:2] == [str(proj), str(proj / baselines)]


def test_the_second_run_with_a_report_path_still_compares(tmp_path: Path) -> None:
    """The issue's case end to end: baselines recorded, then ``--llmperf-json PATH`` twice; the
    second run (PATH exists) still compares with the baseline, never "no baseline"."""
    proj, out, _ = project(tmp_path, "bare")
    history = {"LLMPERF_HISTORY": "off"}
    recorded = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-update-baselines", **history)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    report = out / "s.json"
    for _ in range(2):
        run = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-json", str(report), **history)
        # Compared: passed, or failed on a verdict (a loaded machine's noise can be a REGRESSION
        # of 3 runs against 3); never "no baseline", never an error.
        assert run.returncode in (0, 1) and "no baseline" not in run.stdout, run.stdout + run.stderr
        statuses = [r["verdict"]["status"] for r in json.loads(report.read_text())["results"]]
        assert statuses == ["compared"], statuses


def git(cwd: Path, tmp_path: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env(tmp_path), check=True, capture_output=True, timeout=60)


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    """A project in git whose baselines of ``tests/test_x.py::test_a`` are committed; a second
    test, ``test_new``, added after the commit, has none."""
    proj, _, _ = project(tmp_path, "bare")
    recorded = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-update-baselines", LLMPERF_HISTORY="off")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    git(proj, tmp_path, "init", "-q")
    git(proj, tmp_path, "add", "-A")
    git(proj, tmp_path, "commit", "-qm", "baselines")
    with (proj / "tests" / "test_x.py").open("a") as fh:
        fh.write(TEST.replace("import pytest\n", "").replace("test_a", "test_new"))
    return proj


def lost_lines(run: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in run.stdout.splitlines() if "baseline lost" in line]


@pytest.mark.parametrize("how", ["deleted", "emptied", "rootdir elsewhere"])
def test_a_test_that_lost_its_committed_baseline_fails_with_one_line(committed: Path, tmp_path: Path, how: str) -> None:
    """The file deleted, its entry removed, or the baselines looked for in another folder (an
    explicit ``--rootdir`` above the project): the test fails with one line naming HEAD's file
    and the fix; the new test without a baseline passes as before."""
    file = committed / "baselines" / "tests" / "test_x.json"
    args = ["tests/test_x.py", "-rN"]
    if how == "deleted":
        file.unlink()
    elif how == "emptied":
        data = json.loads(file.read_text())
        data["tests"] = {}
        file.write_text(json.dumps(data))
    else:
        args.append(f"--rootdir={committed.parent}")
    run = pytest_in(committed, tmp_path, *args, LLMPERF_HISTORY="off")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout
    lines = lost_lines(run)  # once: the failure of test_a; test_new has no baseline and passes
    fix = "not the one it was recorded with" if how == "rootdir elsewhere" else "git checkout HEAD -- "
    assert len(lines) == 1 and "baselines/tests/test_x.json at HEAD" in lines[0] and fix in lines[0], run.stdout
    assert " test_a _" in run.stdout and "test_new: no baseline" in run.stdout, run.stdout


def test_lost_baseline_warn_passes_with_the_line(committed: Path, tmp_path: Path) -> None:
    (committed / "baselines" / "tests" / "test_x.json").unlink()
    for args, extra in (
        (["--llmperf-lost-baseline=warn"], {}),
        ([], {"LLMPERF_LOST_BASELINE": "warn"}),
        (["-o", "llmperf_lost_baseline=warn"], {}),
    ):
        run = pytest_in(committed, tmp_path, "tests/test_x.py", *args, LLMPERF_HISTORY="off", **extra)
        assert run.returncode == 0, run.stdout + run.stderr
        notes = [line for line in run.stdout.splitlines() if "test_a: baseline lost" in line]
        assert len(notes) == 1, run.stdout
        assert "test_new: no baseline" in run.stdout


def test_lost_baseline_refuses_another_word(tmp_path: Path) -> None:
    proj, _, _ = project(tmp_path, "bare")
    run = pytest_in(proj, tmp_path, "tests/test_x.py", "--llmperf-lost-baseline=ignore")
    assert run.returncode == 4 and "must be one of fail, warn, got 'ignore'" in run.stderr, run.stderr
