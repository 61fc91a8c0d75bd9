"""Faults of a served model: each ends within its timeout with a one-line message, and no
baseline is written from a broken measurement.

The happy path uses the real llama.cpp server (test_http_engine.py); these faults come from a
small misbehaving server of our own on loopback, one URL path per fault.
"""

from __future__ import annotations

import json
import threading
import time
from typing import ClassVar

import pytest
from fakeserver import Streaming, event, serving

from pytest_llmperf import EngineError, Workload, measure
from pytest_llmperf.engines.http import HttpEngine
from pytest_llmperf.engines.servers import free_port
from pytest_llmperf.engines.sse import EarlyEndError

STOP = threading.Event()
#: ``/paced``: each token this long after the one before, like a real server's decode. Two
#: sessions of a server that only sleeps differ by the machine's scheduling delays, not by 6x.
PACE_S = 0.004


class Faulty(Streaming):
    """``/<fault>/v1/completions``: the fault is the first path segment."""

    seen_auth: ClassVar[list[str]] = []  # one list for every request's handler
    flaky_count = 0

    def _stall(self) -> None:
        while not STOP.is_set():
            time.sleep(0.05)

    def _tokens(self, n: int, pace_s: float = 0.0) -> None:
        for i in range(n):
            time.sleep(pace_s)
            self._chunk(event(f" t{i}"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        n = int(body.get("max_tokens", 8))
        fault = self.path.strip("/").split("/")[0]
        Faulty.seen_auth.append(self.headers.get("Authorization") or "")
        if self._refused(fault):
            return
        self._start_stream()
        if fault in ("ok", "flaky", "paced", "usage", "merged", "short"):
            self._complete(fault, n)
        else:
            self._broken(fault)

    def _refused(self, fault: str) -> bool:
        """An error status instead of a stream (every other request of ``flaky``)."""
        if fault in ("http500", "http401"):
            status = 500 if fault == "http500" else 401
            payload = json.dumps({"error": {"message": "model exploded" if status == 500 else "invalid api key"}})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())
            return True
        if fault == "flaky":  # every other request gets a 503
            Faulty.flaky_count += 1
            if Faulty.flaky_count % 2 == 0:
                self.send_response(503)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"busy")
                return True
        return False

    def _complete(self, fault: str, n: int) -> None:
        """A stream that ends well: its tokens, a finish reason, [DONE]."""
        if fault in ("ok", "flaky", "paced"):
            self._tokens(n, PACE_S if fault == "paced" else 0.0)
            self._chunk(event("", "length"))
        elif fault == "usage":
            self._tokens(n)
            self._chunk(event("", "length", usage={"prompt_tokens": 7, "completion_tokens": n}))
        elif fault == "merged":  # all tokens in 3 events, then the length limit
            self._tokens(3)
            self._chunk(event("", "length"))
        elif fault == "short":  # EOS after 3 tokens
            self._tokens(3)
            self._chunk(event("", "stop"))
        self._chunk(b"data: [DONE]\n\n")
        self._end()

    def _broken(self, fault: str) -> None:
        """A stream that breaks: bad data, a cut, a stall, or no end at all."""
        if fault == "garbage":
            self._tokens(2)
            self._chunk(b"data: {not json at all\n\n")
            self._end()
        elif fault == "truncated":  # a clean end of the body, but no [DONE] and no finish
            self._tokens(3)
            self._chunk(b'data: {"choices": [{"te')
            self._end()
        elif fault == "midstream":  # the connection drops inside the chunked body
            self._tokens(3)
            self.wfile.write(b"ff\r\ndata: {")
            self.wfile.flush()
            self.connection.shutdown(2)
        elif fault in ("stall_first", "stall_mid"):
            self._tokens(0 if fault == "stall_first" else 3)
            self._stall()
        elif fault in ("drip", "pings"):  # every 0.2 s, for ever: only the request timeout ends it
            i = 0
            while not STOP.is_set():
                self._chunk(event(f" d{i}") if fault == "drip" else b": ping\n\n")
                i += 1
                time.sleep(0.2)


@pytest.fixture(scope="module")
def faulty() -> str:
    with serving(Faulty, STOP) as url:
        yield url


WL = Workload(prompt_tokens=4, max_tokens=8, runs=1, warmup=0)


def fails_within(engine: HttpEngine, seconds: float, workload: Workload = WL) -> str:
    started = time.monotonic()
    with pytest.raises(EngineError) as info:
        measure(engine, workload)
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"took {elapsed:.1f} s: {info.value}"
    message = str(info.value)
    assert "\n" not in message
    return message


def test_healthy_fake_stream_counts_events(faulty):
    m = measure(HttpEngine(f"{faulty}/ok/v1"), WL)
    assert m.output_tokens == 8 and m.engine.token_count == "events"


def test_usage_is_preferred_when_the_server_sends_it(faulty):
    m = measure(HttpEngine(f"{faulty}/usage/v1"), WL)
    assert m.engine.token_count == "usage" and m.prompt_tokens == 7


def test_events_merged_into_fewer_than_tokens(faulty):
    m = measure(HttpEngine(f"{faulty}/merged/v1"), WL)
    assert m.engine.token_count == "finish_reason" and m.output_tokens == 8
    assert m.runs[0].itl_ms[-5:] == (0.0,) * 5  # the merged tokens arrived with the last event


def test_fit_stamps():
    from pytest_llmperf.engines.sse import fit_stamps

    assert fit_stamps([1, 2, 3, 4, 5], 3) == [1, 2, 5]
    assert fit_stamps([1, 2], 4) == [1, 2, 2, 2]
    assert fit_stamps([1, 2, 3], 3) == [1, 2, 3]


def test_server_not_running():
    message = fails_within(HttpEngine(f"http://127.0.0.1:{free_port()}/v1"), 5)
    assert "cannot connect" in message and "is the server running?" in message


def test_connection_dropped_mid_stream(faulty):
    message = fails_within(HttpEngine(f"{faulty}/midstream/v1", token_timeout_s=2), 5)
    assert "connection to" in message and "broke after 3 tokens" in message


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("http500", "HTTP 500 from .*model exploded"), ("http401", "HTTP 401 from .*invalid api key")],
)
def test_http_error_with_body(faulty, fault, expected):
    import re

    assert re.search(expected, fails_within(HttpEngine(f"{faulty}/{fault}/v1"), 5))


def test_malformed_event(faulty):
    message = fails_within(HttpEngine(f"{faulty}/garbage/v1"), 5)
    assert "malformed event" in message and "is not JSON" in message


def test_truncated_stream(faulty):
    message = fails_within(HttpEngine(f"{faulty}/truncated/v1"), 5)
    assert "malformed event" in message or "ended without [DONE]" in message


@pytest.mark.parametrize(("fault", "waiting"), [("stall_first", "the first token"), ("stall_mid", "the token after 3")])
def test_stalled_server_hits_the_token_timeout(faulty, fault, waiting):
    message = fails_within(HttpEngine(f"{faulty}/{fault}/v1", token_timeout_s=0.5), 3)
    assert (
        f"server stalled: no data from {faulty}/{fault}/v1/completions within 0.5 s (waiting for {waiting})" in message
    )


@pytest.mark.parametrize("fault", ["drip", "pings"])
def test_dripping_server_hits_the_request_timeout(faulty, fault):
    engine = HttpEngine(f"{faulty}/{fault}/v1", token_timeout_s=5, request_timeout_s=1)
    message = fails_within(engine, 3, Workload(prompt_tokens=4, max_tokens=1000, runs=1, warmup=0))
    assert "took longer than 1 s" in message


def test_fewer_tokens_than_asked(faulty):
    message = fails_within(HttpEngine(f"{faulty}/short/v1"), 5)
    assert "server generated 3 of 8 tokens (finish_reason 'stop', counted from events)" in message
    with pytest.raises(EarlyEndError):
        measure(HttpEngine(f"{faulty}/short/v1"), WL)


def test_api_key_sent_but_never_recorded(faulty, monkeypatch):
    from pytest_llmperf.baselines.records import stored
    from pytest_llmperf.core.fingerprint import Fingerprint, subject

    monkeypatch.setenv("LLMPERF_TEST_KEY", "sk-secret-123")
    engine = HttpEngine(f"{faulty}/ok/v1", api_key_env="LLMPERF_TEST_KEY")
    m = measure(engine, WL)
    assert Faulty.seen_auth[-1] == "Bearer sk-secret-123"
    rec = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at="now").to_json()
    assert "sk-secret" not in json.dumps(rec) + repr(engine) + repr(m.engine)


def test_load_counts_failed_requests(faulty):
    engine = HttpEngine(f"{faulty}/flaky/v1")
    m = measure(engine, Workload(prompt_tokens=4, max_tokens=4, requests=6, concurrency=1, warmup=0))
    assert (m.load.n_ok, m.load.n_failed) == (3, 3)
    assert m.load.goodput == 0.5
    assert m.load.errors[0].startswith("request 1: HTTP 503")


PERF_TEST = """
import pytest

@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=2, warmup=0)
def test_served():
    pass

@pytest.mark.llmperf(prompt_tokens=4, max_tokens=4, requests=4, concurrency=2, warmup=0)
def test_load():
    pass
"""


@pytest.mark.parametrize("fault", ["short", "flaky"])
def test_no_baseline_from_a_failed_measurement(pytester, faulty, fault):
    pytester.makepyfile(test_served=PERF_TEST)
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        f"--llmperf-endpoint={faulty}/{fault}/v1", "--llmperf-update-baselines", "--llmperf-token-timeout=2"
    )
    assert time.monotonic() - started < 60
    result.assert_outcomes(failed=2)
    if fault == "short":
        result.stdout.fnmatch_lines(["*server generated 3 of 8 tokens*"])
    else:
        result.stdout.fnmatch_lines(["*requests failed; request * HTTP 503 from*busy*"])
    assert not list(pytester.path.rglob("baselines/**/*.json"))


def test_good_http_measurement_writes_and_compares_baselines(pytester, faulty, monkeypatch):
    monkeypatch.setenv("LLMPERF_API_KEY", "sk-never-written")
    pytester.makepyfile(test_served=PERF_TEST)
    args = (f"--llmperf-endpoint={faulty}/paced/v1",)
    pytester.runpytest_subprocess(*args, "--llmperf-update-baselines").assert_outcomes(passed=2)
    files = list(pytester.path.rglob("baselines/**/*.json"))
    assert len(files) == 1
    text = files[0].read_text()
    assert "test_served" in text and "test_load" in text and "sk-never-written" not in text
    # Compared, not judged: two sessions of a server that answers at once (``/ok``) differed by
    # more than 6x in CI (a scheduling delay is most of a 0.05 ms token), and the rule called it
    # a regression. ``/paced`` tokens take 4 ms; a 500% threshold keeps the verdict out.
    result = pytester.runpytest_subprocess(*args, "--llmperf-threshold=500%", "--llmperf-tail-threshold=500%")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*llmperf: endpoint*/paced/v1 (completions)*", "*llmperf baseline comparison*"])


def test_endpoint_from_ini_and_environment(pytester, faulty, monkeypatch):
    pytester.makepyfile(test_served=PERF_TEST)
    pytester.makeini(f"[pytest]\nllmperf_endpoint = {faulty}/short/v1\nllmperf_request_timeout = 5\n")
    monkeypatch.setenv("LLMPERF_ENDPOINT", f"{faulty}/ok/v1")  # the environment beats the ini
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"llmperf: endpoint {faulty}/ok/v1 (completions), model (server default)"])
    result = pytester.runpytest_subprocess("--llmperf-token-timeout=soon")
    result.stderr.fnmatch_lines(["*--llmperf-token-timeout: expected float, got 'soon'*"])


def test_server_that_cannot_start_says_why_in_one_line(tmp_path):
    from pytest_llmperf.engines.servers import serve

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    started = time.monotonic()
    with pytest.raises(EngineError) as info, serve(broken, threads=1, start_timeout_s=30):
        pass
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert message.startswith("llama_cpp.server exited with status") and "\n" not in message


# -- the asynchronous load client (HttpEngine.arun): the same faults, the same deadlines --------


def load_fails_within(engine, seconds, workload):
    """Every request of a load run fails, the run ends within ``seconds``; the first error."""
    from pytest_llmperf.measuring.served import measure_load

    begin = time.monotonic()
    with pytest.raises(EngineError) as exc:
        measure_load(engine, workload)
    assert time.monotonic() - begin < seconds
    return str(exc.value)


@pytest.mark.parametrize("fault", ["drip", "pings"])
def test_async_load_client_keeps_the_request_deadline(faulty, fault):
    engine = HttpEngine(f"{faulty}/{fault}/v1", token_timeout_s=5, request_timeout_s=1)
    w = Workload(prompt_tokens=4, max_tokens=1000, requests=3, concurrency=3, warmup=0)
    message = load_fails_within(engine, 4, w)
    assert message.startswith("all 3 requests failed; first: request to ") and "took longer than 1 s" in message


def test_async_load_client_stall_and_http_errors(faulty):
    w = Workload(prompt_tokens=4, max_tokens=8, requests=2, concurrency=2, warmup=0)
    message = load_fails_within(HttpEngine(f"{faulty}/stall_first/v1", token_timeout_s=0.5), 4, w)
    assert "server stalled: no data from" in message and "within 0.5 s (waiting for the first token)" in message
    message = load_fails_within(HttpEngine(f"{faulty}/http500/v1"), 4, w)
    assert "HTTP 500 from" in message and "model exploded" in message
    message = load_fails_within(HttpEngine(f"{faulty}/short/v1"), 4, w)
    assert "server generated 3 of 8 tokens" in message


def test_async_load_client_counts_like_the_sync_one(faulty):
    """Healthy and merged streams through the load path: exact counts, the same sources."""
    from pytest_llmperf.measuring.served import measure_load

    for fault, source in (("ok", "events"), ("merged", "finish_reason"), ("usage", "usage")):
        engine = HttpEngine(f"{faulty}/{fault}/v1")
        m = measure_load(engine, Workload(prompt_tokens=4, max_tokens=8, requests=4, concurrency=4, warmup=0))
        assert (m.load.n_ok, m.output_tokens) == (4, 8), fault
        assert m.engine.token_count == source, fault
        assert m.load.prompt_cache == "unique prompts, prompt cache off (cache_prompt=false)"
        assert m.load.server is None  # not llama-server: no timings, no /metrics
