"""The stored record of a measurement (core.measurement.Measurement): written and read back by its own
to_json / from_json, checked against the baselines schema, and files written before it existed
load and write back as they were (tests/data/*-before-record.json: a baseline file and a session
file written by pytest-llmperf before this type, a measurement with per-layer timing, the
attribution pass, fresh model loads and a re-recorded baseline's sessions)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmperf import EngineInfo, RunTrace, Workload, summarize
from pytest_llmperf.baselines import store
from pytest_llmperf.baselines.records import stored
from pytest_llmperf.core.documents import SchemaViolation
from pytest_llmperf.core.fingerprint import Fingerprint, subject
from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.reports.session_file import load_session

DATA = Path(__file__).parent / "data"
#: The Measurement's field that holds a stored section, where it is not the section's key (the
#: workload's identity: ``Measurement.workload`` is the workload itself, None read from a file).
FIELD = {"workload": "identity"}
BASELINES = DATA / "baselines-before-record.json"
SESSION = DATA / "session-before-record.json"
#: The keys of a record, in the order ``records.stored`` has always written them.
ORDER = [
    "recorded_at",
    "commit",
    "hardware",
    "subject",
    "workload",
    "runs",
    "itl_ms",
    "summary",
    "stability",
    "parts",
    "layers",
    "attribution",
    "roofline",
    "memory",
    "prompt",
    "model_loads",
    "agreement",
    "load",
    "machine",
    "reference",
    "sessions",
]


def _measurement():
    ms = 1_000_000
    traces = [
        RunTrace(
            start_ns=0, prefill_done_ns=9 * ms, token_ns=tuple((10 + i + k) * ms for k in range(5)), prompt_tokens=7
        )
        for i in range(3)
    ]
    return summarize(traces, Workload(max_tokens=5, runs=3), EngineInfo(engine="test", model="m"))


def test_a_baseline_file_written_before_the_record_type_loads_and_writes_back_byte_identical() -> None:
    tests = store.load(BASELINES)
    records = {
        t: {hw: Measurement.from_json(e, f"tests[{t!r}][{hw!r}]") for hw, e in per.items()} for t, per in tests.items()
    }
    rich = next(iter(records["test_rich"].values()))
    assert rich.layers is not None and rich.attribution is not None and rich.model_loads is not None
    assert (
        rich.sessions is not None
        and rich.itl_ms is not None
        and len(rich.itl_ms) == len(rich.run_columns["tpot_ms"]) == 3
    )
    written = {t: {hw: r.to_json() for hw, r in per.items()} for t, per in records.items()}
    assert written == tests
    text = store.dumps({"schema": store.SCHEMA, "schema_version": store.SCHEMA_VERSION, "tests": written})
    assert text == BASELINES.read_text()


def test_a_session_file_written_before_the_record_type_loads_and_compares(capsys) -> None:
    from pytest_llmperf.cli import main as cli_main

    doc = json.loads(SESSION.read_text())
    stored = [r[key] for r in doc["results"] for key in ("record", "baseline_record") if r.get(key)]
    assert len(stored) == 4
    for d in stored:
        again = Measurement.from_json(d).to_json()
        assert json.dumps(again, sort_keys=True, indent=1) == json.dumps(d, sort_keys=True, indent=1)
    assert [r.test for r in load_session(SESSION)] == ["test_rich.py::test_rich", "test_rich.py::test_plain"]
    assert cli_main(["compare", str(SESSION), str(SESSION)]) == 0
    assert "0 regression(s) in 2 compared measurement(s)" in capsys.readouterr().out


def test_a_record_is_written_by_the_type_in_todays_order_and_read_back() -> None:
    m = _measurement()
    rec = stored(m, Fingerprint({"cpu": "c"}, subject(m.engine)), commit=None, recorded_at="now").to_json()
    assert list(rec) == [k for k in ORDER if k in rec] and rec["commit"] is None
    assert {"stability", "memory"} <= set(rec) and not {"layers", "reference", "sessions"} & set(rec)
    r = Measurement.from_json(rec)
    assert (
        list(r.run_columns["tpot_ms"]) == rec["runs"]["tpot_ms"] and r.summary is not None and r.summary["n_runs"] == 3
    )
    assert r.memory == rec["memory"] and r.layers is None and not r.extra
    assert r.to_json() == rec and list(r.to_json()) == list(rec)


def test_a_record_reads_as_the_mapping_a_hook_read_before_it_was_typed() -> None:
    """``result.record["summary"]`` in a ``pytest_llmperf_result`` hook (a dict before the
    record was typed) reads the stored form still: a read-only mapping of ``to_json``."""
    m = _measurement()
    r = stored(m, Fingerprint({"cpu": "c"}, subject(m.engine)), commit=None, recorded_at="now")
    rec = r.to_json()
    assert dict(r) == rec and list(r) == list(rec) and len(r) == len(rec)
    assert r["summary"] == rec["summary"] and r.get("layers") is None and "memory" in r
    with pytest.raises(KeyError):
        r["no such section"]


def test_from_json_checks_the_schema_first() -> None:
    m = _measurement()
    rec = stored(m, Fingerprint({}, subject(m.engine)), commit="abc", recorded_at="now").to_json()
    with pytest.raises(SchemaViolation, match=r"tests\['t'\]\['hw'\]"):
        Measurement.from_json({k: v for k, v in rec.items() if k != "runs"}, "tests['t']['hw']")
    with pytest.raises(SchemaViolation, match="itl_ms"):
        Measurement.from_json({**rec, "itl_ms": [[]]})


def test_a_key_of_a_newer_version_is_kept_as_it_came() -> None:
    m = _measurement()
    rec = {
        **stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json(),
        "later": {"x": [1, 2]},
    }
    r = Measurement.from_json(rec)
    assert r.extra == {"later": {"x": [1, 2]}}
    assert r.to_json() == rec


def _stored_records() -> list[dict]:
    """Every record of the files earlier versions wrote (tests/data)."""
    out = []
    for path in [*DATA.glob("*.json"), *DATA.glob("release-0.1/**/*.json")]:
        doc = json.loads(path.read_text())
        out += [e for per in (doc.get("tests") or {}).values() for e in per.values()]
        out += [r[k] for r in doc.get("results") or [] for k in ("record", "baseline_record") if r.get(k)]
    return out


def test_the_stored_form_types_name_every_key_of_the_files_earlier_versions_wrote() -> None:
    """A section's type (``Measurement``'s field) names each key a stored record holds there, and
    ``Measurement.of`` writes no key its type does not name."""
    from pytest_llmperf.core import measurement as ms

    typed = {
        "workload": ms.StoredWorkload,
        "stability": ms.Stability,
        "layers": ms.LayersJson,
        "roofline": ms.RooflineJson,
        "memory": ms.Memory,
        "prompt": ms.PromptSeen,
        "model_loads": ms.ModelLoads,
        "load": ms.LoadStats,
        "machine": ms.Machine,
    }
    # A section typed by its class holds it (the class's ``to_json`` writes the stored form named here).
    classes = {"stability": ms.Stability, "layers": ms.LayerProfile, "roofline": ms.Roofline}
    assert all(
        Measurement.__annotations__[FIELD.get(name, name)].startswith(classes.get(name, kind).__name__)
        for name, kind in typed.items()
    )
    nested = {"layers": ms.PhaseLayersJson, "roofline": ms.PhaseRooflineJson}
    from pytest_llmperf.core.workload import MEMORY_FIELDS

    m = _measurement()  # and every memory figure the engine may report
    m = replace(m, engine=replace(m.engine, **dict.fromkeys(MEMORY_FIELDS, 1.5)), peak_rss=ms.PeakRss(2**20, "process"))
    records = [
        *_stored_records(),
        stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json(),
    ]
    assert set(MEMORY_FIELDS) <= set(records[-1]["memory"])
    assert len(records) > 20
    for rec in records:
        for name, kind in typed.items():
            section = rec.get(name) or {}
            assert set(section) <= set(kind.__annotations__), (name, set(section) - set(kind.__annotations__))
            if name == "layers":
                phases = section.get("phases", {}).values()
            else:
                phases = [section[p] for p in ("prefill", "decode") if name in nested and section.get(p)]
            for phase in phases:
                assert set(phase) <= set(nested[name].__annotations__), (name, set(phase))


def test_every_record_earlier_versions_wrote_reads_into_typed_parts_and_writes_back_as_it_was() -> None:
    """The workload identity and the summary are typed parts of the Measurement (``StoredWorkload``,
    ``Summary``), each reading and writing its own stored form: every record of the files
    earlier versions wrote comes back through both readers as the JSON it was, and its typed
    fields hold the stored values."""
    from pytest_llmperf.core.measurement import StoredWorkload, Summary

    records = _stored_records()
    assert len(records) > 20
    for rec in records:
        for read in (Measurement.read, Measurement.from_json):
            r = read(rec)
            assert isinstance(r.identity, StoredWorkload) and isinstance(r.summary, Summary)
            assert json.dumps(r.to_json(), sort_keys=True) == json.dumps(rec, sort_keys=True)
        assert r.identity.max_tokens == rec["workload"]["max_tokens"] and not r.identity.extra
        assert (
            r.summary.n_runs == rec["summary"]["n_runs"] and r.summary.figures["ttft_ms"] == rec["summary"]["ttft_ms"]
        )


def test_a_fresh_records_typed_parts_hold_the_measurements_figures() -> None:
    from pytest_llmperf.core import catalog
    from pytest_llmperf.core.formats import sig6

    m = _measurement()
    r = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now")
    assert (r.identity.max_tokens, r.identity.runs, r.identity.warmup) == (
        m.workload.max_tokens,
        m.workload.runs,
        m.workload.warmup,
    )
    assert r.identity.absent == frozenset() and "prompt" in r.identity and "turn" not in r.identity
    assert r.summary is not None and r.summary.n_runs == m.n_runs and r.summary.itl_count == m.itl.count
    assert r.summary.figures == {k: sig6(f.read(m)) for k, f in catalog.SUMMARY.items()}
    assert Measurement.from_json(json.loads(json.dumps(r.to_json()))) == r


@pytest.mark.parametrize(
    "section, value",
    [
        ("workload", {}),
        ("workload", {"max_tokens": 4}),  # no prompt, seed...: not written back as null
        ("workload", {"prompt_tokens": "64", "max_tokens": True, "turn": None, "later": [1]}),  # wrong kinds
        ("workload", {"prompt": None, "rate": 2, "trace_speed": 1}),  # a JSON integer where a number goes
        ("summary", {}),
        ("summary", {"tpot_ms": 2.5, "n_runs": 3}),  # an older record's subset
        ("summary", {"n_runs": None, "ttft_ms": "fast", "itl_count": 1.5, "later": 1}),  # wrong kinds
    ],
)
def test_a_hand_made_section_is_written_back_as_it_came(section: str, value: dict) -> None:
    """A hand-made record's workload or summary (the judge reads it in part) keeps each key as it
    came, the absent ones absent and those of the wrong kind as they were (in ``extra``, out of
    the typed fields), so the baselines store rewrites it unchanged."""
    r = Measurement.read({section: value})
    assert dict(getattr(r, FIELD.get(section, section))) == value and r.to_json()[section] == value
    typed = getattr(r, FIELD.get(section, section))
    for name in ("prompt_tokens", "max_tokens", "n_runs", "itl_count"):
        held = getattr(typed, name, None)
        assert held is None or (isinstance(held, int) and not isinstance(held, bool)), (name, held)
