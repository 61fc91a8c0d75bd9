"""The one reader of the files a user hands us (baseline files, saved session reports): a
path that is not a regular file (a FIFO, ``/dev/zero``, a directory) is refused before it is
read, and so is a file over its size limit, each in one line, so no read waits on a writer
that never comes or reads without end.

Why ``MAX_DOCUMENT_MIB``: loading a baseline file is JSON parsing plus the schema check,
about 0.2 s per MiB on a 2-core x86-64 VM (a 31 MiB file of 2200 entries: 6.7 s), so the limit
bounds a load at about 7 s (docs/baselines.md). A baseline entry of 20 runs of 64 tokens is
about 15 KiB: the limit holds some 2000 entries, e.g. 100 tests on 20 machines, in one test
module's file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import LLMPerfError

#: The largest baseline file or session report read, in MiB.
MAX_DOCUMENT_MIB = 32

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RefusedFile(LLMPerfError):
    """Not a regular file, or over its size limit: never read (and never replaced by an update)."""


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is: "a directory", "a FIFO (named pipe)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result, what: str, limit_mib: float, todo: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(f"{path} is {file_kind(st.st_mode)}, not a regular file; give the path of a {what}")
    if st.st_size > limit_mib * 2**20:
        raise RefusedFile(
            f"{path} is {st.st_size / 2**20:.0f} MiB, over the {limit_mib:g} MiB a {what} may be; {todo}"
        )


def read_bytes(path: Path | str, what: str, todo: str, limit_mib: float = MAX_DOCUMENT_MIB) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit_mib`` MiB. Raises ``RefusedFile``
    (one line: ``what`` names the kind of file, ``todo`` what to do about a file too big), and
    ``OSError`` as ``open`` does (``FileNotFoundError`` for a missing file)."""
    path = Path(path)
    _check(path, os.stat(path), what, limit_mib, todo)
    # O_NONBLOCK: a FIFO swapped in after the check opens without waiting for a writer.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as fh:
        _check(path, os.fstat(fd), what, limit_mib, todo)
        data = fh.read(int(limit_mib * 2**20) + 1)
    if len(data) > limit_mib * 2**20:  # it grew after the check
        raise RefusedFile(f"{path} is over the {limit_mib:g} MiB a {what} may be; {todo}")
    return data


def read_text(path: Path | str, what: str, todo: str, limit_mib: float = MAX_DOCUMENT_MIB) -> str:
    """``read_bytes`` decoded as UTF-8 (``UnicodeDecodeError`` for other bytes)."""
    return read_bytes(path, what, todo, limit_mib).decode("utf-8")
