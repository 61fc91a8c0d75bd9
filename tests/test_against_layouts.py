"""``--llmperf-against`` in the layouts projects have (issue 37): where the repository and the
code under test are found, and a session that compared nothing failing in one line. Real git
repositories, real inner sessions and sides, the tiny preset, as few pairs as a comparison
takes (``runs=3``: 3 pairs): each session asserts that the comparison happened (REF's code came
from REF's worktree) or the one line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from test_against import CONFTEST, Runner, git, make_repo, outcome, pairs_note, runner  # noqa: F401
from test_refs import _git_identity  # noqa: F401  (an autouse fixture, here too)

#: The code under test says where it was imported from; the test asserts REF's came from its worktree.
WRAPPER = "VERSION = {version}\n"
PERF = """
import pytest
import wrapper


@pytest.mark.llmperf(prompt_tokens=8, max_tokens=8, runs=3, warmup=0, max_runs=3)
def test_marker_only():
    assert wrapper.VERSION >= 1
"""


def _worktree_code(inner_out: str, runner: Runner, sha: str, inside: str = "") -> None:
    """The session's last lines: REF's wrapper came from REF's worktree (at ``inside``), this tree's from here."""
    found = re.search(r"^llmperf: against: REF = .* wrapper from (\S+)$", inner_out, re.MULTILINE)
    assert found, inner_out
    where = Path(found.group(1))
    assert where.is_relative_to(runner.cache / "worktrees") and sha in where.parts, inner_out
    assert where.as_posix().endswith(f"{sha}/{inside}wrapper/__init__.py"), inner_out


def test_a_project_without_a_pytest_config_and_the_model_outside_it(runner: Runner, tmp_path: Path) -> None:
    """No pytest.ini: pytest's rootdir is the common folder of the test file and the model's (not
    a repository); the repository is found from the tests' own folder."""
    root = tmp_path / "project"
    (sha,) = make_repo(
        root,
        [("one", {"conftest.py": CONFTEST, "wrapper/__init__.py": WRAPPER.format(version=1), "test_perf.py": PERF})],
    )
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").symlink_to(_tiny(runner))
    inner = runner.run(
        root, "-rA", "--llmperf-model", str(models / "m.gguf"), "--llmperf-against", "git:HEAD", "test_perf.py"
    )
    assert inner.ret == 0, inner.out
    assert f"rootdir: {tmp_path}" in inner.out, inner.out  # the case: the rootdir is no repository
    assert pairs_note(inner, "test_marker_only", f"git:HEAD ({sha[:12]})") == 3
    _worktree_code(inner.out, runner, sha)
    runner.check_clean(root, inner.pids)


def _tiny(runner: Runner) -> Path:
    (model,) = [p for p in runner.cache.iterdir() if p.suffix == ".gguf"]
    return model.resolve()


def test_a_monorepo_whose_pytest_rootdir_is_a_tracked_subfolder(runner: Runner, tmp_path: Path) -> None:
    """The project is ``svc/`` of a larger repository (its pytest.ini there), run from the
    repository's top: REF's code under test is ``svc/`` of REF's worktree, not its top."""
    root = tmp_path / "mono"
    files = {
        "README.md": "the monorepo\n",
        "svc/pytest.ini": "[pytest]\n",
        "svc/conftest.py": CONFTEST,
        "svc/wrapper/__init__.py": WRAPPER.format(version=1),
        "svc/tests/test_perf.py": PERF,
    }
    shas = make_repo(root, [("one", files), ("two", {"svc/wrapper/__init__.py": WRAPPER.format(version=2)})])
    inner = runner.run(root, "svc/tests", "-rA", "--llmperf-against", "git:HEAD~1")
    assert inner.ret == 0, inner.out
    assert f"rootdir: {root / 'svc'}" in inner.out, inner.out
    assert pairs_note(inner, "test_marker_only", f"git:HEAD~1 ({shas[0][:12]})") == 3
    _worktree_code(inner.out, runner, shas[0], "svc/")
    assert "not compared" not in inner.out, inner.out
    runner.check_clean(root, inner.pids)


def test_code_under_test_in_a_submodule_is_filled_in_refs_worktree(runner: Runner, tmp_path: Path) -> None:
    """``wrapper/`` is a git submodule: REF's worktree gets the submodule at the commit REF pins,
    from this clone's own copy of it (no network), its index left as it was."""
    sub = tmp_path / "wrapper-repo"
    (sub_one,) = make_repo(sub, [("w1", {"__init__.py": WRAPPER.format(version=1)})])
    root = tmp_path / "repo"
    make_repo(root, [("one", {"conftest.py": CONFTEST, "tests/test_perf.py": PERF})])
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "wrapper")
    git(root, "commit", "-qm", "the wrapper, a submodule")
    ref = git(root, "rev-parse", "HEAD")
    (root / "wrapper" / "__init__.py").write_text(WRAPPER.format(version=2))
    git(root / "wrapper", "commit", "-qam", "w2")
    git(root, "commit", "-qam", "the wrapper moved on")
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:HEAD~1")
    assert inner.ret == 0, inner.out
    assert pairs_note(inner, "test_marker_only", f"git:HEAD~1 ({ref[:12]})") == 3
    _worktree_code(inner.out, runner, ref)
    found = re.search(r"^llmperf: against: REF = .* wrapper from (\S+)$", inner.out, re.MULTILINE)
    assert found and Path(found.group(1)).read_text() == WRAPPER.format(version=1)  # REF's pin, w1
    assert git(root / "wrapper", "status", "--porcelain") == "" and git(root, "status", "--porcelain") == ""
    assert git(root / "wrapper", "rev-parse", "HEAD") != sub_one
    runner.check_clean(root, inner.pids)


def test_a_folder_inside_another_repository_is_refused_in_one_line(runner: Runner, tmp_path: Path) -> None:
    """The project is no repository but lies in one (a home folder under git, say) that does not
    track it: git:HEAD would be the outer repository's; nothing is checked out or registered."""
    outer = tmp_path / "home"
    make_repo(outer, [("dotfiles", {".bashrc": "# mine\n"})])
    project = outer / "project"
    for name, text in {
        "conftest.py": CONFTEST,
        "wrapper/__init__.py": WRAPPER.format(version=1),
        "test_perf.py": PERF,
    }.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "pytest.ini").write_text("[pytest]\n")
    inner = runner.run(project, "--llmperf-against", "git:HEAD")
    assert inner.ret == 4, inner.out
    lines = [ln for ln in inner.out.splitlines() if ln.strip()]
    assert len(lines) == 1, inner.out
    assert lines[0] == (
        f"ERROR: llmperf: --llmperf-against git:HEAD: {project} is not tracked in the git repository around it "
        f"({outer}), so REV would be that repository's, not this project's: commit the folder there, or make "
        "it a repository of its own (git init)"
    ), lines
    assert len(git(outer, "worktree", "list").splitlines()) == 1 and inner.pids == []
    runner.check_clean(outer, [])


def _no_llama_cpp(tmp_path: Path) -> Path:
    """An interpreter in which llama-cpp-python cannot be imported (as in an environment without it)."""
    block = tmp_path / "no-llama"
    block.mkdir()
    (block / "llama_cpp.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'llama_cpp'\", name='llama_cpp')\n"
    )
    python = tmp_path / "python-without-llama"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{block}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_session_that_compared_nothing_fails_in_one_line(runner: Runner, tmp_path: Path) -> None:
    """REF is another environment without llama-cpp-python: no test can be compared there. Each
    is measured on this tree alone (not failed for it), and the session fails with one line
    saying why (a gate that compared nothing must not pass)."""
    root = tmp_path / "repo"
    make_repo(
        root,
        [("one", {"conftest.py": CONFTEST, "wrapper/__init__.py": WRAPPER.format(version=1), "test_perf.py": PERF})],
    )
    python = _no_llama_cpp(tmp_path)
    inner = runner.run(root, "-rA", "--llmperf-against", f"python:{python}")
    assert inner.ret == 1, inner.out
    assert outcome(inner, "test_marker_only") == "PASSED", inner.out
    (line,) = inner.lines("could be compared with REF")
    assert line.startswith(
        f"llmperf: --llmperf-against python:{python}: none of the 1 measurement(s) could be compared with REF, "
        "so the session fails (not compared: side REF"
    ), line
    assert "llama" in line and line.endswith("; --llmperf-allow-not-compared lets it pass"), line
    runner.check_clean(root, inner.pids)


def test_under_xdist_the_session_file_and_the_terminal_name_both_sides(runner: Runner, tmp_path: Path) -> None:
    """``-n 2``: the sides run on a worker; the controller's session file has the ``against``
    object and its terminal the ``against: current / REF`` lines."""
    root = tmp_path / "repo"
    plain = PERF + "\n\ndef test_plain():\n    pass\n"
    (sha,) = make_repo(
        root,
        [
            (
                "one",
                {
                    "conftest.py": CONFTEST,
                    "wrapper/__init__.py": WRAPPER.format(version=1),
                    "tests/test_perf.py": plain,
                },
            )
        ],
    )
    inner = runner.run(
        root, "tests", "-n", "2", "-rA", "--llmperf-against", "git:HEAD", "--llmperf-json", str(tmp_path / "s.json")
    )
    assert inner.ret == 0, inner.out
    assert pairs_note(inner, "test_marker_only", f"git:HEAD ({sha[:12]})") == 3
    assert len(inner.lines("llmperf: against: current = this tree: Python ")) == 1, inner.out
    _worktree_code(inner.out, runner, sha)
    against = json.loads((tmp_path / "s.json").read_text())["against"]
    assert against["ref"] == "git:HEAD" and against["described"] == f"git:HEAD ({sha[:12]})"
    assert set(against["sides"]) == {"current", "REF"}
    assert sha in against["sides"]["REF"]["code"]["wrapper"]
    runner.check_clean(root, inner.pids)
