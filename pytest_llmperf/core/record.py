"""A measurement as it is stored: a baseline file's entry, a session file's ``record``.

``Record`` is what ``baselines/records.py`` writes (``record``) and what a baseline or session
file holds: fewer per-run fields than a fresh ``core.measurement.Measurement`` (each run's
judged metrics, ITL samples and parts, no traces, no E2E per run), the summary, and the
sections of where the time went. ``to_json`` writes the stored form (the keys of today's
entries, in their order) and ``from_json`` reads it back, checked against
``schemas/baselines.schema.json#/$defs/record`` first: the one place a stored record's JSON is
read as a mapping. A key this version does not know (a newer pytest-llmperf's) is kept as it
came, in ``extra``, so a record read and written again is the record that was read (but for a
hand-made one without ``commit``: it is written ``null``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeAlias

from .documents import validate

if TYPE_CHECKING:
    from .measurement import JsonObject, JsonValue

#: Per-run values by field (``runs``, ``parts``): one number per run.
PerRun: TypeAlias = "Mapping[str, Sequence[float]]"


@dataclass(frozen=True, kw_only=True)
class Record:
    """One stored measurement (module docstring). The fields are the stored keys in the order
    they are written; a section the measurement did not have is None (and not written)."""

    recorded_at: str | None = None
    commit: str | None = None
    hardware: JsonObject
    subject: JsonObject
    #: What must match for two records to be compared (``records.workload_identity``), with
    #: the run and warm-up counts.
    workload: JsonObject
    #: Per-run values of the judged metrics (the statistics' sampling unit), by run field.
    runs: PerRun
    #: Each run's inter-token latencies (ms).
    itl_ms: tuple[tuple[float, ...], ...] | None = None
    #: ``n_runs``, ``itl_count`` and the catalog's ``SUMMARY`` figures (six significant figures).
    summary: Mapping[str, float | None] | None = None
    stability: JsonObject | None = None
    #: Per-run values of each phase's parts (``catalog.PARTS``), by part.
    parts: PerRun | None = None
    layers: JsonObject | None = None
    attribution: JsonObject | None = None
    roofline: JsonObject | None = None
    memory: JsonObject | None = None
    prompt: JsonObject | None = None
    model_loads: JsonObject | None = None
    agreement: JsonObject | None = None
    load: JsonObject | None = None
    machine: JsonObject | None = None
    #: The machine's reference figure (``records.measure``), taken after the runs.
    reference: JsonObject | None = None
    #: The levels of the baseline's last recorded sessions, per judged metric (a re-recorded
    #: baseline keeps them: the verdict's between-session noise).
    sessions: JsonObject | None = None
    #: Stored keys this version does not know, as they came.
    extra: JsonObject = field(default_factory=dict)

    def to_json(self) -> dict[str, JsonValue]:
        """The stored form: every field that is not None, in order, then ``extra``."""
        out: dict[str, JsonValue] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name not in _ALWAYS):
                continue
            out[f.name] = _plain(value)
        out.update({k: _plain(v) for k, v in self.extra.items()})
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "record") -> Record:
        """A stored record, checked against the schema first (``where``: its place in its file,
        for the one-line ``SchemaViolation``)."""
        validate(d, "baselines", "record", where)
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in d.items() if k in known and v is not None}
        values["runs"] = _per_run(d["runs"])
        if "parts" in values:
            values["parts"] = _per_run(d["parts"])
        if "itl_ms" in values:
            values["itl_ms"] = tuple(tuple(run) for run in d["itl_ms"])
        return cls(**values, extra={k: v for k, v in d.items() if k not in known})


def _per_run(d: Mapping[str, Sequence[float]]) -> PerRun:
    return {k: tuple(v) for k, v in d.items()}


#: Written even when None (a record holds ``"commit": null`` outside a git checkout).
_ALWAYS = frozenset({"commit"})


def _plain(value: object) -> JsonValue:
    """A field's value as JSON: tuples as lists, mappings as dicts."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"not a JSON value: {value!r}")
