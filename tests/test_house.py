"""benchmarks/house.py's count of the shapes one measurement takes (issue 48 point 3): its rules
(a shape's parts count with it; a stored form counts only while it travels as JSON; the marker's
keywords are the user's input), and the count of a real marker-only test."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmperf.core.measurement import Measurement, RunMetrics
from pytest_llmperf.core.workload import EngineInfo, NativeCounters, RunTrace, Workload
from pytest_llmperf.judge.result import BaselineVerdict, Outcome

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "house.py"


@pytest.fixture(scope="module")
def house():
    spec = importlib.util.spec_from_file_location("house", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["house"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("house", None)


def test_a_shapes_parts_are_its_field_types_defined_beside_it(house) -> None:
    assert RunMetrics in house.parts_of(Measurement)
    assert Workload not in house.parts_of(Measurement)  # what was measured: a shape of its own
    assert EngineInfo not in house.parts_of(Measurement)
    assert BaselineVerdict in house.parts_of(Outcome)
    assert house.parts_of(RunTrace) == {NativeCounters}
    assert house.parts_of(Workload) == set()


def test_a_stored_form_counts_only_while_it_travels(house) -> None:
    workload = {"max_tokens": house.MAX_TOKENS, "seed": 0}  # not the marker's keywords
    request = {"op": "run", "run_index": 0, "workload": True}
    sent = house.Seen("pytest_llmperf.measuring.worker.run", None, [])
    travels = house.Traced(seen=[sent], written=[workload], dumped=[request, workload])
    assert house.shapes(travels) == {}
    # The same dict given to a function that reads it: a shape (a record read as a dict).
    read = house.Seen("pytest_llmperf.judge.regression.judge", None, [workload])
    assert list(house.shapes(house.Traced(seen=[sent, read], written=[workload], dumped=[workload]))) == [
        "dict{max_tokens, seed}"
    ]
    # Written but never made text: a shape too.
    kept = house.Seen("pytest_llmperf.baselines.records.record", workload, [])
    assert list(house.shapes(house.Traced(seen=[kept], written=[workload]))) == ["dict{max_tokens, seed}"]
    # Parsed from a pipe, passed on (returned) and read by a from_json: the stored form.
    back = {"max_tokens": house.MAX_TOKENS, "seed": 0}
    received = house.Seen("pytest_llmperf.measuring.worker._receive", back, [])
    assert house.shapes(house.Traced(seen=[received], parsed=[back], read=[back])) == {}
    assert list(house.shapes(house.Traced(seen=[received], read=[back]))) == ["dict{max_tokens, seed}"]


def test_the_markers_keywords_are_the_users_input(house) -> None:
    given = house.Seen("pytest_llmperf.session.options.validate", None, [dict(house.MARKER)])
    assert house.shapes(house.Traced(seen=[given])) == {}
    field = {k: v for k, v in house.MARKER.items() if k != "warmup"}  # the workload's keys of a marker
    assert house.shapes(house.Traced(seen=[house.Seen("x.y", field, [])])) == {}
    more = {**house.MARKER, "seed": 1}  # a dict of the plugin's making that holds the workload
    assert len(house.shapes(house.Traced(seen=[house.Seen("x.y", None, [more])]))) == 1


def test_a_marker_only_tests_line_starts_with_four_of_the_five_shapes_and_no_message(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("shapes of one measurement", 1)[1].splitlines()[1:]
    shapes = [line.split()[0] for line in listed if line.startswith("  ")]
    assert shapes[:4] == [
        "pytest_llmperf.session.options.MarkerConfig",
        "pytest_llmperf.core.workload.Workload",
        "pytest_llmperf.core.workload.RunTrace",
        "pytest_llmperf.core.measurement.Measurement",
    ], done.stdout
    assert "pytest_llmperf.judge.result.Outcome" in shapes
    assert not [s for s in shapes if s.startswith(("dict{op", "dict{delivered_ns", "dict{max_tokens, prompt_tokens"))]
    assert "with its parts RunMetrics" in done.stdout
