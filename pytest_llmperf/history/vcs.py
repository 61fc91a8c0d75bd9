"""The commit under test, whether the work tree had uncommitted changes, and the branch.

CI variables first (a CI checkout is often a detached HEAD), then ``git`` with a deadline; no
git, no repository: None (a history row without a commit is still a row).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Revision:
    commit: str | None
    dirty: bool | None
    branch: str | None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_sha(root: Path | str) -> str | None:
    """The commit under test: ``$GITHUB_SHA`` / ``$CI_COMMIT_SHA``, else git's HEAD, else None."""
    commit = next((os.environ[v] for v in ("GITHUB_SHA", "CI_COMMIT_SHA") if os.environ.get(v)), None)
    return commit or _git(Path(root), "rev-parse", "HEAD")


def revision(root: Path | str) -> Revision:
    root = Path(root)
    commit = commit_sha(root)
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    branch = next(
        (os.environ[v] for v in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME") if os.environ.get(v)),
        None,
    )
    if branch is None and commit:
        branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
        branch = None if branch == "HEAD" else branch  # detached
    return Revision(commit[:40] if commit else None, None if status is None else bool(status), branch)
