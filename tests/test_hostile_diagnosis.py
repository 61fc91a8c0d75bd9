"""The diagnoses beside a verdict (where llama.cpp's time went) on data that does not fit:
two models' layers are compared only where they match (another layer count or other names:
one line says so, no ``0 ms`` rows, no "uniform across layers"), a slice one side lacks shows
``-`` and never runs into its neighbour cell; a baseline whose attribution pass is damaged (a
string, ``{}``, a field missing) is named beside the verdict in one line, never a failed test
nor a silent drop. Synthetic passes: the judge's reading is what is tested."""

from __future__ import annotations

import pytest

from pytest_llmperf.core.measurement import Attribution, Measurement, PhaseAttribution, Slice
from pytest_llmperf.judge.attribution import AttributionChange, compare_phase, compare_records, readable

RUNS = 8


def _slice(name: str, ms: float) -> Slice:
    return Slice(name, ms, tuple(ms * (1 + 0.01 * i) for i in range(RUNS)))


def _phase(phase: str, n_layers: int, layer_ms: float = 1.0, ops: tuple[str, ...] = ("MUL_MAT",)) -> PhaseAttribution:
    layers = (*(_slice(f"layer {i}", layer_ms) for i in range(n_layers)), _slice("output", 0.5))
    return PhaseAttribution(
        phase,
        layers,
        tuple(_slice(op, 0.676) for op in ops),
        (_slice("matrix multiplication", 0.676),),
        step_ms=n_layers * layer_ms + 0.5,
        nodes_ms=n_layers * layer_ms + 0.5,
        coverage=1.0,
        nodes=10 * n_layers,
        n_runs=RUNS,
        n_steps=RUNS,
    )


def _attribution(n_layers: int, **kw) -> Attribution:
    return Attribution(_phase("prefill", n_layers, **kw), _phase("decode", n_layers, **kw), 1.0, None, None, 1.0)


@pytest.mark.parametrize(
    "a_layers, b_layers, says",
    [
        (2, 6, "layers not compared: A has 2 layers, B 6 (different models)"),
        (6, 2, "layers not compared: A has 6 layers, B 2 (different models)"),
    ],
)
def test_layers_of_models_with_other_layer_counts_are_not_compared(a_layers, b_layers, says) -> None:
    a, b = _phase("decode", a_layers), _phase("decode", b_layers, layer_ms=3.0)
    change = compare_phase(a, b)
    assert change.reading.startswith(says + "; "), change.reading
    assert "uniform" not in change.reading and "no layer moved" not in change.reading
    assert [c.name for c in change.layers] == ["output"]  # what both have, compared; no block row


def test_layers_named_differently_are_not_compared() -> None:
    a, b = _phase("decode", 2), _phase("decode", 2, layer_ms=3.0)
    b = PhaseAttribution(**{**b.__dict__, "layers": (_slice("layer 7", 3.0), _slice("layer 8", 3.0))})
    change = compare_phase(a, b)
    assert change.reading.startswith("layers not compared: A's and B's layers are named differently")
    assert not change.layers


def test_layers_that_match_are_compared_as_before() -> None:
    change = compare_phase(_phase("decode", 4), _phase("decode", 4, layer_ms=2.0))
    assert change.reading.startswith("uniform across layers (+100.0%)"), change.reading
    assert [c.name for c in change.layers] == [*(f"layer {i}" for i in range(4)), "output"]


def test_a_slice_one_side_lacks_shows_a_dash_and_its_cells_stay_apart() -> None:
    a, b = _attribution(2), _attribution(6, ops=("MUL_MAT", "FLASH_ATTN_EXT"))
    from pytest_llmperf.judge.attribution import compare_attributions

    lines = compare_attributions(a, b, reason="asked: attribution=True").lines()
    row = next(ln for ln in lines if ln.split()[:1] == ["FLASH_ATTN_EXT"] and len(ln.split()) > 4)
    cells = row.split()
    assert cells[:4] == ["FLASH_ATTN_EXT", "-", "0.676", "only"], row  # "0.676only in B" before
    assert all(len(ln) <= 80 for ln in lines), lines
    assert not any(" 0 " in ln or ln.rstrip().endswith(" 0") for ln in lines), lines


def test_the_html_and_markdown_cells_of_a_slice_one_side_lacks_show_a_dash() -> None:
    from pytest_llmperf.judge.attribution import compare_attributions
    from pytest_llmperf.reports.where import attribution_phases

    change = compare_attributions(_attribution(2), _attribution(2, ops=("MUL_MAT", "FLASH_ATTN_EXT")), reason="x")
    rows = [row for _, _, rows in attribution_phases(change.to_json()) for row in rows if row[1] == "FLASH_ATTN_EXT"]
    assert rows and all(row[2:5] == ["-", "0.676", "only in B"] for row in rows), rows


GOOD = _attribution(2).to_json()


@pytest.mark.parametrize(
    "stored, says",
    [
        ("damaged", "the baseline's attribution pass is str, not an object"),
        ({}, "the baseline's attribution pass is empty"),
        ([1, 2], "the baseline's attribution pass is list, not an object"),
        ({"phases": {}}, "the baseline's attribution pass is damaged (no 'prefill')"),
        ({**GOOD, "tpot_ms": "fast"}, "the baseline's attribution pass is damaged (ValueError)"),
    ],
)
def test_a_damaged_attribution_in_a_baseline_is_named_in_one_line(stored, says) -> None:
    line = compare_records(Measurement.read({"attribution": stored}), Measurement.read({"attribution": GOOD}))
    assert isinstance(line, str) and line.startswith(says), line
    assert line.endswith("re-record the baseline with --llmperf-update-baselines") and "\n" not in line
    assert readable(stored) == line


def test_a_readable_attribution_is_compared_and_none_when_either_keeps_none() -> None:
    assert isinstance(
        compare_records(Measurement.read({"attribution": GOOD}), Measurement.read({"attribution": GOOD})),
        AttributionChange,
    )
    assert compare_records(Measurement.read({}), Measurement.read({"attribution": GOOD})) is None
    assert (
        compare_records(Measurement.read({"attribution": "damaged"}), Measurement.read({})) is None
    )  # not asked now: nothing to say


@pytest.mark.parametrize("stored", ["damaged", {}])
def test_a_damaged_attribution_is_a_note_of_the_verdict_and_the_file_stays_valid(stored) -> None:
    """The baseline file's schema takes any value there (a diagnosis, not a gate): the verdict
    is judged as without one (compared, not an error), and its note names the damage."""
    from pytest_llmperf.core.documents import load_schema
    from pytest_llmperf.judge.regression import CompareSettings, judge

    schema = load_schema("baselines")["$defs"]["record"]["properties"]["attribution"]
    assert "type" not in schema
    runs = {name: [10.0, 10.2, 9.9, 10.1, 10.0] for name in ("ttft_ms", "tpot_ms", "itl_p95_ms")}
    record = {"workload": {"max_tokens": 8, "prompt_tokens": 4}, "subject": {}, "hardware": {}, "runs": runs}
    v = judge(
        {"hw": Measurement.read({**record, "attribution": stored})},
        "hw",
        Measurement.read({**record, "attribution": GOOD}),
        CompareSettings(),
    )
    assert v.status == "compared" and v.comparisons and v.attribution is None
    assert readable(stored) in v.note, v.note
