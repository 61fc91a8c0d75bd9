"""Baselines as reviewable JSON files under ``baselines/``: one file per test module.

Why one file per module: a perf suite's tests change together (a llama.cpp upgrade moves them
all), so one file gives one reviewable diff per module without a file per test; the path
mirrors the test module's (``tests/perf/test_decode.py`` -> ``baselines/tests/perf/test_decode.json``).

Inside: ``tests`` -> test key (``test_name[param]``, plus ``#label`` for extra
measurements) -> hardware key -> entry. Several machines' baselines sit side by side.

Safety: files are parsed as data only (``json``), checked against the published JSON Schema
(``pytest_llmperf/schemas/baselines.schema.json``), and a problem is a ``BaselineError``: one
line naming the file, the place in it and what to do. Writes go to a temporary file in the
same folder, are fsynced and renamed over the old file (a symlink's target, the link staying a
link), so a crash at any moment leaves either the old or the new file; writers serialize on a
lock of the folder. What an update keeps when the old file is unreadable, newer or refused:
``update``. A path that is not a regular file or a file over
``core.documents.MAX_DOCUMENT_MIB`` is never read (``RefusedBaselineError``), so never truncated.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ..core import formats as nodeids
from ..core.catalog import JUDGED
from ..core.documents import (
    DuplicateKey,
    JSONValue,
    RefusedFile,
    SchemaViolation,
    atomic_write,
    loads,
    read_bytes,
    real_path,
    validate,
)
from ..core.errors import LLMPerfError

if TYPE_CHECKING:  # the record's module is heavy (tests/test_architecture.py): read records import it
    from ..core.measurement import Measurement, PerRun

#: A baseline file's ``tests``: test key -> hardware key -> stored record (``Measurement.to_json``).
Tests: TypeAlias = "dict[str, dict[str, dict[str, JSONValue]]]"

SCHEMA = "pytest-llmperf/baselines"
SCHEMA_VERSION = 1


class BaselineError(LLMPerfError):
    """A baseline file that cannot be used (corrupt, truncated, wrong schema...)."""


class RefusedBaselineError(BaselineError):
    """Not a regular file, or over ``core.documents.MAX_DOCUMENT_MIB``: never read, never replaced."""


class NewerSchemaError(BaselineError):
    """A valid file of a newer pytest-llmperf: never overwritten by this one."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


#: A module outside the rootdir (``--rootdir`` elsewhere): each ``..`` of its path relative to
#: the rootdir is this folder, so the file stays unique per module and inside the baseline folder.
PARENT = "__parent__"
#: A module path with no relative form (another drive): its parts under this folder.
ABSOLUTE = "__absolute__"


def module_file(baseline_dir: Path, module_path: str) -> Path:
    """``baselines/<module path without .py>.json`` for a test module path relative to the
    rootdir; one file per module path: ``../other/test_x.py`` ->
    ``baselines/__parent__/other/test_x.json``, never ``baselines/test_x.json``."""
    rel = Path(module_path)
    if rel.is_absolute():
        rel = Path(ABSOLUTE, *[p.strip("/\\:") for p in rel.parts if p.strip("/\\:")])
    rel = Path(*[PARENT if p == ".." else p for p in rel.parts])
    return baseline_dir / rel.with_suffix(".json")


def module_of(baseline_file: str) -> str:
    """The test module path a baseline file (relative to the baseline folder) is named after:
    ``module_file``'s inverse, ``__parent__/a/test_x.json`` -> ``../a/test_x.py``."""
    parts = Path(baseline_file).with_suffix(".py").parts
    if parts and parts[0] == ABSOLUTE:
        return "/" + "/".join(parts[1:])
    return "/".join(".." if p == PARENT else p for p in parts)


def unique_test_id(nodeid: str, baseline_file: str) -> str:
    """A test's id as the baseline store tells it apart from every other (the history's too):
    its node id, except for a module outside the rootdir, whose node id does not name it
    (``::test_a`` or ``test_x.py::test_a`` for two ``test_x.py``): then the module path its
    baseline file is named after, ``../a/test_x.py::test_a``."""
    if not baseline_file.startswith((PARENT + "/", ABSOLUTE + "/")):
        return nodeid
    return f"{module_of(baseline_file)}::{nodeids.in_module(nodeid)}"


def entry_key(nodeid: str, label: str = "") -> str:
    """The part of a node id after the module, plus ``#label`` for labelled measurements."""
    name = nodeids.in_module(nodeid)
    return f"{name}#{label}" if label else name


#: What to do about a baseline file that does not match its schema.
REDO = "re-record it with --llmperf-update-baselines (or restore the file from version control)"
#: What to do about a baseline file over the size limit.
SHRINK = "remove the entries of machines no longer tested from it, or split the test module"


def _read(path: Path) -> bytes:
    try:
        return read_bytes(path, "baseline file", SHRINK)
    except RefusedFile as exc:
        raise RefusedBaselineError(str(exc)) from None


def _violation(path: Path, exc: SchemaViolation) -> BaselineError:
    return BaselineError(f"{path}: {exc}; {REDO}")


def _check_entry(path: Path, test: str, hw: str, entry: Any) -> None:
    """One record against ``schemas/baselines.schema.json#/$defs/record`` (what the statistics read)."""
    where = f"tests[{test!r}][{hw!r}]"
    try:
        from ..core.measurement import Measurement

        _judged_runs(Measurement.from_json(entry, where).run_columns, where)
    except SchemaViolation as exc:
        raise _violation(path, exc) from None


def load(path: Path) -> Tests:
    """The file's ``tests`` mapping; empty when the file does not exist."""
    try:
        text = _read(path).decode("utf-8")
    except FileNotFoundError:
        return {}
    except NotADirectoryError:
        raise BaselineError(f"cannot read baseline file {path}: {_in_the_way(path)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"cannot read baseline file {path}: {exc}") from None
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"baseline file {path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "restore it from version control or re-record with --llmperf-update-baselines"
        ) from None
    except DuplicateKey as exc:
        raise BaselineError(
            f"baseline file {path} has a {exc} (a merge of two versions?); keep one, restore the file from "
            "version control or re-record with --llmperf-update-baselines"
        ) from None
    _check_header(path, data)
    return _valid_tests(path, data)


def load_records(path: Path) -> dict[str, dict[str, Measurement]]:
    """``load``'s entries as records (each checked by ``load``)."""
    from ..core.measurement import Measurement

    return {test: {hw: Measurement.read(e) for hw, e in per_hw.items()} for test, per_hw in load(path).items()}


def _check_header(path: Path, data: object) -> None:
    """A baseline file of a schema version this pytest-llmperf reads."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BaselineError(f'{path} is not a pytest-llmperf baseline file (no "schema": "{SCHEMA}")')
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f"{path}: schema_version missing or not an integer")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{path} has schema_version {version}, newer than this pytest-llmperf understands "
            f"({SCHEMA_VERSION}); upgrade pytest-llmperf",
            version,
        )


def _valid_tests(path: Path, data: Mapping[str, Any]) -> Tests:
    """The ``tests`` of a baseline file that holds to its schema: the whole file against
    schemas/baselines.schema.json, one line at the first problem."""
    try:
        validate(data, "baselines")
        tests = data["tests"]
        for test, per_hw in tests.items():
            for hw, entry in per_hw.items():
                _judged_runs(entry["runs"], f"tests[{test!r}][{hw!r}]")
    except SchemaViolation as exc:
        raise _violation(path, exc) from None
    return tests


def _judged_runs(runs: PerRun, where: str) -> None:
    """A judged metric's runs are above 0 (its level is taken on the log scale); the schema
    lets other metrics hold a 0."""
    for name in JUDGED:
        for i, value in enumerate(runs.get(name) or ()):
            if value <= 0:
                raise SchemaViolation(f"{where}.runs[{name!r}][{i}]", f"is {value}, not above 0 (a judged metric)")


def dumps(data: object) -> str:
    """Stable, reviewable JSON: sorted keys, two-space indent, lists of numbers on one line."""

    def render(value: object, indent: int) -> str:
        pad = "  " * (indent + 1)
        if isinstance(value, dict):
            if not value:
                return "{}"
            items = [f"{pad}{json.dumps(str(k))}: {render(value[k], indent + 1)}" for k in sorted(value)]
            return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
        if isinstance(value, (list, tuple)):
            if all(not isinstance(v, (dict, list, tuple)) for v in value):
                return "[" + ", ".join(json.dumps(v, allow_nan=False) for v in value) + "]"
            return "[\n" + ",\n".join(pad + render(v, indent + 1) for v in value) + "\n" + "  " * indent + "]"
        return json.dumps(value, allow_nan=False)

    return render(data, 0) + "\n"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize writers of one folder's baseline files: a POSIX advisory lock on the folder
    itself, so no lock file is left beside the baselines (no-op where flock is missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _keep_aside(path: Path) -> Path:
    """A copy of ``path`` as ``<name>.corrupt``, or the first free ``.corrupt.N``: never
    over an older copy (a hard link, created exclusively; a plain copy where links fail)."""
    for n in range(10_000):
        moved = path.with_name(path.name + ".corrupt" + (f".{n}" if n else ""))
        try:
            os.link(path, moved)
            return moved
        except FileExistsError:
            continue
        except OSError:
            pass
        data = _read(path)
        try:
            with open(moved, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            return moved
        except FileExistsError:
            continue
    raise BaselineError(f"{path}: 10000 .corrupt copies beside it already; clean them up")


def _salvage(path: Path) -> Tests:
    """The valid entries of a file that does not load as a whole (e.g. one entry with no runs)."""
    try:
        data = loads(_read(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, BaselineError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("tests"), dict):
        return {}
    kept: Tests = {}
    for test, per_hw in data["tests"].items():
        for hw, entry in per_hw.items() if isinstance(per_hw, dict) else ():
            try:
                _check_entry(path, test, hw, entry)
            except BaselineError:
                continue
            kept.setdefault(test, {})[hw] = entry
    return kept


def update(
    path: Path,
    entries: Mapping[str, Mapping[str, Mapping[str, JSONValue]]],
    merge: Callable[[Measurement | None, Measurement], Measurement] | None = None,
) -> Path | None:
    """Merge ``{test key: {hardware key: entry}}`` into ``path``; other entries stay as they are.

    A file that cannot be read as a baseline is kept aside (``<name>.corrupt[.N]``, returned)
    and its valid entries carried over: asked-for updates never destroy data silently. A file
    of a newer schema raises ``NewerSchemaError`` and stays as it is; a failed write raises a
    ``BaselineError`` with the old file intact.
    """
    target = real_path(path)  # a symlinked file: its target's folder is where the writes go
    try:
        with _locked(target):
            for stale in target.parent.glob(f".{target.name}.*.tmp"):  # left by a writer killed mid-write
                with contextlib.suppress(OSError):
                    stale.unlink()
            tests, moved = _stored_for_update(path)
            for test, per_hw in entries.items():
                stored = tests.setdefault(test, {})
                for hw, entry in per_hw.items():
                    # ``merge`` sees the entry it replaces (read under the lock): baseline history.
                    stored[hw] = _merged(merge, stored.get(hw), entry) if merge else dict(entry)
            atomic_write(target, dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tests": tests}))
            return moved
    except OSError as exc:
        why = _in_the_way(path) if isinstance(exc, (NotADirectoryError, FileExistsError)) else exc.strerror or exc
        raise BaselineError(f"cannot write baseline file {path}: {why}; the file is unchanged") from None


def _merged(
    merge: Callable[[Measurement | None, Measurement], Measurement],
    old: Mapping[str, JSONValue] | None,
    new: Mapping[str, JSONValue],
) -> dict[str, JSONValue]:
    """``merge`` of the stored entry ``old`` (checked by ``load``) and ``new``, as stored."""
    from ..core.measurement import Measurement

    return merge(None if old is None else Measurement.read(old), Measurement.read(new)).to_json()


def _stored_for_update(path: Path) -> tuple[Tests, Path | None]:
    """The entries an update starts from, and where an unreadable file was kept aside (None:
    it loaded): its valid entries are carried over. A newer schema's or a refused file stays
    as it is (the error says so)."""
    try:
        return load(path), None
    except NewerSchemaError as exc:
        raise NewerSchemaError(
            f"baselines not written to {path}: it has schema_version {exc.version}, newer than this "
            f"pytest-llmperf understands ({SCHEMA_VERSION}); upgrade pytest-llmperf to update it",
            exc.version,
        ) from None
    except RefusedBaselineError as exc:
        raise RefusedBaselineError(f"baselines not written: {exc}; the file is unchanged") from None
    except BaselineError:
        moved = _keep_aside(path)
        return _salvage(path), moved


def _in_the_way(path: Path) -> str:
    """What to say when a folder on ``path``'s way is a file (``baselines`` a regular file)."""
    for folder in reversed(path.parents):
        if folder.exists() and not folder.is_dir():
            return f"{folder} is a file, not a folder; move it aside (mv {folder} {folder}.old) or give another folder"
    return "a folder on its path is a file"
