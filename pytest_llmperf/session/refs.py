"""What ``--llmperf-against REF`` names (``git:REV``, ``python:PATH`` or both), made ready for a
side process: the revision checked out in a cached worktree (``Worktrees``), the interpreter
checked. Harness and test files always come from the current tree; only the code under test
(``code_packages``) is redirected to the reference's tree (``install_redirect``). Pytest-free;
every git or interpreter call has a deadline and reads no stdin.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.formats import escaped
from ..core.redact import redact

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

FORMS = "git:REV, python:PATH or git:REV,python:PATH"
GIT_TIMEOUT_S = 60.0
CHECKOUT_TIMEOUT_S = 300.0
PYTHON_CHECK_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = 600.0
EXCLUDED = {
    "conftest",
    "setup",
    "noxfile",
    "tests",
    "test",
    "testing",
    "docs",
    "examples",
    "benchmarks",
    "pytest_llmperf",
}
_GIT_LOCAL_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")  # set by git hooks
_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


@dataclass(frozen=True)
class Reference:
    text: str
    rev: str | None
    commit: str | None
    python: str | None
    python_version: str | None = None  # what ``python`` reported, e.g. "3.11.7"

    def describe(self) -> str:
        parts = [f"git:{self.rev} ({(self.commit or '')[:12]})"] if self.rev is not None else []
        return ", ".join(parts + ([f"python:{self.python}"] if self.python is not None else []))


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(f"llmperf: --llmperf-against {text!r}: {why}; give {FORMS}")


def parse_reference(text: str) -> tuple[str | None, str | None]:
    """``(rev, path)`` as given; a comma splits parts only where a ``word:`` follows (or at the end)."""
    given: dict[str, str] = {}
    for part in re.split(r",(?=\s*[A-Za-z][\w-]*:)|,\s*$", text.strip()):
        kind, value = _reference_part(text, part)
        if kind in given:
            raise _bad(text, f"{kind}: given twice")
        given[kind] = value
    return given.get("git"), given.get("python")


def _reference_part(text: str, part: str) -> tuple[str, str]:
    """One ``git:REV`` or ``python:PATH`` of ``text``: (kind, value)."""
    kind, sep, value = part.strip().partition(":")
    value = value.strip()
    if not sep or kind not in ("git", "python"):
        raise _bad(text, f"{part.strip()!r} is neither git:REV nor python:PATH")
    if not value or (kind == "git" and value.startswith("-")):
        what = f"{kind}: needs a {'REV' if kind == 'git' else 'PATH'}"
        raise _bad(text, what + (" not starting with '-'" if value else ""))
    return kind, value


def _run(
    cmd: Sequence[str], cwd: Path | None, timeout_s: float, extra_env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCAL_ENV}  # a git hook's GIT_DIR...
    env.update(extra_env or {})
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        env=env,
        errors="replace",
        check=False,
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return redact(escaped(lines[-1])) if lines else "no message"


def _git(
    cwd: Path, *args: str, timeout_s: float = GIT_TIMEOUT_S, check: bool = True, env: Mapping[str, str] | None = None
) -> str | None:
    """git's stdout; a failure is a ConfigError with git's last stderr line (None if not ``check``)."""
    what = f"llmperf: `git {' '.join(args)}` in {cwd}"
    try:
        out = _run(["git", *args], cwd, timeout_s, env)
    except OSError as e:  # git missing, or cwd
        raise ConfigError(
            "llmperf: git is not installed (needed for --llmperf-against git:REV)"
            if shutil.which("git") is None
            else f"{what} could not start: {e}"
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} took over {timeout_s:.0f} s") from None
    if out.returncode and check:
        raise ConfigError(f"{what} failed: {_last_line(out.stderr)}")
    return None if out.returncode else out.stdout.strip()


def _commit_of(rootdir: Path, rev: str) -> str:
    if _git(rootdir, "rev-parse", "--git-dir", check=False) is None:
        raise ConfigError(f"llmperf: --llmperf-against git:{rev}: {rootdir} is not in a git repository")
    if commit := _git(rootdir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False):
        return commit
    raise ConfigError(_why_no_commit(rootdir, rev))


def _why_no_commit(rootdir: Path, rev: str) -> str:
    """Why ``rev`` names no commit in the repository at ``rootdir``, and what to do."""
    top = _git(rootdir, "rev-parse", "--show-toplevel", check=False) or str(rootdir)
    say = f"llmperf: --llmperf-against git:{rev}: no commit {rev!r} in the repository at {top}"
    shallow = _git(rootdir, "rev-parse", "--is-shallow-repository", check=False) == "true"
    if not shallow and not _git(rootdir, "rev-list", "-n", "1", "--all", check=False):
        return f"{say}: it has no commits yet"
    walk = re.fullmatch(r"(.*?)((?:[~^]\d*)+)", rev)  # HEAD~5: back from a commit that exists
    base = (
        _git(rootdir, "rev-parse", "--verify", "--quiet", f"{walk.group(1)}^{{commit}}", check=False) if walk else None
    )
    if walk and base and not shallow:
        count = _git(rootdir, "rev-list", "--count", base, check=False) or "?"
        return (
            f"{say}: {walk.group(1)} ({base[:12]}) has only {count} commit(s) in its history; "
            f"{walk.group(2)} goes back further (or names a parent it lacks)"
        )
    return (
        f"{say}{' (a shallow clone)' if shallow else ''}; fetch it first (e.g. `git fetch origin {rev}`; in GitHub "
        "Actions: actions/checkout with fetch-depth: 0)"
    )


def _python_version(path: str) -> tuple[str, str]:
    """The interpreter's absolute path (symlinks kept; a bare name is looked up on PATH) and the
    version it reports."""
    bare = not any(s in path for s in (os.sep, os.altsep) if s)
    absolute = os.path.abspath((shutil.which(path) if bare else None) or path)
    say = f"llmperf: --llmperf-against python:{path}"
    if not os.path.exists(absolute):
        raise ConfigError(f"{say}: {f'no {path} on PATH' if bare else f'{absolute} does not exist'}")
    if not os.path.isfile(absolute) or not os.access(absolute, os.X_OK):
        raise ConfigError(f"{say}: {absolute} is not an executable file")
    code = "import sys; print(sys.version.split()[0])"
    try:
        out = _run([absolute, "-c", code], None, PYTHON_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{say}: `{absolute} -c ...` took over {PYTHON_CHECK_TIMEOUT_S:.0f} s") from None
    except OSError as e:
        raise ConfigError(f"{say}: could not run {absolute}: {e.strerror or e}") from None
    version = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    if not version or not re.fullmatch(r"\d+\.\d+\S*", version[0]):
        raise ConfigError(
            f"{say}: `{absolute} -c {code!r}` failed (exit {out.returncode}): {_last_line(out.stderr or out.stdout)}"
        )
    return absolute, version[0]


def resolve_reference(text: str, rootdir: Path) -> Reference:
    """REF made concrete; ``rootdir``: a folder in the repository (``Project.where``)."""
    rev, path = parse_reference(text)
    commit = _commit_of(Path(rootdir), rev) if rev is not None else None
    python, version = _python_version(path) if path is not None else (None, None)
    return Reference(text, rev, commit, python, version)


@dataclass(frozen=True)
class Project:
    """Where the project under test is: ``folder`` holds its code under test (at its root or in
    ``src/``: ``code_packages``); ``top`` is the git repository that tracks it (git:REV only).
    REF's worktree holds the folder at the same place below its top (``in_worktree``)."""

    folder: Path
    top: Path | None = None

    @property
    def where(self) -> Path:
        return self.top or self.folder

    def in_worktree(self, worktree: Path) -> Path:
        return Path(worktree) / self.folder.relative_to(self.top) if self.top is not None else self.folder


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def locate_project(
    rev: str | None, rootdir: Path, invocation_dir: Path, paths: Sequence[Path] = (), rootdir_chosen: bool = True
) -> Project:
    """The project of a session whose tests are ``paths`` (the command line's, made absolute),
    run from ``invocation_dir``. Its folder is pytest's rootdir when a configuration file (or
    ``--rootdir``, or a ``setup.py``) chose it (``rootdir_chosen``), else the invocation folder:
    without one, pytest's rootdir is the common folder of every path on the command line, a
    model's too. For git:REV the repository is the one the tests lie in (else the invocation
    folder's, the rootdir's), and the folder must be tracked there: a folder that is no
    repository but lies inside another one is refused in one line (REV would be the outer
    repository's)."""
    chosen, other = (_real(rootdir), _real(invocation_dir))[:: 1 if rootdir_chosen else -1]
    if rev is None:
        return Project(chosen)
    top = _repository_top(rev, paths, invocation_dir, rootdir)
    folder = next((f for f in (chosen, other) if f.is_relative_to(top)), top)
    _check_tracked(rev, folder, top)
    return Project(folder, top)


def _repository_top(rev: str, paths: Sequence[Path], invocation_dir: Path, rootdir: Path) -> Path:
    """The top of the git repository the tests lie in (else the invocation folder's, the rootdir's)."""
    starts = [_real(p if p.is_dir() else p.parent) for p in map(Path, paths) if p.exists()]
    starts += [_real(invocation_dir), _real(rootdir)]
    for start in starts:
        if found := _git(start, "rev-parse", "--show-toplevel", check=False):
            return _real(found)
    raise ConfigError(f"llmperf: --llmperf-against git:{rev}: {starts[0]} is not in a git repository")


def _check_tracked(rev: str, folder: Path, top: Path) -> None:
    """Refuse a project folder that the repository at ``top`` does not track."""
    inside = folder.relative_to(top).as_posix()
    if inside != "." and _git(top, "ls-files", "--error-unmatch", "--", f":(literal){inside}", check=False) is None:
        raise ConfigError(
            f"llmperf: --llmperf-against git:{rev}: {folder} is not tracked in the git repository around it "
            f"({top}), so REV would be that repository's, not this project's: commit the folder there, or make "
            "it a repository of its own (git init)"
        )


def _importable(entry: Path) -> str | None:
    """A package (a folder with __init__.py) or a module's name, unless it is a test's, a tool's or hidden."""
    is_module = entry.suffix == ".py" and entry.is_file()
    name = entry.name if (entry / "__init__.py").is_file() else entry.stem if is_module else ""
    excluded = name in EXCLUDED or name.startswith(("test", ".")) or name.endswith("_test")
    return name if name.isidentifier() and not excluded else None


def code_packages(rootdir: Path) -> tuple[str, tuple[str, ...]]:
    """The current tree's importable top-level names and the folder they sit in ("src" or ".")."""
    for base in ("src", "."):
        folder = Path(rootdir) / base
        if base == "src" and (not folder.is_dir() or (folder / "__init__.py").exists()):
            continue  # no src layout (or "src" is itself a package)
        names = sorted({n for e in folder.iterdir() if (n := _importable(e))})
        if names:
            return base, tuple(names)
    return ".", ()


class _Redirect(importlib.abc.MetaPathFinder):
    """Finds the code under test's top-level names in one folder only (submodules follow __path__)."""

    def __init__(self, code_root: Path, packages: Sequence[str]) -> None:
        self.code_root, self.packages = str(code_root), frozenset(packages)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        found = fullname in self.packages  # else (and when code_root lacks it) the usual finders look
        return importlib.machinery.PathFinder.find_spec(fullname, [self.code_root]) if found else None


def install_redirect(code_root: Path, packages: Sequence[str]) -> None:
    """Put the redirect first on sys.meta_path (replacing one installed before)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Redirect)]
    sys.meta_path.insert(0, _Redirect(Path(code_root).absolute(), packages))
    importlib.invalidate_caches()


def redirect_problems(code_root: Path, packages: Sequence[str]) -> list[str]:
    """A line for each of ``packages`` already imported from outside ``code_root``."""
    root, problems = Path(os.path.realpath(code_root)), []
    for name in packages:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        places: list[str] = [file] if file else list(getattr(module, "__path__", []))
        outside = [p for p in places if not Path(os.path.realpath(p)).is_relative_to(root)]
        if module is None or (places and not outside):
            continue
        why = (
            f": the reference's tree {code_root} has no {name}"
            if importlib.machinery.PathFinder.find_spec(name, [str(code_root)]) is None
            else f", not from {code_root}: it was imported before llmperf could redirect it (a .pth file or a plugin?)"
        )
        problems.append(f"{name} was imported from {outside[0] if outside else 'nowhere on disk'}{why}")
    return problems


def import_failure(exc: BaseException, code_root: Path, packages: Sequence[str]) -> str | None:
    """Where the code under test (``packages`` in ``code_root``) failed while a test module was imported, e.g.
    ``helper/__init__.py:1: ImportError: helper needs libfoo`` (an exception raised in one of its
    files, a syntax error in one); None when nothing of it failed (the test module asked it for a
    name it lacks: that is the test's, not the code's)."""
    root = Path(os.path.realpath(code_root))

    def under(filename: str | None) -> Path | None:
        path = Path(os.path.realpath(filename)) if filename and not filename.startswith("<") else None
        rel = path.relative_to(root) if path is not None and path.is_relative_to(root) else None
        return rel if rel is not None and rel.parts and Path(rel.parts[0]).stem in packages else None

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # the exception, then what it was raised from
        seen.add(id(cur))
        if isinstance(cur, SyntaxError) and (where := under(cur.filename)):
            return redact(f"{where.as_posix()}:{cur.lineno}: SyntaxError: {cur.msg}")
        tb, found = cur.__traceback__, None
        while tb is not None:
            if rel := under(tb.tb_frame.f_code.co_filename):
                found = f"{rel.as_posix()}:{tb.tb_lineno}"
            tb = tb.tb_next
        if found:
            return redact(" ".join(f"{found}: {type(cur).__name__}: {cur}".split())[:400])
        cur = cur.__cause__ or cur.__context__
    return None


def _flock(path: Path, shared: bool, wait_s: float) -> IO[str] | None:
    """An flock on ``path``: the open file that holds it (closing it, or the holder's death, releases
    it), None if not taken within ``wait_s``. Where there is no flock (Windows), a file that holds nothing."""
    try:
        import fcntl
    except ImportError:
        return open(os.devnull)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                return None
            time.sleep(0.2)


class Worktrees:
    """Checked-out revisions, cached across sessions under <cache_dir>/worktrees/<repo key>/<commit>.
    Each checkout is leased (a shared flock on ``<commit>.inuse``) until ``close()`` or until this
    object is collected, so another session never evicts a worktree still in use."""

    def __init__(self, rootdir: Path, cache_dir: Path, keep: int = 3) -> None:
        self.rootdir, self.keep = Path(rootdir), max(1, keep)
        common = _git(self.rootdir, "rev-parse", "--git-common-dir", check=False)
        if common is None:
            raise ConfigError(f"llmperf: --llmperf-against git:REV: {self.rootdir} is not in a git repository")
        key = hashlib.sha256(str((self.rootdir / common).resolve()).encode()).hexdigest()[:12]
        self.base = Path(cache_dir) / "worktrees" / key
        self.lock_path = self.base.with_name(f"{key}.lock")
        self._leases: dict[str, IO[str] | None] = {}

    def checkout(self, commit: str, needed: Sequence[str] = ()) -> Path:
        """The worktree of ``commit``, its submodules filled from this clone's own (``submodules``).
        A submodule this clone cannot fill that holds one of ``needed`` (paths below the top: the
        code under test) or lies in one is a ConfigError naming it."""
        sha = _git(self.rootdir, "rev-parse", "--verify", f"{commit}^{{commit}}") or commit
        path = self.base / sha
        with self._repo_lock():
            if not self._valid(path, sha):
                self._remove(path)
                _git(self.rootdir, "worktree", "prune")
                self.base.mkdir(parents=True, exist_ok=True)
                _git(
                    self.rootdir,
                    "worktree",
                    "add",
                    "--force",
                    "--force",
                    "--detach",
                    str(path),
                    sha,
                    timeout_s=CHECKOUT_TIMEOUT_S,
                )
                index = self.base / f"{sha}.index"  # a scratch index: the submodules' own stay as they are
                unfilled = submodules(self.rootdir, sha, path, index)
                index.unlink(missing_ok=True)
                if not unfilled:
                    (self.base / f"{sha}.ready").touch()  # whole: a session killed before this makes it again
                for where, line in unfilled:
                    if any(_overlap(where, n) for n in needed):
                        raise ConfigError(f"llmperf: --llmperf-against: {line}")
            os.utime(path)
            if sha not in self._leases:
                self._leases[sha] = _flock(self.base / f"{sha}.inuse", shared=True, wait_s=0)
            self._evict()
        return path

    def clear(self) -> None:
        """Remove every cached worktree of this repository (leased ones too)."""
        self.close()
        with self._repo_lock():
            for path in self._cached():
                self._remove(path)
            for lease in self.base.glob("*.inuse"):
                lease.unlink(missing_ok=True)
            _git(self.rootdir, "worktree", "prune", check=False)

    def close(self) -> None:
        for held in filter(None, self._leases.values()):
            held.close()
        self._leases.clear()

    @contextlib.contextmanager
    def _repo_lock(self) -> Iterator[None]:
        held = _flock(self.lock_path, shared=False, wait_s=LOCK_TIMEOUT_S)
        if held is None:
            raise ConfigError(f"llmperf: waited {LOCK_TIMEOUT_S:.0f} s for another checkout ({self.lock_path})")
        with held:
            yield

    def _cached(self) -> list[Path]:
        entries = [p for p in self.base.glob("*") if p.is_dir() and _SHA.fullmatch(p.name)]
        return sorted(entries, key=lambda p: p.stat().st_mtime_ns, reverse=True)

    def _valid(self, path: Path, sha: str) -> bool:
        """A whole checkout of ``sha``: a half-made one (a session killed mid-checkout) is not."""
        whole = (path / ".git").is_file() and (self.base / f"{sha}.ready").is_file()
        head = _git(path, "rev-parse", "HEAD", check=False) if whole else None
        return head == sha and _git(path, "status", "--porcelain", "--untracked-files=no", check=False) == ""

    def _remove(self, path: Path) -> None:
        (self.base / f"{path.name}.ready").unlink(missing_ok=True)
        if path.exists():
            _git(self.rootdir, "worktree", "remove", "--force", "--force", str(path), check=False)
            shutil.rmtree(path, ignore_errors=True)

    def _evict(self) -> None:
        """Remove this repository's worktrees beyond the ``keep`` most recently used, skipping leased ones."""
        for path in self._cached()[self.keep :]:
            lease = self.base / f"{path.name}.inuse"
            free = _flock(lease, shared=False, wait_s=0)
            if free is None:
                continue  # another session (or this one) uses it
            with free:
                self._remove(path)
            lease.unlink(missing_ok=True)  # under the repository's lock: nobody takes a lease now
        _git(self.rootdir, "worktree", "prune", check=False)


def _overlap(a: str, b: str) -> bool:
    """One of two paths below the top (posix) lies in the other."""
    pa, pb = Path(a).parts, Path(b).parts
    return pa[: len(pb)] == pb or pb[: len(pa)] == pa


def submodules(source: Path, commit: str, dest: Path, index: Path, below: str = "") -> list[tuple[str, str]]:
    """Fill the submodules of ``commit`` (of the repository at ``source``) in its checkout ``dest``
    from this clone's own (``source``'s checked-out submodules: their objects, no network), nested
    ones too; ``git worktree add`` leaves them empty. ``index``: a scratch index file. Returns
    (path below the top, one line) for each one that could not be filled."""
    listed = _git(source, "ls-tree", "-r", "-z", "--full-tree", commit, check=False) or ""
    unfilled: list[tuple[str, str]] = []
    for entry in filter(None, listed.split("\0")):
        meta, _, rel = entry.partition("\t")
        mode, _, sub = meta.split(" ")
        if mode != "160000":
            continue
        where, local = f"{below}{rel}", source / rel
        if not (local / ".git").exists():
            why = f"this clone has no {where} checked out: git submodule update --init {where}"
        elif _git(local, "cat-file", "-e", f"{sub}^{{commit}}", check=False) is None:
            why = f"a commit this clone's {where} lacks: git -C {where} fetch origin {sub}"
        else:
            target = dest / rel
            target.mkdir(parents=True, exist_ok=True)
            env = {"GIT_INDEX_FILE": str(index)}  # the submodule's own index stays as it is
            _git(local, "read-tree", sub, env=env)
            _git(
                local, "checkout-index", "-a", "-f", f"--prefix={target}{os.sep}", env=env, timeout_s=CHECKOUT_TIMEOUT_S
            )
            unfilled += submodules(local, sub, target, index, f"{where}/")
            continue
        unfilled.append((where, f"REF pins submodule {where} at {sub[:12]}, {why}"))
    return unfilled
