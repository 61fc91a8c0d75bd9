"""Which baselines the repository's last commit holds for a test: what tells a baseline lost
(its file deleted or emptied, or looked for in another folder than the one it was committed
in) from a test that never had one.

Read from git's HEAD, never from the working tree, and found from the test module's own
place, not from the rootdir: for each folder from the module's up to the repository's top, the
file ``<folder>/<baseline folder>/<module path from there>.json`` that the rootdir at that
folder would use (``store.module_file``). Whatever moved the rootdir or emptied the working
tree's file, the committed one is still found. Nothing in a repository (no git, no commit, a
file git cannot show in time): nothing is known, and a test without a baseline is a new test.
Asked only for a test that found no baseline (a few git calls each), never cached: HEAD moves
between sessions of one process."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import store

#: Each git call's deadline: a repository on a hung network disk must not hold the session.
GIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Committed:
    """A baseline file at HEAD that holds an entry of the test on this machine."""

    top: Path  # the repository's top folder
    path: str  # the file, relative to ``top`` (POSIX form), as git names it


def git_output(cwd: Path, *args: str, timeout_s: float = GIT_TIMEOUT_S) -> bytes | None:
    """git's stdout in ``cwd``; None where git fails, is missing or takes over ``timeout_s``."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _top(folder: Path) -> Path | None:
    out = git_output(folder, "rev-parse", "--show-toplevel")
    return Path(out.decode(errors="replace").strip()).resolve() if out else None


def candidates(module: Path, baseline_dir: str, top: Path) -> list[str]:
    """The baseline files of ``module`` that a rootdir at each folder from the module's up to
    ``top`` would read, relative to ``top``, nearest first (each once)."""
    found: list[str] = []
    for folder in [module.parent, *module.parent.parents]:
        path = store.module_file(folder / baseline_dir, module.relative_to(folder).as_posix())
        try:
            rel = path.resolve().relative_to(top).as_posix()
        except ValueError:  # a baseline folder outside the repository (an absolute one elsewhere)
            rel = None
        if rel is not None and rel not in found:
            found.append(rel)
        if folder == top:
            break
    return found


def _tracked(top: Path, paths: list[str]) -> list[str]:
    """Those of ``paths`` that HEAD holds, in the order given."""
    out = git_output(top, "ls-tree", "-z", "--name-only", "--full-tree", "HEAD", "--", *paths)
    held = set(out.decode(errors="replace").split("\0")) if out else set()
    return [p for p in paths if p in held]


def _tests(top: Path, path: str) -> dict[str, object]:
    """The ``tests`` of HEAD's ``path`` (empty where it is not a baseline file git can show)."""
    out = git_output(top, "cat-file", "blob", f"HEAD:{path}")
    try:
        tests = json.loads(out or b"{}").get("tests")
    except (ValueError, AttributeError):
        return {}
    return tests if isinstance(tests, dict) else {}


def committed(module: Path | str, baseline_dir: str, key: str, hardware_key: str) -> Committed | None:
    """The file at HEAD, nearest the module first, with an entry ``key`` recorded on
    ``hardware_key``; None where HEAD has none (a new test) or nothing is known (no git)."""
    module = Path(module).resolve()
    top = _top(module.parent)
    if top is None:
        return None
    for path in _tracked(top, candidates(module, baseline_dir, top)):
        entries = _tests(top, path).get(key)
        if isinstance(entries, dict) and hardware_key in entries:
            return Committed(top, path)
    return None
