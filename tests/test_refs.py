"""--llmperf-against REF: what REF names, resolved in real git repositories; the reference's
revision checked out in cached worktrees; the import redirect, in real subprocesses."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.settings import SETTINGS
from pytest_llmperf.session import refs
from pytest_llmperf.session.refs import Reference, Worktrees, code_packages, parse_reference, resolve_reference

CHECKOUT = Path(__file__).resolve().parent.parent
REF_HELP = SETTINGS["against"].help  # what --llmperf-against's help says
FORMS = "git:REV, python:PATH or git:REV,python:PATH"


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch, tmp_path):
    """Commits need an identity; the user's own git configuration stays out of the tests, and no
    repository above tmp_path is found."""
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "llmperf tests")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "tests@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo(tmp_path) -> tuple[Path, list[str]]:
    """A repository with four commits; commit i has mypkg.VALUE = i + 1."""
    root = tmp_path / "repo"
    (root / "mypkg").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    shas = []
    for i in range(1, 5):
        (root / "mypkg" / "__init__.py").write_text(f"VALUE = {i}\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(root, "rev-parse", "HEAD"))
    git(root, "tag", "v1", shas[0])
    return root, shas


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    return message


# -- what REF says ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("git:main", ("main", None)),
        (" git:origin/main ", ("origin/main", None)),
        ("python:/venvs/old/bin/python", (None, "/venvs/old/bin/python")),
        ("git:HEAD~1,python:/v/bin/python", ("HEAD~1", "/v/bin/python")),
        ("python:/v/bin/python,git:HEAD~1", ("HEAD~1", "/v/bin/python")),
        ("python:/opt/a,b/python", (None, "/opt/a,b/python")),  # a comma splits only before git:/python:
    ],
)
def test_parse_reference_accepts_the_three_forms(text, expected):
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "main",
        "HEAD~1",
        "svn:r12",
        "GIT:main",
        "git:",
        "python:",
        "git: ",
        "git:a,git:b",
        "python:/a,python:/b",
        "git:main,",
        "git:--output=/tmp/x",
        "git:main,svn:x",
    ],
)
def test_parse_reference_rejects_anything_else_in_one_line_naming_the_forms(text):
    with pytest.raises(ConfigError) as error:
        parse_reference(text)
    assert FORMS in one_line(error)
    assert "--llmperf-against" in str(error.value)


def test_help_names_the_three_forms():
    assert "git:REV" in REF_HELP and "python:PATH" in REF_HELP and "git:REV,python:PATH" in REF_HELP
    assert "\n" not in REF_HELP


# -- git:REV ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rev, index", [("HEAD~1", 2), ("main", 3), ("v1", 0)])
def test_a_revision_resolves_to_its_full_commit(repo, rev, index):
    root, shas = repo
    ref = resolve_reference(f"git:{rev}", root / "mypkg")  # from a subfolder too
    assert ref == Reference(f"git:{rev}", rev, shas[index], None)
    assert ref.describe() == f"git:{rev} ({shas[index][:12]})"


def test_an_unknown_revision_is_one_line_that_names_it_and_says_what_to_do(repo):
    root, _ = repo
    with pytest.raises(ConfigError) as error:
        resolve_reference("git:origin/nosuch", root)
    message = one_line(error)
    assert "'origin/nosuch'" in message and str(root) in message
    assert "git fetch origin origin/nosuch" in message and "fetch-depth: 0" in message


def test_outside_a_repository_is_one_line(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ConfigError) as error:
        resolve_reference("git:main", plain)
    assert one_line(error) == f"llmperf: --llmperf-against git:main: {plain} is not in a git repository"
    with pytest.raises(ConfigError, match="is not in a git repository"):
        Worktrees(plain, tmp_path / "cache")


# -- python:PATH -----------------------------------------------------------------------------


def test_an_interpreter_is_checked_and_kept_as_given_made_absolute(tmp_path, monkeypatch):
    ref = resolve_reference(f"python:{sys.executable}", tmp_path)
    assert (ref.rev, ref.commit, ref.python) == (None, None, sys.executable)
    assert ref.python_version == platform.python_version()
    assert ref.describe() == f"python:{sys.executable}"
    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert resolve_reference("python:bin/python", tmp_path / "elsewhere").python == str(link)  # not resolved


def test_both_parts_together(repo):
    root, shas = repo
    ref = resolve_reference(f"python:{sys.executable},git:HEAD", root)
    assert ref.describe() == f"git:HEAD ({shas[3][:12]}), python:{sys.executable}"


def _script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def test_an_interpreter_that_is_not_there_or_not_runnable_is_one_line(tmp_path):
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path): "is not an executable file",
        str(_script(tmp_path / "noexec", "exit 0", mode=0o644)): "is not an executable file",
        str(
            _script(tmp_path / "fails", "echo 'Traceback' >&2; echo 'ImportError: no sys here' >&2; exit 3")
        ): "failed (exit 3): ImportError: no sys here",
        str(_script(tmp_path / "chatty", "echo hello")): "failed (exit 0): hello",
        "no-such-python-llmperf": "no no-such-python-llmperf on PATH",
    }
    for path, expected in cases.items():
        with pytest.raises(ConfigError) as error:
            resolve_reference(f"python:{path}", tmp_path)
        message = one_line(error)
        assert message.startswith(f"llmperf: --llmperf-against python:{path}: ") and expected in message, message


def test_an_interpreter_that_hangs_meets_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(refs, "PYTHON_CHECK_TIMEOUT_S", 0.5)
    hangs = _script(tmp_path / "hangs", "exec sleep 60")
    with pytest.raises(ConfigError, match=r"took over 0 s|took over 1 s"):
        resolve_reference(f"python:{hangs}", tmp_path)


# -- the code under test ---------------------------------------------------------------------


def _tree(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


NOT_CODE = [
    "tests/__init__.py",
    "test/__init__.py",
    "testing/__init__.py",
    "docs/__init__.py",
    "examples/__init__.py",
    "benchmarks/__init__.py",
    "test_things.py",
    "things_test.py",
    "conftest.py",
    "setup.py",
    "noxfile.py",
    ".hidden/__init__.py",
    "my-pkg/__init__.py",
    "nsonly/mod.py",
    "pytest_llmperf/__init__.py",
    "README.md",
    "notes.txt",
]


def test_code_packages_in_a_src_layout(tmp_path):
    root = _tree(
        tmp_path,
        [
            "src/alpha/__init__.py",
            "src/alpha/core.py",
            "src/beta.py",
            "src/mypkg.egg-info/PKG-INFO",
            "toplevel.py",
            "other/__init__.py",
            *[f"src/{n}" for n in NOT_CODE],
            *NOT_CODE,
        ],
    )
    assert code_packages(root) == ("src", ("alpha", "beta"))


def test_code_packages_in_a_flat_layout(tmp_path):
    root = _tree(tmp_path, ["zeta/__init__.py", "alpha/__init__.py", "tool.py", "src/x.egg-info/PKG-INFO", *NOT_CODE])
    assert code_packages(root) == (".", ("alpha", "tool", "zeta"))


def test_code_packages_when_there_are_none(tmp_path):
    assert code_packages(_tree(tmp_path, NOT_CODE)) == (".", ())
    assert code_packages(_tree(tmp_path / "s", ["src/__init__.py", "src/a.py"])) == (".", ("src",))


# -- the import redirect, in a side process --------------------------------------------------

REDIRECTED = ["mypkg", "gone"]


def _two_trees(tmp_path: Path) -> tuple[Path, Path]:
    """mypkg (with a submodule), other and gone in the current tree; mypkg and other in the reference's."""
    cur, ref = tmp_path / "cur", tmp_path / "ref"
    for tree, names in (
        (cur, ["mypkg/__init__.py", "mypkg/sub.py", "other.py", "gone.py"]),
        (ref, ["mypkg/__init__.py", "mypkg/sub.py", "other.py"]),
    ):
        for name in names:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(f"WHERE = {tree.name!r}\n")
    return cur, ref


def _side(cur: Path, ref: Path, setup: str, redirect: bool, import_first: bool = False) -> dict:
    code = textwrap.dedent(f"""
        import json, sys
        cur, ref = {str(cur)!r}, {str(ref)!r}
        {setup}
        if {import_first!r}:
            import mypkg
        from pytest_llmperf.session.refs import install_redirect, redirect_problems
        if {redirect!r}:
            install_redirect(ref, {REDIRECTED!r})
        import mypkg, mypkg.sub, other, gone
        print(json.dumps({{"mypkg": mypkg.WHERE, "sub": mypkg.sub.WHERE, "other": other.WHERE, "gone": gone.WHERE,
                           "file": mypkg.__file__, "problems": redirect_problems(ref, {REDIRECTED!r})}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cur.parent,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _editable_finder(site: Path, cur: Path) -> str:
    """What setuptools' editable install writes (its own finder code): mypkg mapped to the current tree."""
    editable_wheel = pytest.importorskip("setuptools.command.editable_wheel")
    template = getattr(editable_wheel, "_finder_template", None)
    if template is None:
        pytest.skip("this setuptools writes its editable finder differently")
    site.mkdir()
    name = "__editable___mypkg_0_1_finder"
    (site / f"{name}.py").write_text(template(name, {"mypkg": str(cur / "mypkg")}, {}))
    (site / "__editable__.mypkg-0.1.pth").write_text(f"import {name}; {name}.install()\n")
    return f"import site; site.addsitedir({str(site)!r})"


@pytest.mark.parametrize("how", ["sys.path[0]", "a .pth file", "an editable finder"])
def test_the_redirect_wins_over_another_tree_that_has_the_package(tmp_path, how):
    cur, ref = _two_trees(tmp_path)
    if how == "sys.path[0]":
        setup = "sys.path.insert(0, cur)"
    elif how == "a .pth file":
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "cur.pth").write_text(f"{cur}\n")
        setup = f"import site; site.addsitedir({str(tmp_path / 'site')!r})"
    else:
        setup = _editable_finder(tmp_path / "site", cur) + "; sys.path.append(cur)"
    plain = _side(cur, ref, setup, redirect=False)
    assert (plain["mypkg"], plain["sub"]) == ("cur", "cur")  # without it, the other tree wins
    side = _side(cur, ref, setup, redirect=True)
    assert (side["mypkg"], side["sub"], side["file"]) == ("ref", "ref", str(ref / "mypkg" / "__init__.py"))
    assert side["other"] == "cur"  # only the names given are redirected
    assert side["gone"] == "cur"  # the reference lacks it: the usual finders found it, and that is said
    assert side["problems"] == [f"gone was imported from {cur / 'gone.py'}: the reference's tree {ref} has no gone"]


def test_a_package_imported_before_the_redirect_is_reported(tmp_path):
    cur, ref = _two_trees(tmp_path)
    side = _side(cur, ref, "sys.path.insert(0, cur)", redirect=True, import_first=True)
    assert side["mypkg"] == "cur"
    assert side["problems"][0] == (
        f"mypkg was imported from {cur / 'mypkg' / '__init__.py'}, not from {ref}: it was imported before "
        "llmperf could redirect it (a .pth file or a plugin?)"
    )
    assert len(side["problems"]) == 2  # and gone, which the reference lacks


# -- worktrees -------------------------------------------------------------------------------


def listed(root: Path) -> list[Path]:
    """The worktrees git knows of (the main one first)."""
    lines = git(root, "worktree", "list", "--porcelain").splitlines()
    return [Path(line.split(" ", 1)[1]).resolve() for line in lines if line.startswith("worktree ")]


def checkout(root: Path, cache: Path, commit: str, keep: int = 3) -> Path:
    trees = Worktrees(root, cache, keep=keep)
    try:
        return trees.checkout(commit)
    finally:
        trees.close()


def test_a_checkout_is_made_once_and_reused(repo, tmp_path):
    root, shas = repo
    cache = tmp_path / "cache"
    path = checkout(root, cache, shas[0])
    assert path.parent.parent == cache / "worktrees" and path.name == shas[0]
    assert (path / "mypkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert git(path, "rev-parse", "HEAD") == shas[0]
    assert listed(root).count(path.resolve()) == 1
    before = (path / "mypkg" / "__init__.py").stat()
    (path / "untracked-marker").write_text("a checkout made again would not have me")
    os.utime(path, ns=(1, 1))
    again = checkout(root, cache, "v1")  # the same commit by another name
    assert again == path and (path / "untracked-marker").exists()
    after = (path / "mypkg" / "__init__.py").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert path.stat().st_mtime_ns > 1  # touched on use


def _break(how: str, root: Path, path: Path, shas: list[str]) -> None:
    if how == "a file deleted":
        (path / "mypkg" / "__init__.py").unlink()
    elif how == "a file changed":
        (path / "mypkg" / "__init__.py").write_text("VALUE = 'edited'\n")
    elif how == "another commit":
        git(path, "checkout", "-q", "--detach", shas[2])
    elif how == "not a worktree":
        shutil.rmtree(path)
        (path / "mypkg").mkdir(parents=True)
        (path / "mypkg" / "__init__.py").write_text("VALUE = 1\n")
    elif how == "locked mid-checkout":
        git(root, "worktree", "lock", "--reason", "initializing", str(path))
        (path / "mypkg" / "__init__.py").unlink()
    elif how == "git's record gone":
        shutil.rmtree(root / ".git" / "worktrees")


@pytest.mark.parametrize(
    "how",
    [
        "a file deleted",
        "a file changed",
        "another commit",
        "not a worktree",
        "locked mid-checkout",
        "git's record gone",
    ],
)
def test_a_half_made_or_changed_checkout_is_made_again(repo, tmp_path, how):
    root, shas = repo
    cache = tmp_path / "cache"
    path = checkout(root, cache, shas[0])
    _break(how, root, path, shas)
    assert checkout(root, cache, shas[0]) == path
    assert (path / "mypkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert git(path, "rev-parse", "HEAD") == shas[0]
    assert git(path, "status", "--porcelain") == ""
    assert listed(root).count(path.resolve()) == 1


def test_worktrees_beyond_keep_are_removed_least_recently_used_first(repo, tmp_path):
    root, shas = repo
    cache = tmp_path / "cache"
    paths = [checkout(root, cache, sha, keep=2) for sha in shas[:3]]
    assert not paths[0].exists() and paths[0].resolve() not in listed(root)
    assert all(p.exists() and p.resolve() in listed(root) for p in paths[1:])
    checkout(root, cache, shas[1], keep=2)  # used again: now the most recent
    newest = checkout(root, cache, shas[3], keep=2)
    assert not paths[2].exists() and paths[2].resolve() not in listed(root)
    assert paths[1].exists() and newest.exists()
    assert set(listed(root)[1:]) == {paths[1].resolve(), newest.resolve()}


def test_a_worktree_in_use_by_another_session_is_not_evicted(repo, tmp_path):
    root, shas = repo
    cache = tmp_path / "cache"
    using = Worktrees(root, cache, keep=1)
    held = using.checkout(shas[0])
    second = checkout(root, cache, shas[1], keep=1)
    third = checkout(root, cache, shas[2], keep=1)
    assert held.exists() and held.resolve() in listed(root)  # the oldest, but leased
    assert not second.exists()
    using.close()
    checkout(root, cache, shas[2], keep=1)
    assert not held.exists() and held.resolve() not in listed(root) and third.exists()


def test_clear_removes_every_cached_worktree_of_the_repository(repo, tmp_path):
    root, shas = repo
    trees = Worktrees(root, tmp_path / "cache")
    made = [trees.checkout(sha) for sha in shas[:2]]
    trees.clear()
    assert not any(p.exists() for p in made)
    assert listed(root) == [root.resolve()]


def test_sessions_checking_out_at_once_share_one_worktree(repo, tmp_path):
    root, shas = repo
    code = (
        "import sys, time; from pytest_llmperf.session.refs import Worktrees; "
        "time.sleep(max(0.0, float(sys.argv[4]) - time.time())); "  # all start together
        "print(Worktrees(sys.argv[1], sys.argv[2]).checkout(sys.argv[3]))"
    )
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    start = str(time.time() + 3.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(root), str(tmp_path / "cache"), shas[1], start],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    paths = {Path(out.strip()) for out, _ in outs}
    assert len(paths) == 1 and listed(root).count(paths.pop().resolve()) == 1


def test_the_cache_is_keyed_by_the_repository(repo, tmp_path):
    root, shas = repo
    cache = tmp_path / "cache"
    base = Worktrees(root, cache).base
    assert Worktrees(root / "mypkg", cache).base == base
    git(root, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"), shas[0])
    assert Worktrees(tmp_path / "linked", cache).base == base  # a linked worktree: the same repository
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    assert Worktrees(other, cache).base != base


def test_an_unknown_commit_to_check_out_is_one_line(repo, tmp_path):
    root, _ = repo
    with pytest.raises(ConfigError) as error:
        Worktrees(root, tmp_path / "cache").checkout("deadbeef")
    assert "deadbeef" in one_line(error)


# -- a revision that does not exist, where the project is (issue 37) -------------------------


def test_a_revision_beyond_the_history_or_in_an_empty_repository_is_said_so(repo, tmp_path):
    """Not "fetch it": a commit that cannot exist is said not to (fetching would not help)."""
    root, shas = repo
    with pytest.raises(ConfigError) as error:
        resolve_reference("git:HEAD~5", root)
    assert one_line(error) == (
        f"llmperf: --llmperf-against git:HEAD~5: no commit 'HEAD~5' in the repository at {root}: HEAD "
        f"({shas[3][:12]}) has only 4 commit(s) in its history; ~5 goes back further (or names a parent it lacks)"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    for rev in ("HEAD", "HEAD~5", "main"):
        with pytest.raises(ConfigError) as error:
            resolve_reference(f"git:{rev}", empty)
        assert one_line(error) == (
            f"llmperf: --llmperf-against git:{rev}: no commit {rev!r} in the repository at {empty}: it has no commits yet"
        )


def _layout(tmp_path: Path) -> Path:
    """A monorepo: ``svc/`` (tracked) and ``new/`` (not)."""
    root = tmp_path / "mono"
    for name in ("svc/wrapper/__init__.py", "svc/tests/test_perf.py", "README.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    (root / "new" / "tests").mkdir(parents=True)
    return root


def test_the_project_is_found_from_the_tests_and_mapped_into_the_worktree(tmp_path):
    from pytest_llmperf.session.refs import Project, locate_project

    root = _layout(tmp_path)
    svc, tests = root / "svc", root / "svc" / "tests" / "test_perf.py"
    # A pytest.ini in svc/ chose the rootdir: the project is svc/, wherever pytest was started.
    assert locate_project("HEAD", svc, root, [tests], rootdir_chosen=True) == Project(svc, root)
    # None: the rootdir is the common folder of the command line's paths (a model's too), above the
    # repository; the project is the invocation folder, the repository the tests'.
    assert locate_project("HEAD", tmp_path, svc, [tests], rootdir_chosen=False) == Project(svc, root)
    assert locate_project("HEAD", Path("/"), root, [tests], rootdir_chosen=False) == Project(root, root)
    assert Project(svc, root).in_worktree(tmp_path / "wt") == tmp_path / "wt" / "svc"
    assert locate_project(None, tmp_path, svc, [tests], rootdir_chosen=False) == Project(svc)  # python:PATH
    with pytest.raises(ConfigError) as error:
        locate_project("HEAD", root / "new", root / "new", [root / "new" / "tests"])
    assert one_line(error).startswith(
        f"llmperf: --llmperf-against git:HEAD: {root / 'new'} is not tracked in the git repository around it ({root})"
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ConfigError, match=f"{plain} is not in a git repository"):
        locate_project("HEAD", Path("/"), plain, [plain])


def _with_submodule(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose ``lib/`` is a submodule: at HEAD~1 it pins the submodule's first commit."""
    sub = tmp_path / "sub"
    (sub / "wrapper").mkdir(parents=True)
    (sub / "wrapper" / "__init__.py").write_text("VALUE = 1\n")
    git(sub, "init", "-q", "-b", "main")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "one")
    first = git(sub, "rev-parse", "HEAD")
    root = tmp_path / "root"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "lib")
    git(root, "commit", "-qm", "lib")
    (root / "lib" / "wrapper" / "__init__.py").write_text("VALUE = 2\n")
    git(root / "lib", "commit", "-qam", "two")
    git(root, "commit", "-qam", "lib moved on")
    return root, git(root, "rev-parse", "HEAD~1"), first


def test_a_submodule_is_filled_from_this_clones_own_or_named_in_one_line(tmp_path):
    root, ref, first = _with_submodule(tmp_path)
    cache = tmp_path / "cache"
    trees = Worktrees(root, cache)
    path = trees.checkout(ref, ["lib/wrapper"])
    assert (path / "lib" / "wrapper" / "__init__.py").read_text() == "VALUE = 1\n"  # REF's pin, not HEAD's
    assert git(path, "status", "--porcelain") == "" and git(root / "lib", "status", "--porcelain") == ""
    assert trees.checkout(ref, ["lib/wrapper"]) == path  # whole: reused
    trees.clear()
    # This clone has no checkout of the submodule (never initialized): the session stops, naming it.
    shutil.rmtree(root / ".git" / "modules" / "lib")
    shutil.rmtree(root / "lib")
    (root / "lib").mkdir()
    with pytest.raises(ConfigError) as error:
        Worktrees(root, cache).checkout(ref, ["lib/wrapper"])
    assert one_line(error) == (
        f"llmperf: --llmperf-against: REF pins submodule lib at {first[:12]}, this clone has no lib checked out: "
        "git submodule update --init lib"
    )
    assert Worktrees(root, cache).checkout(ref, ["other"]).is_dir()  # a submodule no code under test is in


def test_a_submodule_commit_this_clone_lacks_is_named_in_one_line(tmp_path):
    root, _, _ = _with_submodule(tmp_path)
    missing = "1" * 40  # REF pins a commit this clone of the submodule never fetched
    git(root, "update-index", "--cacheinfo", f"160000,{missing},lib")
    git(root, "commit", "-qm", "lib at a commit fetched nowhere here")
    with pytest.raises(ConfigError) as error:
        Worktrees(root, tmp_path / "cache").checkout(git(root, "rev-parse", "HEAD"), ["lib/wrapper"])
    assert one_line(error) == (
        f"llmperf: --llmperf-against: REF pins submodule lib at {missing[:12]}, a commit this clone's lib lacks: "
        f"git -C lib fetch origin {missing}"
    )
