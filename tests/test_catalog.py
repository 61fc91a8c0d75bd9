"""The metric catalog is the one definition: the schema's budget keys, budgets, the
comparison's metrics, the HTML budget table, the stored record and its summary, the session
table's columns and the documented marker-key table all agree with it, on real measurements
of the tiny model."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from pathlib import Path

import pytest

from pytest_llmperf import Workload, measure
from pytest_llmperf.baselines.records import stored
from pytest_llmperf.core import catalog
from pytest_llmperf.core.fingerprint import Fingerprint, subject
from pytest_llmperf.core.measurement import Measurement, Peak, RunMetrics
from pytest_llmperf.judge import rule as compare
from pytest_llmperf.judge.result import Figures
from pytest_llmperf.measuring.agreement import compare_outputs
from pytest_llmperf.reports.html import _budget_rows, budget_value
from pytest_llmperf.session.options import BUDGET_KEYS, KEYS
from pytest_llmperf.session.options import validate as validate_marker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def measured(tiny_engine):
    """A plain measurement with a roofline (given peaks: no probe), fresh model loads and an output
    agreement, and a load measurement with SLOs (goodput): between them every catalog metric has a value."""
    plain = measure(
        tiny_engine,
        Workload(prompt_tokens=8, max_tokens=6, runs=3, warmup=0),
        peaks=(Peak(45.0, "given"), Peak(0.157, "given")),
        model_load="warm",  # fresh loads: the start-up figures
    )
    # The output agreement a measurement against --llmperf-against's REF carries (here A/A).
    plain = dataclasses.replace(plain, agreement=compare_outputs(tiny_engine, tiny_engine, plain.workload, n_prompts=1))
    load = measure(
        tiny_engine,
        Workload(prompt_tokens=8, max_tokens=6, requests=3, concurrency=1, warmup=0),
        slo={"ttft_ms": 60_000.0, "tpot_ms": 60_000.0},
    )
    # A callable on the engine's Llama with a Python logits processor: the user path's parts.
    llm = tiny_engine.llm

    def with_processor(prompt: str, max_tokens: int):
        from llama_cpp import LogitsProcessorList

        keep = LogitsProcessorList([lambda ids, scores: scores])
        for i, token in enumerate(llm.generate(llm.tokenize(prompt.encode()), temp=0.0, logits_processor=keep)):
            yield token
            if i + 1 >= max_tokens:
                return

    user = measure(with_processor, Workload(prompt_tokens=8, max_tokens=6, runs=3, warmup=0))
    return [
        (m, stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json())
        for m in (plain, load, user)
    ]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)  # records keep 6 significant figures


def test_schema_budget_keys_are_the_catalogs() -> None:
    assert list(BUDGET_KEYS) == list(catalog.BUDGETS)
    for key, budget in catalog.BUDGETS.items():
        assert KEYS[key].help == budget.help
        assert budget.metric in catalog.METRICS
        assert key in catalog.METRICS[budget.metric].budget_keys
        metric = catalog.METRICS[budget.metric]
        assert (budget.unit, budget.ceiling) == (metric.unit, not metric.higher_is_better)
        # The help says which way the budget bounds (and the marker-key table repeats it).
        assert re.search(rf"\b{'max' if budget.ceiling else 'min'}\b", budget.help), (key, budget.help)
    assert all(m.phase in catalog.PHASES for m in catalog.METRICS.values())


def test_compared_metrics_and_summary_columns_are_the_catalogs() -> None:
    assert compare.METRICS == {n: m for n, m in catalog.METRICS.items() if m.judged or m.mirror_of}
    assert [m.name for m in compare.JUDGED] == ["ttft_ms", "tpot_ms", "itl_p95_ms"]
    for m in compare.METRICS.values():  # a mirror is a rate of a judged metric's runs, the other way round
        if m.mirror_of:
            source = catalog.METRICS[m.mirror_of]
            assert source.judged and (source.phase, source.higher_is_better) == (m.phase, not m.higher_is_better)
    assert [(c, h, k) for c, h, k in catalog.SUMMARY_COLUMNS if k in catalog.SUMMARY] == [
        (f.column, f.header, f.key) for f in catalog.SUMMARY.values() if f.column
    ]
    for key, field in catalog.SUMMARY.items():
        assert field.metric in catalog.METRICS
        if field.reader is None:  # the metric's own value: what its from_record reads
            assert catalog.METRICS[field.metric].summary_key == key, key


def test_figures_are_the_catalogs(measured) -> None:
    """The typed result stores the catalog's figures (the JUnit properties, in its order); a
    figure of a metric reads what that metric's summary field or budget reads."""
    assert [f.name for f in dataclasses.fields(Figures)] == [*catalog.FIGURES, "load"]
    for m, _ in measured:
        assert list(Figures.of(m).values()) == list(catalog.FIGURES)
    for f in catalog.FIGURES.values():
        if f.metric is not None:
            assert f.metric in catalog.METRICS and f.label and f.statistic, f.name
            if f.name in catalog.SUMMARY:
                for m, _ in measured:
                    assert f.read(m) == catalog.SUMMARY[f.name].read(m), f.name
    # Every figure of a row of the terminal's summary table is a figure or the budget.
    assert {k for _, _, k in catalog.SUMMARY_COLUMNS} <= {"test", "budget", *catalog.FIGURES}


#: A figure's JSON type (``Figure.json``) as its ``Figures`` field declares it.
PYTHON_TYPES = {"string": "str", "integer": "int", "number": "float", "null": "None"}


def test_figures_declares_each_catalog_figure_with_its_type() -> None:
    """``Figures`` is declared in source (mypy reads its fields); the catalog stays the one
    definition: each entry of ``FIGURES`` is a field, in its order, of the Python type of its
    JSON type, or None too where the session schema does not require it (an older file lacks
    it). A figure added to the catalog alone fails here, naming the lines to declare."""
    from pytest_llmperf.core.documents import load_schema

    required = set(load_schema("session")["$defs"]["figures"]["required"])
    expected = {}
    for name, f in catalog.FIGURES.items():
        types = [PYTHON_TYPES[t] for t in f.json]
        expected[name] = " | ".join(types if name in required or "None" in types else [*types, "None"])
    declared = {f.name: f.type for f in dataclasses.fields(Figures)}
    assert declared.pop("load") == "LoadFigures | None"
    fields = "\n".join(f"    {name}: {kind}" for name, kind in expected.items())
    assert declared == expected and list(declared) == list(expected), (
        f"core/catalog.py's HeadlineFigures (judge/result.py's Figures) must declare the catalog's figures, in this order:\n{fields}"
    )
    # Real types, too (each value is of its JSON type: test_the_session_schema_has_every_figure).
    assert typing.get_type_hints(Figures)["prompt_tokens"] == int | None


def test_run_fields_are_the_run_shapes() -> None:
    """The catalog reads a run's ``run_field`` by name: each is a field of ``RunMetrics``."""
    members = {f.name for f in dataclasses.fields(RunMetrics)}
    assert set(catalog.RUN_FIELDS) <= members, set(catalog.RUN_FIELDS) - members


def _agree(measured, name: str, read, from_record) -> None:
    """``from_record(record)`` equals ``read(measurement)`` wherever the measurement has a
    value, and at least one measurement has one."""
    seen = 0
    for m, rec in measured:
        value = read(m)
        if value is None:
            continue
        seen += 1
        stored = from_record(rec)
        assert stored is not None and _close(stored, value), (name, stored, value)
    assert seen, f"{name}: no measurement had a value"


def test_every_metric_reads_from_a_measurement_and_its_record(measured) -> None:
    for metric in catalog.METRICS.values():
        _agree(measured, metric.name, metric.read, lambda rec, metric=metric: metric.from_record(Measurement.read(rec)))


def test_every_summary_field_is_stored_in_the_record(measured) -> None:
    for key, field in catalog.SUMMARY.items():
        _agree(measured, key, field.read, lambda rec, key=key: rec["summary"].get(key))
    for _, rec in measured:
        assert list(rec["summary"]) == ["n_runs", "itl_count", *catalog.SUMMARY]


def test_html_budget_value_is_the_measured_value_for_every_budget_key(measured) -> None:
    for key, budget in catalog.BUDGETS.items():
        _agree(measured, key, budget.read, lambda rec, key=key: budget_value(Measurement.read(rec), key))
    # The table itself: e2e_ms and min_goodput used to show "not in record".
    _, rec = measured[1]
    from pytest_llmperf.judge.result import MeasurementResult

    rows = _budget_rows(
        MeasurementResult(
            "t", budgets={"e2e_ms": 1e9, "min_goodput": 0.5, "ttft_ms": 1e9}, record=Measurement.read(rec)
        )
    )
    assert all("not in record" not in cell for row in rows for cell in row), rows
    assert all("ok" in row[-1] for row in rows), rows


def _marker_key_rows() -> list[tuple[str, tuple[str, ...], str, str]]:
    """Every row of the marker-key table (``| `key`, `key` | kind | meaning |``) in the README
    or docs/: (where, keys, kind, meaning)."""
    kinds = {k.kind for k in KEYS.values()}
    rows = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) == 3 and cells[1] in kinds:
                keys = tuple(re.findall(r"`(\w+)`", cells[0]))
                meaning = re.sub(r"; see [^)]*\)", ")", cells[2].replace("`", ""))  # a section link may follow
                rows.append((f"{path.name}:{n}", keys, cells[1], meaning))
    return rows


def test_documented_marker_key_table_matches_the_schema_and_catalog() -> None:
    """Every row: its keys exist, with the kind it says; every key in exactly one row; a
    budget's meaning is the catalog's help text (one row per budget key), so a renamed key, a
    new key, a changed kind or direction or unit fails here."""
    rows = _marker_key_rows()
    assert rows, "no marker-key table found in README.md or docs/"
    seen: dict[str, str] = {}
    for where, keys, kind, meaning in rows:
        assert keys, f"{where}: a row names no key"
        for key in keys:
            assert key in KEYS, f"{where}: {key!r} is not a marker key"
            assert key not in seen, f"{where}: {key!r} is also in the row at {seen[key]}"
            seen[key] = where
            assert KEYS[key].kind == kind, f"{where}: {key!r} is a {KEYS[key].kind} key, the table says {kind}"
        if kind == "budget":
            assert len(keys) == 1, f"{where}: one budget key per row: {keys}"
            assert meaning == catalog.BUDGETS[keys[0]].help, (where, meaning, catalog.BUDGETS[keys[0]].help)
    assert set(seen) == set(KEYS), f"marker keys missing from the table: {sorted(set(KEYS) - set(seen))}"


def test_catalog_is_a_bottom_layer() -> None:
    """It imports nothing from the package and no numpy at import (the plugin loads it)."""
    import ast

    tree = ast.parse((ROOT / "pytest_llmperf" / "core" / "catalog.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top if isinstance(n, ast.ImportFrom) and n.level], "catalog imports from the package"
    names = {a.name.split(".")[0] for n in top for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)
    }
    assert not names & {"numpy", "scipy", "pytest", "pytest_llmperf"}, names


def _figure_table() -> list[tuple[str, str, str, str]]:
    """docs/report.md's figure table (``| `name` | unit | sample | meaning |`` under the
    ``| figure | unit | sample | meaning |`` header): (where, name, unit, sample)."""
    path = ROOT / "docs" / "report.md"
    rows, inside = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells == ["figure", "unit", "sample", "meaning"]:
            inside = True
        elif inside and not line.startswith("|"):
            break
        elif inside and not set(cells[0]) <= {"-"}:
            name = re.fullmatch(r"`(\w+)`", cells[0])
            assert name and len(cells) == 4, f"report.md:{n}: a figure row is | `name` | unit | sample | meaning |"
            rows.append((f"report.md:{n}", name.group(1), cells[1], cells[2]))
    assert rows, "docs/report.md has no figure table (| figure | unit | sample | meaning |)"
    return rows


def test_every_figure_has_its_docs_row_and_every_row_a_figure() -> None:
    """A new headline figure is a catalog entry plus its row in docs/report.md: this names the
    one missing (either way), a duplicate, or a unit or sample that disagrees with the catalog."""
    rows = _figure_table()
    seen: dict[str, str] = {}
    for where, name, unit, sample in rows:
        assert name in catalog.FIGURES, f"{where}: {name!r} is not a figure of core/catalog.py's FIGURES"
        assert name not in seen, f"{where}: {name!r} is also in the row at {seen[name]}"
        seen[name] = where
        f = catalog.FIGURES[name]
        if f.metric is not None:
            assert unit == f.unit, f"{where}: {name!r} is in {f.unit!r} (catalog), the table says {unit!r}"
            phase = catalog.METRICS[f.metric].phase
            want = (
                "tokens"
                if f.pooled_tokens
                else {"memory": "engine", "startup": "loads", "agreement": "positions"}.get(phase, "runs")
            )
            assert sample == want, f"{where}: {name!r}'s sample is {want!r} (catalog), the table says {sample!r}"
    missing = [n for n in catalog.FIGURES if n not in seen]
    assert not missing, f"catalog figures without a row in docs/report.md's figure table: {missing}"
    assert [name for _, name, _, _ in rows] == list(catalog.FIGURES), "the figure table's order is not the catalog's"


def test_the_session_schema_has_every_figure(measured) -> None:
    """The schema's figures are the catalog's (``documents.load_schema`` fills them in), each
    figure's value on real measurements is of its JSON type, and what the schema requires
    is a catalog figure (a figure renamed or dropped would make every older file invalid)."""
    from pytest_llmperf.core.documents import SchemaViolation, load_schema, validate

    figures = load_schema("session")["$defs"]["figures"]
    assert list(figures["properties"]) == [*catalog.FIGURES, "load"]
    unknown = [n for n in figures["required"] if n not in catalog.FIGURES]
    assert not unknown, f"session.schema.json requires figures the catalog lacks: {unknown}"
    for m, _ in measured:
        for name, f in catalog.FIGURES.items():
            try:
                f.read(m)
            except Exception as exc:  # noqa: BLE001 - name the figure, whatever its reader raised
                pytest.fail(f"figure {name!r}: its read fails on a measurement: {exc!r}")
        doc = Figures.of(m).to_json()
        try:
            validate(json.loads(json.dumps(doc)), "session", "figures", "figures")
        except SchemaViolation as exc:
            pytest.fail(f"a figure's value is not of its Figure.json type: {exc}")
        assert Figures.from_json(doc) == Figures.of(m)


def test_every_budgeted_figure_is_a_marker_key_and_reads_as_its_budget(measured) -> None:
    for name, f in catalog.FIGURES.items():
        if not f.bound:
            continue
        key = f.budget_key
        assert key in catalog.BUDGETS and key in KEYS, f"figure {name!r}: its budget key {key!r} is not a marker key"
        budget = catalog.BUDGETS[key]
        assert (budget.metric, budget.statistic, budget.help) == (f.metric, f.statistic, f.bound), name
        for m, _ in measured:
            assert budget.read(m) == f.read(m), name


def test_the_metrics_table_shows_every_figure_of_a_metric(measured) -> None:
    from pytest_llmperf.reports.text import figure_rows, metrics_table

    placed = [n for row in figure_rows().values() for n in row]
    assert sorted(placed) == sorted(n for n, f in catalog.FIGURES.items() if f.metric), placed
    # The plain measurement has every row but a callable's delivery (shown where there is one:
    # the user path's measurement, the third).
    for (m, _), phases in ((measured[0], None), (measured[2], {"delivery"})):
        text = metrics_table(m)
        for row in figure_rows().values():
            first, *more = (catalog.FIGURES[n] for n in row)
            label = " / ".join([first.label, *(f.statistic for f in more)])
            phase = catalog.METRICS[first.metric or ""].phase
            if phases is not None and phase not in phases:
                continue
            if phase == "delivery" and m.delivered_items is None:
                assert label not in text, f"a row of n/a: {label!r}"
                continue
            assert label in text, f"the metrics table has no row {label!r}:\n{text}"


def test_tpot_p99_is_a_figure_a_json_field_a_table_row_and_a_budget(measured) -> None:
    """``tpot_p99_ms``, added as one catalog entry: the p99 over runs of the per-run TPOT."""
    import numpy as np

    from pytest_llmperf.judge.budgets import check_budgets
    from pytest_llmperf.reports.text import metrics_table

    m, rec = measured[0]
    p99 = float(np.percentile([r.tpot_ms for r in m.runs], 99))
    assert Figures.of(m).tpot_p99_ms == p99 and Figures.of(m).to_json()["tpot_p99_ms"] == p99
    assert "decode TPOT median / p99" in metrics_table(m)
    # Below every run's TPOT: the whole order-statistic CI of a 3-run p99 lies beyond it, however
    # one run's TPOT strays on a busy machine (at p99 / 2 a slow run left it undecided).
    marker = validate_marker({"tpot_p99_ms": min(r.tpot_ms for r in m.runs) / 2})
    failure = check_budgets(m, marker.budgets)
    assert failure is not None and [b.key for b in failure.breaches] == ["tpot_p99_ms"]
    assert check_budgets(m, validate_marker({"tpot_p99_ms": p99 * 2}).budgets) is None
    assert _close(catalog.BUDGETS["tpot_p99_ms"].from_record(Measurement.read(rec)), p99)
