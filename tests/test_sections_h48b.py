"""Issue 48: the load, model loads, agreement and prompt-length sections write and read their own
stored form (``to_json`` / ``from_json``): what the measuring code builds comes back from its
JSON as it was written, byte for byte, every stored form of the files earlier versions wrote
reads and writes back as it was, and a malformed one raises (a Measurement keeps it as it came)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmperf.core.measurement import (
    Agreement,
    LatencyStats,
    LengthBucket,
    LoadSample,
    LoadStats,
    Measurement,
    ModelLoads,
    PromptLengths,
    ServerSide,
    TraceReplay,
)

DATA = Path(__file__).parent / "data"

ms = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
signed = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
share = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
count = st.integers(min_value=0, max_value=10_000)
maybe = st.one_of(st.none(), ms)
text = st.text(max_size=20)


def _stats(p50: float, p99: float) -> LatencyStats:
    return LatencyStats(3, p50, 1.0, 0.1, p50, p99, p50, p99, p99, p99)


@st.composite
def traces(draw: st.DrawFn) -> TraceReplay:
    n = draw(st.integers(min_value=1, max_value=8))
    scheduled = sorted(draw(st.lists(ms, min_size=n, max_size=n)))
    sent = draw(st.lists(ms, min_size=n, max_size=n))
    speed = draw(st.one_of(st.just(1.0), st.integers(1, 8), ms.filter(bool)))
    return TraceReplay.of(n, draw(ms), speed, scheduled, sent)


servers = st.builds(
    ServerSide,
    count,
    st.one_of(st.none(), ms, count),
    st.one_of(st.none(), count),
    st.one_of(st.none(), ms, count),
    st.one_of(st.none(), count),
    maybe,
    st.one_of(st.none(), signed),
    maybe,
    st.one_of(st.none(), signed),
    metrics=st.one_of(st.none(), st.dictionaries(st.sampled_from(["n_decode_total", "tokens_predicted_total"]), ms)),
    prompt_tokens_from_cache=st.one_of(st.none(), count),
)


@st.composite
def loads(draw: st.DrawFn) -> LoadStats:
    ok = draw(st.integers(min_value=1, max_value=50))
    failed = draw(st.integers(min_value=0, max_value=5))
    ttft, tpot = draw(st.tuples(ms, ms)), draw(st.tuples(ms, ms))
    return LoadStats(
        concurrency=draw(st.integers(1, 64)),
        rate_per_s=draw(st.one_of(st.none(), ms.filter(bool), st.integers(1, 9))),
        n_requests=ok + failed,
        n_ok=ok,
        output_tps=draw(ms),
        requests_per_s=draw(ms),
        goodput=draw(share),
        ttft_p50_ms=ttft[0],
        ttft_p99_ms=ttft[1],
        tpot_p50_ms=tpot[0],
        tpot_p99_ms=tpot[1],
        prompt_cache=draw(st.one_of(st.none(), text)),
        server=draw(st.one_of(st.none(), servers)),
        trace=draw(st.one_of(st.none(), traces())),
        errors=tuple(f"request {i}: refused" for i in range(failed)),
        duration_s=draw(ms),
        ttft=_stats(*ttft),
        tpot=_stats(*tpot),
        e2e=_stats(*ttft),
        output_tps_per_request=draw(ms),
        slo=draw(st.dictionaries(st.sampled_from(["ttft_ms", "tpot_ms"]), ms)),
    )


samples = st.builds(LoadSample, ms, maybe, maybe, st.one_of(st.none(), share))
model_loads = st.builds(ModelLoads.of, st.sampled_from(["warm", "cold"]), st.lists(samples, min_size=1, max_size=6))
agreements = st.one_of(
    st.builds(Agreement, reason=text.filter(bool)),
    st.builds(
        Agreement,
        method=text,
        n_prompts=count,
        n_positions=count,
        top1_agreement=share,
        kl_mean=ms,
        kl_p99=ms,
        kl_max=ms,
        greedy_parity=share,
        n_unscored=count,
        first_divergence=st.lists(st.one_of(st.none(), count), max_size=5).map(tuple),
    ),
)
buckets = st.builds(LengthBucket, count, count, count, ms, ms, maybe)
prompt_lengths = st.builds(
    PromptLengths,
    text,
    count,
    st.lists(buckets, max_size=5).map(tuple),
    maybe,
    maybe,
    st.one_of(st.none(), signed),
    maybe,
)

SECTIONS: dict[str, tuple[Any, Any]] = {
    "load": (LoadStats, loads()),
    "model_loads": (ModelLoads, model_loads),
    "agreement": (Agreement, agreements),
    "prompt_lengths": (PromptLengths, prompt_lengths),
}


def _round_trips(cls: Any, x: Any) -> None:
    written = json.dumps(x.to_json())
    again = cls.from_json(json.loads(written))
    assert json.dumps(again.to_json()) == written
    assert cls.from_json(json.loads(json.dumps(again.to_json()))) == again  # read back: a fixed point


@settings(max_examples=150, deadline=None)
@given(x=loads())
def test_a_load_level_comes_back_from_its_json_as_it_was_written(x: LoadStats) -> None:
    _round_trips(LoadStats, x)
    back = LoadStats.from_json(json.loads(json.dumps(x.to_json())))
    assert back == x.to_json() and back.n_failed == x.n_failed and back.errors == () and back.ttft is None
    assert (back.trace is None) == (x.trace is None) and (back.server is None) == (x.server is None)


@settings(max_examples=150, deadline=None)
@given(x=model_loads)
def test_model_loads_come_back_from_their_json_as_written(x: ModelLoads) -> None:
    _round_trips(ModelLoads, x)


@settings(max_examples=150, deadline=None)
@given(x=agreements)
def test_an_agreement_comes_back_from_its_json_as_written(x: Agreement) -> None:
    _round_trips(Agreement, x)
    assert Agreement.from_json(json.loads(json.dumps(x.to_json()))) == x  # nothing rounded


@settings(max_examples=150, deadline=None)
@given(x=prompt_lengths)
def test_prompt_lengths_come_back_from_their_json_as_written(x: PromptLengths) -> None:
    _round_trips(PromptLengths, x)


def _damaged(d: Mapping[str, Any], key: str, how: str) -> dict[str, Any]:
    """``d`` with ``key`` left out or of a kind it never holds (a list where text or a number
    belongs, text where a list belongs)."""
    out = dict(d)
    if how == "missing" and key not in ("server", "trace"):  # those two are only written where set
        del out[key]
    elif isinstance(d[key], list):
        out[key] = "x"
    else:
        out[key] = [] if how != "bool" or key == "available" else True
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(SECTIONS)), how=st.sampled_from(["missing", "kind", "bool"]))
def test_a_malformed_section_raises(data: st.DataObject, name: str, how: str) -> None:
    cls, strategy = SECTIONS[name]
    d = json.loads(json.dumps(data.draw(strategy).to_json()))
    key = data.draw(st.sampled_from(sorted(d)))
    with pytest.raises((KeyError, TypeError, ValueError)):
        cls.from_json(_damaged(d, key, how))


def _records(doc: object) -> Iterator[Mapping[str, Any]]:
    if isinstance(doc, Mapping):
        for entries in (doc.get("tests") or {}).values():
            yield from entries.values()
        for r in doc.get("results") or []:
            yield from (r[k] for k in ("record", "baseline_record") if r.get(k))


def _files() -> list[Path]:
    release = DATA / "release-0.1"
    return [
        *sorted((release / "baselines").glob("*.json")),
        release / "s2.json",
        release / "s3.json",
        *DATA.glob("*.json"),
    ]


def test_every_stored_section_of_the_files_reads_and_writes_back_as_it_was() -> None:
    read = 0
    for path in _files():
        for rec in _records(json.loads(path.read_text())):
            for name, (cls, _) in SECTIONS.items():
                if isinstance(rec.get(name), Mapping):
                    assert cls.from_json(rec[name]).to_json() == rec[name], (path, name)
                    read += 1
            back = Measurement.read(rec)
            assert not back.unread and back.to_json() == rec
    assert read >= 3  # the model loads of the files before the record type


@pytest.mark.parametrize(
    ("name", "damaged", "path", "value"),
    [
        ("model_loads", {"load_ms": "slow", "samples": []}, ("model_loads", "load_ms"), "slow"),
        ("agreement", {"top1_agreement": "high"}, ("agreement", "top1_agreement"), "high"),
        ("load", {"goodput": [1]}, ("load", "goodput"), [1]),
        ("prompt_lengths", {"rule": 3}, ("prompt_lengths", "rule"), 3),
    ],
)
def test_a_record_keeps_a_section_it_cannot_read_as_it_came(
    name: str, damaged: dict[str, object], path: tuple[str, ...], value: object
) -> None:
    rec = {"commit": None, "hardware": {}, "subject": {}, "workload": {}, "runs": {}, name: damaged, "reference": {}}
    r = Measurement.read(rec)
    assert getattr(r, name) is None and r.unread == {name: damaged}
    held: object = r.to_json()
    for key in path:
        held = held[key]  # type: ignore[index]
    assert held == value
    assert list(r.to_json()) == list(rec) and r.to_json() == rec


READERS: dict[str, Callable[[Mapping[str, object]], object]] = {k: cls.from_json for k, (cls, _) in SECTIONS.items()}


@settings(max_examples=50, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(SECTIONS)))
def test_a_record_holds_each_section_typed_and_reads_it_by_attribute(data: st.DataObject, name: str) -> None:
    x = data.draw(SECTIONS[name][1])
    rec = {"commit": None, "hardware": {}, "subject": {}, "workload": {}, "runs": {}, name: x.to_json()}
    rec = json.loads(json.dumps(rec))
    r = Measurement.read(rec)
    held = getattr(r, name)
    assert isinstance(held, SECTIONS[name][0]) and not r.unread
    assert json.dumps(r.to_json()) == json.dumps(rec)
    first = next(iter(rec[name]))  # concurrency, asked, reason, rule: the catalog's readers' path
    assert r.to_json()[name][first] == getattr(held, first)
    assert READERS[name](rec[name]) == held


@given(x=loads())
def test_a_load_level_reads_no_key_it_never_writes_and_no_null_metrics(x: LoadStats) -> None:
    """A key of a field the record does not keep (``UNSTORED``: a load level's ``ttft``, a trace's
    ``scheduled_s``) is not read, whatever it holds; a server side's ``metrics`` is always written
    as an object, so a null one is not a stored load level (it is kept unread, as it came)."""
    d = json.loads(json.dumps(x.to_json()))
    junk = {**d, "ttft": "not stats", "duration_s": [1], "slo": 3}
    if "trace" in d:
        junk["trace"] = {**d["trace"], "scheduled_s": "no"}
    assert LoadStats.from_json(junk).to_json() == d
    if "server" in d:
        with pytest.raises(TypeError):
            LoadStats.from_json({**d, "server": {**d["server"], "metrics": None}})
