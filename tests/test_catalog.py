"""The metric catalog is the one definition: the schema's budget keys, budgets, the HTML
budget table, the stored record and the documented marker-key table all agree with it,
on real measurements of the tiny model."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from pytest_llmperf import Workload, measure
from pytest_llmperf.core import catalog
from pytest_llmperf.judge.budgets import STATISTICS
from pytest_llmperf.core.fingerprint import Fingerprint, subject
from pytest_llmperf.reports.html import _budget_rows, budget_value
from pytest_llmperf.measuring.machine_peak import Peak
from pytest_llmperf.baselines.records import record
from pytest_llmperf.judge.marker import BUDGET_KEYS, KEYS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def measured(tiny_engine):
    """A plain measurement with a roofline (given peaks: no probe) and a load measurement
    with SLOs (goodput): between them every catalog metric has a value."""
    plain = measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=6, runs=3, warmup=0),
                    peaks=(Peak(45.0, "given"), Peak(0.157, "given")))
    load = measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=6, requests=3, concurrency=1, warmup=0),
                   slo={"ttft_ms": 60_000.0, "tpot_ms": 60_000.0})
    return [(m, record(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now"))
            for m in (plain, load)]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)  # records keep 6 significant figures


def test_schema_budget_keys_are_the_catalogs() -> None:
    assert list(BUDGET_KEYS) == list(catalog.BUDGETS)
    for key, budget in catalog.BUDGETS.items():
        assert KEYS[key].help == budget.help
        assert budget.metric in catalog.METRICS
        assert key in catalog.METRICS[budget.metric].budget_keys
        stat = STATISTICS[key]
        assert (stat.label, stat.unit, stat.ceiling) == (
            budget.label, catalog.metric_of(key).unit, not catalog.metric_of(key).higher_is_better)
    assert all(m.phase in catalog.PHASES for m in catalog.METRICS.values())


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
        _agree(measured, metric.name, metric.read, metric.from_record)


def test_html_budget_value_is_the_measured_value_for_every_budget_key(measured) -> None:
    for key, stat in STATISTICS.items():
        _agree(measured, key, stat.value, lambda rec: budget_value(rec, key))
    # The table itself: e2e_ms and min_goodput used to show "not in record".
    m, rec = measured[1]
    rows = _budget_rows({"budgets": {"e2e_ms": 1e9, "min_goodput": 0.5, "ttft_ms": 1e9}, "record": rec})
    assert all("not in record" not in cell for row in rows for cell in row), rows
    assert all("ok" in row[-1] for row in rows), rows


def _documented_budget_rows() -> dict[str, str]:
    """Budget rows of the marker-key table (``| `key` | kind | meaning |``) in README or docs."""
    rows: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3 and cells[1] == "budget":
                for key in re.findall(r"`(\w+)`", cells[0]):
                    rows[key] = cells[2]
    return rows


def test_documented_marker_key_table_matches_the_catalog() -> None:
    rows = _documented_budget_rows()
    assert set(rows) == set(catalog.BUDGETS), "README/docs marker-key table: budget rows differ from catalog.BUDGETS"
    for key, meaning in rows.items():
        word = "max" if catalog.is_ceiling(key) else "min"
        assert re.search(rf"\b{word}\b", meaning), f"{key}: the table should say {word!r}: {meaning}"


def test_catalog_is_a_bottom_layer() -> None:
    """It imports nothing from the package and no numpy at import (the plugin loads it)."""
    import ast

    tree = ast.parse((ROOT / "pytest_llmperf" / "core" / "catalog.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top if isinstance(n, ast.ImportFrom) and n.level], "catalog imports from the package"
    names = {a.name.split(".")[0] for n in top for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert not names & {"numpy", "scipy", "pytest", "pytest_llmperf"}, names
