"""The session's settings, read once from the options (``core.settings_table``) into one
frozen value; every later decision reads this, never the options again."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..core.errors import ConfigError
from ..core.settings import EngineSettings, resolve, Resolved, SETTINGS
from ..history.connection import default as default_history, Location, parse as parse_history


#: Options that exclude each other: (one, other, the line that says so).
EXCLUSIVE = (
    ("skip", "only", "--llmperf-skip and --llmperf-only exclude each other"),
    ("budgets_only", "baselines_only",
     "--llmperf-budgets-only and --llmperf-baselines-only exclude each other; give neither to gate on both"),
    ("against", "update_baselines",
     "--llmperf-against judges this tree against REF and neither reads nor writes baselines: record baselines "
     "in a session of their own (drop one of --llmperf-against, --llmperf-update-baselines)"),
    ("against", "disable",
     "--llmperf-disable measures once without statistics: it cannot judge against REF (drop one of them)"),
    ("disable", "update_baselines",
     "--llmperf-disable measures once without statistics: it cannot record baselines "
     "(drop one of --llmperf-disable, --llmperf-update-baselines)"),
)


@dataclass(frozen=True)
class SessionSettings:
    """Every setting of ``SETTINGS`` resolved (engine settings in ``engine``), with paths made
    absolute against the rootdir and the history location parsed."""

    rootdir: Path
    engine: EngineSettings
    threads_source: str  # where ``engine.threads`` came from, for the warning line
    baseline_dir: Path
    update_baselines: bool
    require_baseline: bool
    strict_env: bool
    fail_other_hardware: bool
    budgets_only: bool
    baselines_only: bool
    skip: bool
    only: bool
    disable: bool
    columns: tuple[str, ...]
    alpha: float
    threshold: float
    tail_threshold: float
    layers: bool
    roofline: bool
    peak_bw: float | None
    peak_tflops: float | None
    json: str | None
    markdown: str | None
    html: str | None
    history: Location | None
    #: ``--llmperf-against``'s REF as given (``session.refs.parse_reference`` reads it), or None.
    against: str | None = None

    @property
    def compare(self) -> bool:
        """Measurements are compared with their baselines (not ``--llmperf-budgets-only``/``-disable``)."""
        return not self.budgets_only and not self.disable

    @property
    def budgets_gate(self) -> bool:
        """A budget breach fails its test (not ``--llmperf-baselines-only``/``-disable``)."""
        return not self.baselines_only and not self.disable

    @property
    def compare_values(self) -> dict[str, float]:
        """``judge.regression.CompareSettings``' session-wide values (a marker may override them)."""
        return {"alpha": self.alpha, "threshold": self.threshold, "tail_threshold": self.tail_threshold}

    @classmethod
    def from_options(
        cls,
        getoption: Callable[[str], Any],
        getini: Callable[[str], Any],
        rootdir: Path | str,
        environ: Mapping[str, str] | None = None,
    ) -> "SessionSettings":
        """Read every option once (``settings_table.resolve``). Raises ConfigError: one line."""
        return cls.from_resolved(resolve(getoption, getini, environ), rootdir)

    @classmethod
    def of(cls, rootdir: Path | str, environ: Mapping[str, str] | None = None, **values: Any) -> "SessionSettings":
        """Settings for a script (no pytest): ``SessionSettings.of(".", model="tiny", threads=1)``;
        values as the command line would give them (parsed again), the rest from env and defaults."""
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown llmperf setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
        given = {SETTINGS[k].dest: SETTINGS[k].parse(v) if isinstance(v, str) else v for k, v in values.items()}
        return cls.from_options(lambda dest: given.get(dest), lambda key: "", rootdir, environ)

    @classmethod
    def from_resolved(cls, r: Mapping[str, Resolved], rootdir: Path | str) -> "SessionSettings":
        for one, other, line in EXCLUSIVE:
            if r[one].value and r[other].value:
                raise ConfigError(line)
        root = Path(rootdir)
        engine_fields = [f.name for f in dataclasses.fields(EngineSettings)]
        history = r["history"]
        own = {
            f.name: r[f.name].value
            for f in dataclasses.fields(cls)
            if f.name in r and f.name not in ("baseline_dir", "history")
        }
        return cls(
            rootdir=root,
            engine=EngineSettings(**{name: r[name].value for name in engine_fields}),
            threads_source=r["threads"].source,
            baseline_dir=root / r["baseline_dir"].value,
            # --llmperf-against: the verdicts are against REF, not the history's; nothing is appended.
            history=None if r["against"].value else
            default_history(root) if history.value is None else parse_history(history.value, history.source, root),
            **own,
        )
