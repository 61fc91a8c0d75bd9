"""The ``llmperf`` marker on pytest items, as plain functions the hooks call (as pytest-memray
keeps its marks): the merged marker config, which items measure, what collection does to them;
xdist grouping. The marker's keys (validation, help text)
are ``session.options``: a script without pytest validates them too.

Keep perf tests on one pytest-xdist worker: side by side they would measure each other.

xdist's own ``--dist loadgroup`` appends ``@group`` to a worker's node ids, which pytest 9
no longer lets it do (``nodeid`` became read-only), so groups silently spread. Instead each
worker writes the groups it collected (``nodeid<TAB>group``: llmperf tests under ``llmperf``,
and any ``xdist_group`` mark) to a file in a folder the controller made, and the controller's
scheduler, a ``LoadGroupScheduling``, reads them when it first splits scopes, which happens
after every worker has reported its collection. Ungrouped tests are spread as by ``load``."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..core.errors import ConfigError
from ..core.formats import full_id as named
from ..session.options import PROMPT_KEYS, MarkerConfig, validate

if TYPE_CHECKING:
    from ..session import Session
    from .project import Project  # noqa: F401 (named in PROJECT's StashKey)


GROUP = "llmperf"


def item_group(item: pytest.Item, perf: bool) -> str | None:
    if perf:
        return GROUP
    names = sorted(
        str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
    )
    return "_".join(names) or None


def write_groups(folder: str, worker_id: str, groups: Iterable[tuple[str, str]]) -> None:
    path = Path(folder) / f"{worker_id}.tsv"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{nodeid}\t{group}\n" for nodeid, group in groups), encoding="utf-8")
    os.replace(tmp, path)


def read_groups(folder: str) -> dict[str, str]:
    groups: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            nodeid, _, group = line.rpartition("\t")
            if nodeid:
                groups[nodeid] = group
    return groups


def make_scheduler(config: pytest.Config, log: object, folder: str) -> object:
    from xdist.scheduler import LoadGroupScheduling

    class GroupFileScheduling(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = read_groups(folder)
            group = self._groups.get(nodeid)
            return f"@{group}" if group is not None else super()._split_scope(nodeid)

    return GroupFileScheduling(config, log)


MARKER = "llmperf"
PLUGIN_NAME = "llmperf-manager"
MARKER_CONFIG = pytest.StashKey[MarkerConfig]()
SESSION = pytest.StashKey["Session"]()
#: The session's project folder and ini file (``project.locate``), decided once at configure time.
PROJECT = pytest.StashKey["Project"]()
#: The JUnit properties the plugin put on an item (replaced when pytest-rerunfailures runs it again).
PROPERTIES = pytest.StashKey[list]()


def marker_config(item: pytest.Item) -> MarkerConfig | None:
    """Module, class and function markers merged; the closest one wins per key (a
    ``pytest.param(..., marks=...)``'s marker is closer than its function's). Two markers at
    the same level giving one key different values: a ConfigError, one line, never last-wins."""
    levels = _levels(item)
    if not levels:
        return None
    kwargs: dict[str, object] = {}
    args: tuple[object, ...] = ()
    for where, marks in reversed(levels):
        level: dict[str, object] = {}
        for mark in marks:
            _refuse_conflicts(where, level, mark.kwargs)
            level.update(mark.kwargs)
            args += mark.args
        if PROMPT_KEYS & level.keys():  # prompt and prompt_tokens are one choice
            for key in PROMPT_KEYS:
                kwargs.pop(key, None)
        kwargs.update(level)
    return validate(kwargs, args)


def _levels(item: pytest.Item) -> list[tuple[str, list[pytest.Mark]]]:
    """The item's ``llmperf`` markers by level, closest first: its parametrization's, its own,
    then each parent's (class, module...), each level named as a message names it."""
    callspec = getattr(item, "callspec", None)
    own_param = [id(m) for m in getattr(callspec, "marks", ())]
    levels: dict[tuple[int, bool], tuple[str, list[pytest.Mark]]] = {}
    for node, mark in item.iter_markers_with_node(MARKER):
        param = node is item and id(mark) in own_param
        where = f"{node.nodeid} (pytest.param marks)" if param else node.nodeid or str(node.path)
        levels.setdefault((id(node), param), (where, []))[1].append(mark)
    return list(levels.values())


def _refuse_conflicts(where: str, level: Mapping[str, object], given: Mapping[str, object]) -> None:
    for key, value in given.items():
        if key in level and not _same(level[key], value):
            raise ConfigError(
                f"llmperf marker key {key!r} is given twice on {where} ({level[key]!r} and {value!r}); "
                "give it once (a closer marker, e.g. the test's over its module's, overrides)"
            )


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):  # an array's == is no bool: not known to be the same
        return False


def full_id(item: pytest.Item, rootdir: Path) -> str:
    """The item's id naming its module by its path from the rootdir (``../a/test_x.py::test_a``
    for a module outside it, whose node id is ``::test_a``): ``core.formats.full_id``."""
    try:
        module = Path(os.path.relpath(item.path, rootdir)).as_posix()
    except ValueError:  # another drive: no relative path
        return item.nodeid
    return named(item.nodeid, module)


def uses_llmperf(item: pytest.Item) -> bool:
    return any(name.startswith("llmperf") for name in getattr(item, "fixturenames", ()))


def is_perf(item: pytest.Item) -> bool:
    """Measures or loads a model: the marker, or an ``llmperf*`` fixture."""
    return MARKER_CONFIG in item.stash or uses_llmperf(item)


def stash_markers(report: pytest.CollectReport) -> None:
    """Each collected item's merged marker (a bad one fails its module's collection, one line
    per item); a fixture user gets the mark, so ``-m "not llmperf"`` deselects it."""
    errors = []
    for node in report.result:
        if isinstance(node, pytest.Item):
            try:
                config = marker_config(node)
            except ConfigError as exc:
                errors.append(f"{node.nodeid}: {exc}")
                continue
            if config is not None:
                node.stash[MARKER_CONFIG] = config
            elif uses_llmperf(node):
                node.add_marker(MARKER)
    if errors:
        report.outcome = "failed"
        report.longrepr = "\n".join(errors)
        report.result = []


def select(config: pytest.Config, items: list[pytest.Item], skip: bool, only: bool) -> list[pytest.Item]:
    """The perf items to run: a marker-only test gets the ``llmperf`` fixture (requested here,
    not by an autouse fixture every plain test pays for); ``--llmperf-skip``/``-only`` skip."""
    perf = [i for i in items if is_perf(i)]
    for item in perf:  # a marked test measures through the ``llmperf`` fixture, asked for or not
        names = getattr(item, "fixturenames", None)
        if MARKER_CONFIG in item.stash and names is not None and "llmperf" not in names:
            names.append("llmperf")
    if skip:
        _skip(perf, "llmperf test (--llmperf-skip)")
        return []
    if only:
        perf_ids = {id(i) for i in perf}
        _skip([i for i in items if id(i) not in perf_ids], "not an llmperf test (--llmperf-only)")
    return perf


def _skip(items: list[pytest.Item], reason: str) -> None:
    for item in items:
        item.add_marker(pytest.mark.skip(reason=reason))


def group_on_worker(config: pytest.Config, items: list[pytest.Item], perf: list[pytest.Item]) -> None:
    """An xdist worker: llmperf tests in one group (``xdist_groups``) under ``--dist
    loadgroup``, else a warning that they may run side by side."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    dist = workerinput.get("llmperf_dist")
    if dist == "loadgroup":
        perf_ids = {id(i) for i in perf}
        for item in perf:
            item.add_marker(pytest.mark.xdist_group(GROUP))
        groups = [(i.nodeid, item_group(i, id(i) in perf_ids)) for i in items]
        folder = workerinput.get("llmperf_groups_dir")
        if folder:
            write_groups(folder, workerinput["workerid"], [(n, g) for n, g in groups if g])
    elif perf:
        warnings.warn(
            pytest.PytestWarning(
                f"llmperf: {len(perf)} perf test(s) under pytest-xdist --dist {dist} may run side by side "
                "and measure each other; use --dist loadgroup (or -p no:xdist)"
            )
        )


def planned(items: list[pytest.Item]) -> tuple[int, dict[str, Mapping[str, object]]]:
    """(tests that will measure, ``{nodeid: llama.cpp keys}`` their markers name)."""
    running = [i for i in items if is_perf(i) and not i.get_closest_marker("skip")]
    configs = {i.nodeid: i.stash.get(MARKER_CONFIG, None) for i in running}
    return len(running), {nodeid: c.engine for nodeid, c in configs.items() if c is not None and c.engine}


def header(config: pytest.Config, session: Session, engine_note: str | None) -> list[str]:
    """``pytest_report_header``: under xdist the controller collects nothing itself, so it says
    here what its workers will measure, and how they are spread."""
    dist = getattr(config.option, "dist", "no")
    lines = session.describe(engine_note) if dist not in ("no", None) else []
    if dist == "loadgroup":
        lines.append("llmperf: pytest-xdist --dist loadgroup: llmperf tests run on one worker, others spread")
    elif dist not in ("no", None):
        lines.append(f"llmperf: pytest-xdist --dist {dist} may run llmperf tests side by side; use loadgroup")
    return lines


def terminal_width(config: pytest.Config) -> int:
    """The terminal's width (``$COLUMNS``, else the tty's, else 80): tables fit it."""
    tr = config.pluginmanager.get_plugin("terminalreporter")  # None under -p no:terminal
    try:
        if tr is not None:
            return int(tr._tw.fullwidth)
    except (AttributeError, TypeError, ValueError):
        pass
    return shutil.get_terminal_size().columns
