"""Trace replay (issue 49 point 5): a JSONL trace of arrival times and requests replayed open
loop against a served model at its recorded pace or scaled, measured as a load test (TTFT,
TPOT, E2E, goodput against the SLO budgets), with the client's own send lag beside the
schedule; the trace's content hash in the workload's identity; ``--llmperf-write-trace``
writes a session's served requests as such a trace, which replays.

Exact control (send order, the schedule, open loop) against tests/fakeserver.py; the rest
against llama.cpp's own llama-server. No timing ratio is asserted: the recorded send offsets
against the schedule (never early), counts, and llama-server's own counters are."""

from __future__ import annotations

import json
import statistics
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from fakeserver import Streaming, event, serving
from inner import run

from pytest_llmperf import ConfigError, Workload, measure
from pytest_llmperf.baselines.records import stored as record_of
from pytest_llmperf.core.documents import MAX_DOCUMENT_MIB, SchemaViolation
from pytest_llmperf.core.formats import fmt
from pytest_llmperf.core.measurement import Measurement, workload_changes, workload_identity
from pytest_llmperf.core.traces import parse_trace, read_trace, trace_text
from pytest_llmperf.core.workload import SetRequest, TraceRequest, trace_digest, trace_requests
from pytest_llmperf.engines.http import HttpEngine
from pytest_llmperf.reports.text import metrics_table

STOP = threading.Event()

TRACE = """{"t_s": 10.0, "prompt": "the first request", "max_tokens": 4}
{"t_s": 10.3, "prompt": "the second request"}
{"t_s": 10.3, "messages": [{"role": "user", "content": "a chat request"}], "max_tokens": 3}
{"t_s": 10.9, "prompt": "the last request", "max_tokens": 5}
"""


def chat_event(text: str, finish: str | None = None) -> bytes:
    """One chat completions stream event: a token's ``text`` in its delta."""
    body = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


class Recording(Streaming):
    """Streams ``max_tokens`` tokens for every request and records what arrived, in order:
    (path, prompt or the last message's content, max_tokens). A prompt ``"hold"`` is answered
    only once a later request has arrived (``released``): a client that waits for one request
    before sending the next never gets its answer."""

    received: ClassVar[list[tuple[str, str, int]]] = []
    arrived = threading.Event()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        text = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        n = int(body["max_tokens"])
        Recording.received.append((self.path, text, n))
        if text == "hold":
            held = Recording.arrived.wait(timeout=10)
            assert held, "no later request arrived while the first was held"
        else:
            Recording.arrived.set()
        self._start_stream()
        chat = self.path.endswith("/chat/completions")
        for i in range(n):
            self._chunk(chat_event(f" t{i}") if chat else event(f" t{i}"))
        self._chunk(chat_event("", "length") if chat else event("", "length"))
        self._chunk(b"data: [DONE]\n\n")
        self._end()


@pytest.fixture
def fake(tmp_path: Path) -> str:
    Recording.received = []
    Recording.arrived.clear()
    with serving(Recording, STOP) as url:
        yield url


def write(tmp_path: Path, text: str = TRACE, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- the trace: read, checked, hashed --------------------------------------------------------


def test_a_trace_file_is_read_in_order_with_its_requests(tmp_path: Path) -> None:
    lines = read_trace(write(tmp_path))
    assert [r.t_s for r in lines] == [10.0, 10.3, 10.3, 10.9]
    assert lines[0].request == SetRequest(prompt="the first request", max_tokens=4)
    assert lines[2].request.messages == (("user", "a chat request"),)
    w = Workload(trace=lines, max_tokens=8, trace_speed=2.0)
    # Offsets from the first line's arrival, divided by the speed.
    assert w.trace_offsets_s == pytest.approx((0.0, 0.15, 0.15, 0.45))
    assert w.is_load and w.is_trace and w.n_requests == 4
    sent = [w.request(i) for i in range(4)]
    assert [r.prompt for r in sent] == ["the first request", "the second request", None, "the last request"]
    assert [r.max_tokens for r in sent] == [4, 8, 3, 5]  # a line's own, else the workload's
    assert w.request(-1).prompt == "the first request"  # warm-up k sends line k
    # Its stored form reads back as the same workload; a workload without a trace stores as before.
    assert Workload.from_json(json.loads(json.dumps(w.to_json()))) == w
    assert "trace" not in Workload().to_json() and "trace_speed" not in Workload().to_json()
    assert parse_trace(trace_text(lines), "again") == lines


def test_the_content_hash_names_a_changed_trace(tmp_path: Path) -> None:
    lines = read_trace(write(tmp_path))
    same = read_trace(write(tmp_path, TRACE.replace("\n", "\n\n"), "blank-lines.jsonl"))
    assert trace_digest(same) == trace_digest(lines)
    later = read_trace(write(tmp_path, TRACE.replace('"t_s": 10.9', '"t_s": 11.9'), "later.jsonl"))
    other = read_trace(write(tmp_path, TRACE.replace("the last", "another"), "other.jsonl"))
    assert len({trace_digest(lines), trace_digest(later), trace_digest(other)}) == 3


BAD_LINES = [
    ("not json", "not JSON"),
    ('{"t_s": 11.0, "max_tokens": 8}', "a request needs either a prompt or messages"),
    ('{"prompt": "a"}', 'a trace line needs its arrival time "t_s"'),
    ('{"t_s": "11", "prompt": "a"}', "t_s must be a number of seconds >= 0, got '11'"),
    ('{"t_s": true, "prompt": "a"}', "t_s must be a number of seconds >= 0"),
    ('{"t_s": -1, "prompt": "a"}', "t_s must be a number of seconds >= 0, got -1"),
    ('{"t_s": 10.5, "prompt": "a"}', "t_s 10.5 goes backwards (the line before: 10.9)"),
    ('{"t_s": 11.0, "prompt": "a", "weight": 2}', "unknown key 'weight'"),
    ('{"t_s": 11.0, "prompt": "a", "max_tokens": 1}', "max_tokens must be an integer from 2 to"),
    ('{"t_s": 11.0, "messages": [{"role": "robot", "content": "b"}]}', "messages[0] has role 'robot'"),
    ('["a"]', "a trace line must be an object"),
]


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = write(tmp_path, TRACE + line + "\n")
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:5: ") and says in message and "\n" not in message


def test_a_missing_empty_oversized_or_binary_file_is_one_line(tmp_path: Path) -> None:
    def problem(path: Path) -> str:
        with pytest.raises(ConfigError) as err:
            read_trace(path)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert problem(tmp_path / "none.jsonl") == f"trace {tmp_path / 'none.jsonl'}: no such file"
    assert problem(write(tmp_path, "\n \n", "empty.jsonl")).startswith(f"trace {tmp_path / 'empty.jsonl'} is empty")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:  # sparse: refused by its size before a byte is read
        fh.truncate((MAX_DOCUMENT_MIB + 1) * 2**20)
    assert f"over the {MAX_DOCUMENT_MIB} MiB" in problem(big)
    (tmp_path / "bin.jsonl").write_bytes(b'{"t_s": 0, "prompt": "\xff"}\n')
    assert "not UTF-8" in problem(tmp_path / "bin.jsonl")


def test_a_trace_is_the_whole_request_stream() -> None:
    lines = [{"t_s": 0, "prompt": "a"}, {"t_s": 1, "prompt": "b"}]
    with pytest.raises(ConfigError, match=r"drop rate \(trace_speed scales its pace\)"):
        Workload(trace=lines, rate=2.0)
    with pytest.raises(ConfigError, match="drop concurrency, requests"):
        Workload(trace=lines, concurrency=2, requests=4)
    with pytest.raises(ConfigError, match="give either a trace or a prompt"):
        Workload(trace=lines, prompt_tokens=8)
    with pytest.raises(ConfigError, match="trace_speed scales a trace's arrival times: give a trace too"):
        Workload(prompt_tokens=8, trace_speed=2.0)
    with pytest.raises(ConfigError, match="trace_speed must be a number > 0"):
        Workload(trace=lines, trace_speed=0)
    with pytest.raises(ConfigError, match=r"^trace\[1\]: t_s 0.5 goes backwards"):
        trace_requests([{"t_s": 1, "prompt": "a"}, {"t_s": 0.5, "prompt": "b"}])


def test_a_trace_on_an_engine_without_a_server_is_one_line(tiny_engine) -> None:
    w = Workload(trace=[{"t_s": 0, "prompt": "a"}], max_tokens=4, warmup=0)
    with pytest.raises(ConfigError, match="^a trace is replayed against a served model") as err:
        measure(tiny_engine, w)
    assert "\n" not in str(err.value)


def test_a_bad_trace_in_a_marker_is_one_line_at_collection(pytester: pytest.Pytester) -> None:
    write(pytester.path, TRACE + '{"t_s": 1.0, "prompt": "early"}\n', "bad.jsonl")
    pytester.makepyfile(
        test_inner="""
import pytest

@pytest.mark.llmperf(trace="bad.jsonl", max_tokens=4)
def test_replay(llmperf):
    llmperf.measure()
"""
    )
    result = run(pytester, "-p", "no:randomly")
    result.assert_outcomes(errors=1)  # collected, never run: nothing measured
    result.stdout.fnmatch_lines(
        [
            "ERROR test_inner.py - *llmperf marker key 'trace': bad.jsonl:5: t_s 1 goes backwards (the line before: 10.9)*"
        ]
    )


# -- replayed: exact control against the fake server ------------------------------------------


def test_requests_are_sent_in_trace_order_at_the_scaled_schedule(fake: str, tmp_path: Path) -> None:
    engine = HttpEngine(fake + "/v1", model="m", ignore_eos=False)
    w = Workload(trace=read_trace(write(tmp_path)), max_tokens=6, warmup=1, trace_speed=2.0)
    m = measure(engine, w, slo={"ttft_ms": 60_000, "tpot_ms": 60_000})
    s, t = m.load, m.load.trace
    assert t is not None and (t.n_requests, t.speed) == (4, 2.0) and t.span_s == pytest.approx(0.9)
    assert t.scheduled_s == pytest.approx((0.0, 0.15, 0.15, 0.45))
    # Never sent before its time; in the trace's order (the two of 10.3 s both after the first).
    assert all(sent >= due for sent, due in zip(t.sent_s, t.scheduled_s)), (t.sent_s, t.scheduled_s)
    assert t.sent_s[0] < min(t.sent_s[1], t.sent_s[2]) and max(t.sent_s[1], t.sent_s[2]) < t.sent_s[3]
    assert [lag >= 0 for lag in t.lags_ms] == [True] * 4
    # The server got the warm-up (line 0) and then every line's request as written.
    got = Recording.received
    assert got[0] == ("/v1/completions", "the first request", 4)
    assert sorted(got[1:]) == sorted(
        [
            ("/v1/completions", "the first request", 4),
            ("/v1/completions", "the second request", 6),
            ("/v1/chat/completions", "a chat request", 3),
            ("/v1/completions", "the last request", 5),
        ]
    )
    # Measured as the load test measures: per-request figures and goodput against the SLOs.
    assert (s.n_requests, s.n_ok, s.n_failed, s.goodput) == (4, 4, 0, 1.0)
    assert s.ttft.count == s.e2e.count == 4
    text = metrics_table(m)
    for row in ("trace replay, open loop", "4 requests over 0.9 s", "replayed at 2x", "client send lag p50 / max"):
        assert row in text
    assert "trace of 4 requests over 0.9 s, replayed at 2x its pace" in m.workload.describe()


def test_the_replay_is_open_loop_whatever_the_servers_backlog(fake: str) -> None:
    """The first request is answered only once the second has arrived: a client that waited for
    an answer before sending the next request would never get one (and fail the request)."""
    engine = HttpEngine(fake + "/v1", ignore_eos=False, request_timeout_s=20)
    w = Workload(trace=[{"t_s": 0.0, "prompt": "hold"}, {"t_s": 0.2, "prompt": "next"}], max_tokens=2, warmup=0)
    m = measure(engine, w, slo={"ttft_ms": 1e-6})
    assert (m.load.n_ok, m.load.n_failed) == (2, 0), m.load.errors
    assert [text for _, text, _ in Recording.received] == ["hold", "next"]
    assert m.load.goodput == 0.0  # an SLO no request meets


def test_the_trace_is_part_of_the_workloads_identity(fake: str, tmp_path: Path) -> None:
    engine = HttpEngine(fake + "/v1", ignore_eos=False)
    lines = read_trace(write(tmp_path))
    a = measure(engine, Workload(trace=lines, max_tokens=4, warmup=0, trace_speed=100.0))
    b = measure(engine, Workload(trace=lines[:3], max_tokens=4, warmup=0, trace_speed=100.0))
    ia, ib = workload_identity(a), workload_identity(b)
    assert ia["trace"] == trace_digest(lines) and ia["trace_speed"] == 100.0
    assert [c.split(" ")[0] for c in workload_changes(ia, ib)] == ["trace"]
    plain = measure(engine, Workload(prompt_tokens=4, max_tokens=4, requests=2, warmup=0))
    assert "trace" not in workload_identity(plain) and "trace_speed" not in workload_identity(plain)


def test_the_engine_keeps_what_it_sent_without_its_headers(fake: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMPERF_API_KEY", "sk-never-in-a-trace")
    engine = HttpEngine(fake + "/v1", ignore_eos=False, api="chat")
    w = Workload(prompt="hello there", max_tokens=3, runs=2, warmup=1)
    measure(engine, w)
    assert engine.take_sent() == []  # kept only when asked (the session asks under --llmperf-write-trace)
    engine.keep_sent = True
    measure(engine, w)
    sent = engine.take_sent()
    assert [r.request for r in sent] == [SetRequest(prompt="hello there", max_tokens=3)] * 3
    assert [r.sent_ns for r in sent] == sorted(r.sent_ns for r in sent)
    assert engine.take_sent() == []  # taken once
    assert "sk-never" not in trace_text([TraceRequest(0.0, r.request) for r in sent])


# -- against llama.cpp's own llama-server -----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_server(llama_server_binary):
    from pytest_llmperf import ensure_model
    from pytest_llmperf.engines.servers import serve_llama_server

    with serve_llama_server(ensure_model("tiny"), parallel=4, threads=1) as server:
        yield server


def test_a_trace_replayed_on_llama_server(tiny_server, tmp_path: Path) -> None:
    def line(i: int) -> dict[str, object]:
        text = f"request number {i} of the replayed trace"
        ask = {"messages": [{"role": "user", "content": text}]} if i == 2 else {"prompt": text}  # chat: its template
        return {"t_s": 0.1 * i, **ask, "max_tokens": 4 + i}

    lines = "".join(json.dumps(line(i)) + "\n" for i in range(6))
    engine = tiny_server.engine()
    w = Workload(trace=read_trace(write(tmp_path, lines)), warmup=1)
    m = measure(engine, w, slo={"ttft_ms": 60_000, "tpot_ms": 60_000})
    s = m.load
    assert (s.n_requests, s.n_ok, s.n_failed, s.goodput) == (6, 6, 0, 1.0), s.errors
    assert [r.output_tokens for r in m.runs] == [4, 5, 6, 7, 8, 9]  # each line's max_tokens
    # llama-server's own count over the replay (warm-up excluded): every line's tokens, no cache.
    assert s.server.metrics["tokens_predicted_total"] == sum(range(4, 10))
    assert s.server.metrics["prompt_tokens_cached_total"] == 0
    t = s.trace
    assert all(sent >= due for sent, due in zip(t.sent_s, t.scheduled_s))
    assert t.sent_s == tuple(sorted(t.sent_s))


SESSION = """
import pytest

@pytest.mark.llmperf(prompt_tokens=8, max_tokens=4, requests=3, concurrency=1, warmup=1)
def test_served():
    pass
"""


def test_a_sessions_requests_written_as_a_trace_replay(
    tiny_server, pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMPERF_API_KEY", "sk-never-in-a-trace")
    pytester.makepyfile(test_served=SESSION)
    out = tmp_path / "session.jsonl"
    result = run(pytester, f"--llmperf-endpoint={tiny_server.url}", f"--llmperf-write-trace={out}", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*trace of 4 served requests written to {out}*"])
    text = out.read_text(encoding="utf-8")
    assert "sk-never" not in text and "Authorization" not in text
    lines = read_trace(out)  # the warm-up and the 3 requests, in the order sent
    assert len(lines) == 4 and lines[0].t_s == 0.0
    assert all(r.request.max_tokens == 4 and r.request.prompt for r in lines)
    # A file that exists is never overwritten: one line, before anything runs.
    again = run(pytester, f"--llmperf-endpoint={tiny_server.url}", f"--llmperf-write-trace={out}")
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--llmperf-write-trace {out} exists: a trace is never overwritten" in again.stderr.str()
    assert out.read_text(encoding="utf-8") == text
    # Replayed: the same prompts reach the server in the same order.
    engine = tiny_server.engine(keep_sent=True)
    m = measure(engine, Workload(trace=lines, warmup=0), slo={"ttft_ms": 60_000})
    assert (m.load.n_ok, m.load.goodput) == (4, 1.0)
    assert [r.request for r in engine.take_sent()] == [r.request for r in lines]


def test_a_session_that_sent_no_served_request_writes_no_trace(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    pass\n")
    out = tmp_path / "none.jsonl"
    result = run(pytester, f"--llmperf-write-trace={out}", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*llmperf: no served request was sent: no trace written to {out}*"])
    assert not out.exists()
    # pytest-xdist's workers send their own requests: one line, before anything runs.
    spread = run(pytester, f"--llmperf-write-trace={out}", "-n", "2")
    assert spread.ret == pytest.ExitCode.USAGE_ERROR
    assert "--llmperf-write-trace writes the requests of one process" in spread.stderr.str()


REPLAY = """
import pytest

@pytest.mark.llmperf(trace="trace.jsonl", trace_speed=4.0, max_tokens=4, ttft_ms=60000, tpot_ms=60000,
                     min_goodput=0.9)
def test_marker_trace():
    pass


@pytest.mark.llmperf(max_tokens=4, ttft_ms=0.000001, min_goodput=0.5)
def test_keyword_trace(llmperf):
    m = llmperf.measure(trace="trace.jsonl", trace_speed=4.0)
    assert m.load.trace.n_requests == 4
"""


def test_a_trace_in_a_marker_and_in_measure(fake: str, pytester: pytest.Pytester) -> None:
    write(pytester.path)
    pytester.makepyfile(test_replay=REPLAY)
    result = run(pytester, f"--llmperf-endpoint={fake}/v1", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*goodput 0 share < budget 0.5 share*"])  # the keyword's: an SLO none meets
    assert len(Recording.received) == 2 * (1 + 4)  # each test: its warm-up and the trace's 4 requests


# -- the replay's figures kept: the record, the session JSON, the HTML report -------------------


def test_the_replays_summary_is_stored_in_the_records_load_section(fake: str, tmp_path: Path) -> None:
    engine = HttpEngine(fake + "/v1", model="m", ignore_eos=False)
    w = Workload(trace=read_trace(write(tmp_path)), max_tokens=4, warmup=0, trace_speed=2.0)
    m = measure(engine, w, slo={"ttft_ms": 60_000})
    t = m.load.trace
    stored = json.loads(json.dumps(record_of(m).to_json()))
    assert Measurement.from_json(stored).load == stored["load"]  # the schema takes it
    lags = t.lags_ms
    assert stored["load"]["trace"] == {
        "requests": 4,
        "span_s": pytest.approx(0.9),
        "speed": 2.0,
        "send_lag_p50_ms": pytest.approx(statistics.median(lags), rel=1e-5),
        "send_lag_max_ms": pytest.approx(max(lags), rel=1e-5),
    }
    assert 0 <= stored["load"]["trace"]["send_lag_p50_ms"] <= stored["load"]["trace"]["send_lag_max_ms"]
    plain = measure(engine, Workload(prompt_tokens=4, max_tokens=4, requests=2, warmup=0))
    assert "trace" not in record_of(plain).to_json()["load"]  # stored as before
    broken = {**stored, "load": {**stored["load"], "trace": {"requests": 4}}}
    with pytest.raises(SchemaViolation, match="trace"):
        Measurement.from_json(broken)


def test_the_session_json_and_html_report_have_the_replays_summary(fake: str, pytester: pytest.Pytester) -> None:
    write(pytester.path)
    pytester.makepyfile(test_replay=REPLAY.split("@pytest.mark.llmperf(max_tokens=4, ttft_ms=0.000001")[0])
    result = run(pytester, f"--llmperf-endpoint={fake}/v1", "--llmperf-json", "s.json", "--llmperf-html", "r.html")
    result.assert_outcomes(passed=1)
    (stored,) = json.loads((pytester.path / "s.json").read_text())["results"]
    trace = stored["record"]["load"]["trace"]
    assert (trace["requests"], trace["speed"], trace["span_s"]) == (4, 4.0, pytest.approx(0.9))
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert "<th>trace replay, open loop</th>" in page and "4 requests over 0.9 s" in page
    assert "replayed at 4x" in page and f"{fmt(trace['send_lag_p50_ms'])} / {fmt(trace['send_lag_max_ms'])}" in page
