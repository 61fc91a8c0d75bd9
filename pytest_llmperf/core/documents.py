"""Documents a user hands us: the one reader of user-given files, the one writer of the
outputs a user names, and the check of a document against a published JSON Schema (the
checker is ``core.schemas``'; ``load_schema`` adds the metric catalog's figures to the session
schema).

The reader (baseline files, saved session reports): a path that is not a regular file (a FIFO, ``/dev/zero``, a directory) is refused before it is
read, and so is a file over its size limit, each in one line, so no read waits on a writer
that never comes or reads without end.

The writer (``--llmperf-json``/``-markdown``/``-html``, ``llmperf report -o``, ``profile
-o``, ``history --html``): ``write_output``. A regular file is
written atomically (a temporary file renamed over it); what is not a regular file is never
renamed over: a character device or FIFO (``/dev/null``, a named pipe) is written in place,
``-`` and ``/dev/stdout`` are standard output, and a directory, block device or socket is
refused in one line (run as root, a rename over ``/dev/full`` would replace the device).

Why ``MAX_DOCUMENT_MIB``: loading a baseline file is JSON parsing plus the schema check,
about 0.2 s per MiB on a 2-core x86-64 VM (a 31 MiB file of 2200 entries: 6.7 s), so the limit
bounds a load at about 7 s (docs/baselines.md). A baseline entry of 20 runs of 64 tokens is
about 15 KiB: the limit holds some 2000 entries, e.g. 100 tests on 20 machines, in one test
module's file.

The schemas are ``pytest_llmperf/schemas/*.schema.json``, checked by ``core.schemas``."""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .catalog import FIGURES
from .errors import ConfigError, LLMPerfError
from .formats import JSONValue as JSONValue  # noqa: PLC0414 (the documents' JSON value, read from here too)
from .formats import shown
from .schemas import ANNOTATIONS, KEYWORDS, Schema, SchemaViolation, check, schema_file

__all__ = ["ANNOTATIONS", "KEYWORDS", "SchemaViolation", "check", "load_schema", "validate"]

#: The largest baseline file or session report read, in MiB.
MAX_DOCUMENT_MIB = 32

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice: Python's ``json`` keeps the last silently, so
    which value counts would be the reader's guess (a merge of two branches' baseline files
    leaves such a file). A ValueError, as ``json.JSONDecodeError`` is; one line."""


def _unique(pairs: list[tuple[str, JSONValue]]) -> dict[str, JSONValue]:
    found: dict[str, JSONValue] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(
                f"duplicate key {shown(key)} in one JSON object ({_brief(found[key])} and {_brief(value)})"
            )
        found[key] = value
    return found


def _brief(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 24 else text[:21] + "..."


def loads(text: str | bytes) -> Any:
    """``json.loads`` for every JSON we read (files, server responses, caches): a key given
    twice in one object raises ``DuplicateKey`` naming it, never last-wins."""
    return json.loads(text, object_pairs_hook=_unique)


class RefusedFile(LLMPerfError):
    """Not a regular file, or over its size limit: never read (and never replaced by an update)."""


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is: "a directory", "a FIFO (named pipe)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result, what: str, limit_mib: float, todo: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(f"{path} is {file_kind(st.st_mode)}, not a regular file; give the path of a {what}")
    if st.st_size > limit_mib * 2**20:
        raise RefusedFile(f"{path} is {st.st_size / 2**20:.0f} MiB, over the {limit_mib:g} MiB a {what} may be; {todo}")


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


def read_workload_file(path: Path, noun: str, what: str, todo: str) -> str:
    """A workload's file (a prompt set, a conversation, a trace: ``noun``) as text; what stops
    it (missing, not UTF-8, refused by ``read_bytes``) one ConfigError line naming the file."""
    try:
        return read_text(path, what, todo)
    except FileNotFoundError:
        raise ConfigError(f"{noun} {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{noun} {path}: not UTF-8 text (byte {exc.start})") from None
    except (OSError, RefusedFile) as exc:
        raise ConfigError(f"{noun} {path}: {exc}") from None


def jsonl_values(text: str, source: str) -> Iterator[tuple[int, object]]:
    """JSONL text's values with their line numbers, blank lines skipped; a ConfigError
    ``source:line: not JSON (...)`` for a line that is not. JSONL's lines are split at ``\n``
    only (not ``splitlines``': U+2028 or ``\x85`` may stand inside a text)."""
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield number, loads(line)
        except ValueError as exc:
            raise ConfigError(f"{source}:{number}: not JSON ({exc})") from None


#: Output paths that mean this process's standard output (``--llmperf-json=-``, ``-o -``).
STDOUT_PATHS = ("-", "/dev/stdout")
#: Special files an output is written into in place (opened for writing; never renamed over).
_IN_PLACE = (stat.S_ISCHR, stat.S_ISFIFO)


def output_kind(path: Path | str) -> str:
    """How ``write_output`` writes ``path``: "stdout", "in place" (a character device or a
    FIFO, or a symlink to one) or "file" (a regular file, or nothing yet: a temporary file
    renamed over it). Raises ``OSError`` (its ``strerror`` one line) for a path no report may
    go to: a directory, a block device, a socket."""
    if str(path) in STDOUT_PATHS:
        return "stdout"
    try:
        mode = os.stat(path).st_mode  # through symlinks: what a write would reach
    except (FileNotFoundError, NotADirectoryError):  # a new file (its folders are checked when it is written)
        return "file"
    if stat.S_ISREG(mode):
        return "file"
    if any(test(mode) for test in _IN_PLACE):
        return "in place"
    raise OSError(
        errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
        f"it is {file_kind(mode)}; give a file path, a character device, a FIFO or - (standard output)",
    )


def check_output(path: Path | str) -> None:
    """Raise ``OSError`` (its ``strerror`` the one line) when ``write_output`` could not
    write ``path``: a directory, block device or socket there, a file in the way of its
    folders, a folder this process may not write. Checked before the work that fills the
    output (a report lost after minutes of measuring helps no one). Creates nothing: the
    folders to make are made when the file is written."""
    if output_kind(path) != "file":  # standard output, a device or FIFO: written in place
        return
    folder = real_path(path).parent  # through a symlink: where the file is written
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    fd, tmp = tempfile.mkstemp(prefix=".llmperf-check-", dir=folder)
    os.close(fd)
    os.unlink(tmp)


def refused_output(path: Path | str, exc: OSError, flag: str) -> str:
    """The one line of an output ``path`` that cannot be written: its reason and, unless the
    reason says what to give instead, ``give FLAG a writable path``."""
    reason = exc.strerror or str(exc)
    return f"cannot write {path}: {reason}" + ("" if "; give " in reason else f"; give {flag} a writable path")


def check_output_folder(path: Path | str) -> None:
    """Raise ``OSError`` (its ``strerror`` the one line) when files could not be written into
    the folder ``path`` (made when missing): something else is there (a file, a FIFO, a
    device), or it cannot be made or written."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        check_output(Path(path) / "file")  # its nearest existing folder must take files
        return
    if not stat.S_ISDIR(mode):
        kind = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
        raise OSError(errno.ENOTDIR, f"it is {kind}, not a folder; give a folder (made when missing)")
    check_output(Path(path) / "file")


def write_output(path: Path | str, text: str) -> str:
    """``text`` to a path a user named for an output (a report, a profile), the one writer of
    those: ``-`` and ``/dev/stdout`` are standard output; a character device or a FIFO
    (``/dev/null``, ``/dev/full``, a named pipe, a symlink to one) is opened and written in
    place, never created, truncated or renamed over; a FIFO that no process reads fails at
    once instead of waiting; anything else goes through ``atomic_write`` (a symlink to a
    regular file writes its target). Raises ``OSError`` whose ``strerror`` is the one line to
    show (``ENOSPC`` from ``/dev/full``...); a failed write leaves no temporary file. Returns
    the kind written (``output_kind``)."""
    kind = output_kind(path)
    if kind == "stdout":
        sys.stdout.write(text)
        sys.stdout.flush()
    elif kind == "in place":
        _write_in_place(str(path), text.encode("utf-8"))
    else:
        atomic_write(Path(path), text)
    return kind


def _write_in_place(path: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)  # no O_CREAT: a device swapped out after the check is not created
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO with no reader: O_NONBLOCK says so instead of waiting
            raise OSError(errno.ENXIO, "no process is reading this FIFO; start its reader first") from None
        raise
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by a regular file since the check
            raise OSError(errno.EINVAL, "it became a regular file while being written; write it again")
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _file_mode(path: Path) -> int:
    """The existing file's mode, else 0o666 less the process umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def real_path(path: Path | str) -> Path:
    """Where a write of ``path`` lands: a symlink's target (resolved all the way), so the
    link stays a link and its target gets the new text."""
    return Path(os.path.realpath(path))


def write_new(path: Path, text: str) -> None:
    """``text`` into a new regular file ``path``, never over anything there (``FileExistsError``,
    one line): created exclusively, written whole, or removed again on a failed write."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "it exists; a file written new is never overwritten") from None
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def atomic_write(path: Path, text: str) -> None:
    """``text`` into the regular file ``path`` (through a symlink, into its target): a
    temporary file in the target's folder, fsynced, renamed over the target; on any failure
    the temporary file is removed and the target is as it was. A target that exists and is not
    a regular file (a device, a FIFO, a directory) is never renamed over: ``OSError``."""
    path = real_path(path)
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"it is {file_kind(mode)}, not a regular file; it is left as it is")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a part of the folder path is a file
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            # mkstemp makes the file owner-only; give it the mode a plain write would have.
            os.fchmod(fh.fileno(), _file_mode(path))
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@functools.cache
def load_schema(name: str) -> Schema:
    """``schemas/<name>.schema.json`` of the installed package."""
    schema = copy.deepcopy(schema_file(name))
    if name == "session":  # the figures' properties: the metric catalog's
        figures = schema["$defs"]["figures"]
        figures["properties"] = {
            **{n: {"type": list(f.json) if len(f.json) > 1 else f.json[0]} for n, f in FIGURES.items()},
            **figures["properties"],
        }
    return schema


def validate(value: object, name: str, definition: str | None = None, path: str = "") -> None:
    """``value`` against schema ``name`` (``schemas/<name>.schema.json``), or against its
    ``$defs/<definition>``; ``path`` names where ``value`` sits in its file."""
    root = load_schema(name)
    schema = root["$defs"][definition] if definition else root
    check(value, schema, root, path)
