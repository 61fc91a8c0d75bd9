"""Keep perf tests on one pytest-xdist worker: side by side they would measure each other.

xdist's own ``--dist loadgroup`` appends ``@group`` to a worker's node ids, which pytest 9
no longer lets it do (``nodeid`` became read-only), so groups silently spread. Instead each
worker writes the groups it collected (``nodeid<TAB>group``: llmperf tests under ``llmperf``,
and any ``xdist_group`` mark) to a file in a folder the controller made, and the controller's
scheduler, a ``LoadGroupScheduling``, reads them when it first splits scopes, which happens
after every worker has reported its collection. Ungrouped tests are spread as by ``load``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

GROUP = "llmperf"


def item_group(item: Any, perf: bool) -> str | None:
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


def make_scheduler(config: Any, log: Any, folder: str) -> Any:
    from xdist.scheduler import LoadGroupScheduling

    class GroupFileScheduling(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = read_groups(folder)
            group = self._groups.get(nodeid)
            return f"@{group}" if group is not None else super()._split_scope(nodeid)

    return GroupFileScheduling(config, log)
