"""Hostile inputs, one table row each: what a user or a server can throw at the plugin.

Every row runs a real inner pytest session (or the ``llmperf`` command) and asserts:
the exact one-line message, printed exactly once (inner sessions run with ``-rN`` so that
pytest's own short summary does not repeat it); the exit status; no traceback and no
"During handling of the above exception"; a bounded elapsed time (every network wait has a
deadline); the configured API key nowhere in the output or the files written; and what must
hold of the baseline files afterwards (unchanged, or exactly the copies that must exist).

The misbehaving server is ours, on 127.0.0.1, one URL path per fault.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakeserver import Streaming, event, serving
from inner import run

from pytest_llmperf.baselines import store as baseline_store
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.measurement import Measurement

API_KEY = "sk-hostile-7f3a9c2e51"
STOP = threading.Event()
BASELINE = "baselines/test_inner.json"


class Hostile(Streaming):
    """``/<fault>/v1/completions``: the fault is the first path segment."""

    def _finish(self, n: int, **extra) -> None:
        for i in range(n):
            self._chunk(event(f" t{i}"))
        self._chunk(event("", "length", **extra))
        self._chunk(b"data: [DONE]\n\n")
        self._end()

    def _trickle(self, byte: bytes = b"x") -> None:
        """One byte a second, never a line end, until the test server stops."""
        while not STOP.wait(1.0):
            self._chunk(byte)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        n = int(body.get("max_tokens", 8))
        fault = self.path.strip("/").split("/")[0]
        auth = self.headers.get("Authorization") or ""
        if fault in ("http500", "echo401", "silent", "trickle_headers"):
            self._no_stream(fault, auth)
            return
        self._start_stream()
        self._stream(fault, n, auth)

    def _no_stream(self, fault: str, auth: str) -> None:
        """An error status (one echoing the key), no answer, or a status line a byte a second."""
        if fault in ("http500", "echo401"):
            message = "model exploded" if fault == "http500" else f"bad key: {auth}"
            payload = json.dumps({"error": {"message": message}}).encode()
            self.send_response(500 if fault == "http500" else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        elif fault == "silent":  # accepts the request, never answers
            STOP.wait(60)
        else:  # trickle_headers: the status line, a byte a second
            for byte in b"HTTP/1.1 200 OK\r\n":
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if STOP.wait(1.0):
                    return

    def _stream(self, fault: str, n: int, auth: str) -> None:
        if fault == "ok":
            self._finish(n)
        elif fault == "trickle":  # headers, then a byte a second with no newline
            self._trickle()
        elif fault == "trickle_after_tokens":
            for i in range(3):
                self._chunk(event(f" t{i}"))
            self._trickle(b":")
        elif fault == "echo_stream":
            self._chunk(f"data: {json.dumps({'error': {'message': f'no access for {auth}'}})}\n\n".encode())
            self.wfile.write(b"0\r\n\r\n")
        elif fault == "usage_list":
            self._finish(n, usage=[1, 2])
        elif fault == "usage_huge":
            self._finish(n, usage={"prompt_tokens": 4, "completion_tokens": 10**9})
        elif fault == "endless_line":  # fast, and never a line end
            block = b"y" * 65536
            for _ in range(64):
                self._chunk(block)
            self._trickle()


@pytest.fixture(scope="module")
def server() -> str:
    with serving(Hostile, STOP) as url:
        yield url


# -- the inner session's test module and baseline files ------------------------------------------

WORKLOAD = "prompt_tokens=4, max_tokens=8, runs=3, warmup=0"
MARKED = """
import pytest

@pytest.mark.llmperf({marker})
def test_a():
    pass
"""


def source(marker: str = WORKLOAD) -> str:
    return MARKED.format(marker=marker)


def entry(runs: list[float] | None = None) -> dict:
    runs = [6.5, 6.6, 6.4] if runs is None else runs
    return {
        "hardware": {"cpu": "elsewhere"},
        "subject": {},
        "workload": {"prompt": None, "prompt_tokens": 4, "max_tokens": 8, "seed": 0},
        "runs": {"ttft_ms": runs, "tpot_ms": [1.0, 1.1, 1.2]},
        "itl_ms": [[1.0, 1.1]] * 3,
        "summary": {},
    }


def baseline_file(tests: dict, version: int = 1) -> str:
    return baseline_store.dumps({"schema": baseline_store.SCHEMA, "schema_version": version, "tests": tests})


VALID = baseline_file({"test_other": {"hw-elsewhere": entry()}})
EMPTY_RUNS = baseline_file({"test_a": {"hw-elsewhere": entry(runs=[])}, "test_other": {"hw-elsewhere": entry()}})
NEWER = baseline_file({"test_a": {"hw-future": {"shape": "unknown to us"}}}, version=2)


# -- what must hold afterwards -------------------------------------------------------------------


def unchanged(root: Path, before: dict[str, bytes]) -> None:
    assert snapshot(root) == before


def repaired(root: Path, before: dict[str, bytes]) -> None:
    """The bad file kept as .corrupt, byte for byte; the new file loads, with this run's
    entry and the old file's valid entries carried over."""
    assert (root / (BASELINE + ".corrupt")).read_bytes() == before[BASELINE]
    tests = baseline_store.load(root / BASELINE)
    assert sorted(tests) == ["test_a", "test_other"] and tests["test_other"] == {"hw-elsewhere": entry()}
    assert "hw-elsewhere" not in tests["test_a"]  # the unusable entry was dropped, not carried over


def numbered_copy(root: Path, before: dict[str, bytes]) -> None:
    assert (root / (BASELINE + ".corrupt")).read_bytes() == before[BASELINE + ".corrupt"]  # never overwritten
    assert (root / (BASELINE + ".corrupt.1")).read_bytes() == before[BASELINE]
    assert "test_a" in baseline_store.load(root / BASELINE)


def written(root: Path, before: dict[str, bytes]) -> None:
    assert "test_a" in baseline_store.load(root / BASELINE)


def prompt_is(expected: dict) -> Callable[[Path, dict[str, bytes]], None]:
    def check(root: Path, before: dict[str, bytes]) -> None:
        (result,) = json.loads((root / "session.json").read_text())["results"]
        workload = result["record"]["workload"]
        assert {k: workload[k] for k in expected} == expected

    return check


def snapshot(root: Path) -> dict[str, bytes]:
    folder = root / "baselines"
    if not folder.exists():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- failures we inject (a write that fails whoever runs the tests, root included) ---------------


def read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """The baseline folder read-only; root ignores modes, so its temp file creation is refused too."""
    folder = root / "baselines"
    folder.chmod(0o555)
    from pytest_llmperf.core import documents

    real = documents.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(documents.tempfile, "mkstemp", mkstemp)


def disk_full(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Every write of a file under baselines/ fails with ENOSPC, as on a full disk."""
    folder = str((root / "baselines").resolve())
    real = os.fdopen

    def fdopen(fd, *args, **kwargs):
        fh = real(fd, *args, **kwargs)
        if os.readlink(f"/proc/self/fd/{fd}").startswith(folder):

            def write(text):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            fh.write = write
        return fh

    monkeypatch.setattr(os, "fdopen", fdopen)


@dataclass(frozen=True)
class Case:
    """One hostile input to an inner session: placeholders {url} (the fault's endpoint),
    {file} (the baseline file) and {root} are filled in before the comparison."""

    id: str
    message: str | None  # the one line that must be printed exactly once (None: a run that passes)
    exit: int
    fault: str = "ok"
    source: str = MARKED.format(marker=WORKLOAD)
    args: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    inject: Callable[[pytest.MonkeyPatch, Path], None] | None = None
    seconds: float = 30.0
    after: Callable[[Path, dict[str, bytes]], None] = unchanged
    also: tuple[str, ...] = ()  # further lines that must appear (the summary after a failed write)
    env: dict[str, str] = field(default_factory=dict)


TIMEOUT = ("--llmperf-request-timeout=1",)  # the token timeout stays at its 30 s default
LATE = "request to {url} took longer than 1 s ({n} tokens so far); raise the request timeout or shorten the workload"
UPDATE = ("--llmperf-update-baselines",)
#: A baseline asked for and not written fails the session (exit 1), its tests keep their outcome.
NOT_WRITTEN = "llmperf: 1 baseline file(s) not written: the session fails"

CASES = [
    # A server's errors: once, no chained copy, the key redacted.
    Case("http-error-printed-once", 'HTTP 500 from {url}: {{"error": {{"message": "model exploded"}}}}', 1, "http500"),
    Case(
        "key-echoed-in-error-body",
        'HTTP 401 from {url}: {{"error": {{"message": "bad key: Bearer ***"}}}}',
        1,
        "echo401",
        args=("--junitxml=junit.xml",),
    ),
    Case(
        "key-echoed-in-stream",
        "server error in stream from {url}: no access for Bearer ***",
        1,
        "echo_stream",
        args=("--junitxml=junit.xml",),
    ),
    Case("usage-not-an-object", 'malformed event from {url}: "usage" is [1, 2], not a JSON object', 1, "usage_list"),
    Case(
        "usage-completion-tokens-1e9",
        "implausible usage from {url}: completion_tokens 1000000000 for max_tokens 8; the run is not comparable",
        1,
        "usage_huge",
        seconds=20,
    ),
    Case(
        "line-without-end",
        "malformed stream from {url}: a line longer than 1048576 bytes without a line end",
        1,
        "endless_line",
        seconds=20,
    ),
    # Hangs: the request timeout is a total, whatever the server trickles.
    Case("server-never-answers", LATE.replace("{n}", "0"), 1, "silent", args=TIMEOUT, seconds=15),
    Case("trickles-headers", LATE.replace("{n}", "0"), 1, "trickle_headers", args=TIMEOUT, seconds=15),
    Case("trickles-without-newline", LATE.replace("{n}", "0"), 1, "trickle", args=TIMEOUT, seconds=15),
    Case("trickles-after-tokens", LATE.replace("{n}", "3"), 1, "trickle_after_tokens", args=TIMEOUT, seconds=15),
    # Workloads no engine can build.
    Case(
        "prompt-lone-surrogate",
        "llmperf marker: prompt is not valid text: '\\ud800' at index 0 cannot be encoded as UTF-8 (a lone "
        "surrogate); fix the prompt string",
        2,  # at collection
        source=source("prompt='\\ud800', max_tokens=8, runs=2, warmup=0"),
    ),
    Case(
        "prompt-tokens-1e9",
        "llmperf marker key 'prompt_tokens' must be <= 16777216 (more than any model's context), got 1000000000",
        2,  # at collection
        source=source("prompt_tokens=10**9, max_tokens=8, runs=2, warmup=0"),
        seconds=20,
    ),
    Case(
        "prompt-tokens-1e30",
        "llmperf marker key 'prompt_tokens' must be <= 16777216 (more than any model's context), got 1e+30",
        2,  # at collection
        source=source("prompt_tokens=10**30, max_tokens=8, runs=2, warmup=0"),
        seconds=20,
    ),
    Case(
        "max-tokens-1e9",
        "llmperf marker key 'max_tokens' must be <= 16777216 (more than any model's context), got 1000000000",
        2,  # at collection
        source=source("prompt_tokens=4, max_tokens=10**9, runs=2, warmup=0"),
        seconds=20,
    ),
    # Markers: the closest marker's prompt of either kind wins over a farther one's.
    Case(
        "module-prompt-tokens-test-prompt",
        None,
        0,
        args=("--llmperf-json=session.json",),
        source="import pytest\npytestmark = pytest.mark.llmperf(prompt_tokens=4, runs=2, warmup=0)\n"
        + source("prompt='hello there', max_tokens=8"),
        after=prompt_is({"prompt": "hello there"}),
    ),
    Case(
        "module-prompt-test-prompt-tokens",
        None,
        0,
        args=("--llmperf-json=session.json",),
        source="import pytest\npytestmark = pytest.mark.llmperf(prompt='hello', runs=2, warmup=0)\n"
        + source("prompt_tokens=5, max_tokens=8"),
        after=prompt_is({"prompt": None}),
    ),
    # Baselines: unusable entries, newer schemas, corrupt files, failed writes.
    Case(
        "baseline-with-empty-runs",
        "{file}: tests['test_a']['hw-elsewhere'].runs['ttft_ms'] is empty; "
        "re-record it with --llmperf-update-baselines (or restore the file from version control)",
        1,
        files={BASELINE: EMPTY_RUNS},
    ),
    Case(
        "update-repairs-empty-runs",
        "llmperf: the unreadable old file was kept as {file}.corrupt",
        0,
        args=UPDATE,
        files={BASELINE: EMPTY_RUNS},
        after=repaired,
    ),
    Case(
        "second-update-over-corrupt-file",
        "llmperf: the unreadable old file was kept as {file}.corrupt.1",
        0,
        args=UPDATE,
        files={BASELINE: "{ truncated", BASELINE + ".corrupt": "the first copy"},
        after=numbered_copy,
    ),
    Case(
        "newer-schema-compared",
        "{file} has schema_version 2, newer than this pytest-llmperf understands (1); upgrade pytest-llmperf",
        1,
        files={BASELINE: NEWER},
    ),
    Case(
        "newer-schema-never-overwritten",
        "llmperf: baselines not written to {file}: it has schema_version 2, newer than this pytest-llmperf "
        "understands (1); upgrade pytest-llmperf to update it",
        1,
        args=UPDATE,
        files={BASELINE: NEWER},
        also=(NOT_WRITTEN, "*llmperf summary*"),
    ),
    Case(
        "read-only-baseline-dir",
        "llmperf: cannot write baseline file {file}: Permission denied; the file is unchanged",
        1,
        args=UPDATE,
        files={BASELINE: VALID},
        inject=read_only,
        also=(NOT_WRITTEN, "*llmperf summary*"),
    ),
    Case(
        "disk-full-during-baseline-write",
        "llmperf: cannot write baseline file {file}: No space left on device; the file is unchanged",
        1,
        args=UPDATE,
        files={BASELINE: VALID},
        inject=disk_full,
        also=(NOT_WRITTEN, "*llmperf summary*"),
    ),
    Case(
        "first-baseline-on-full-disk",
        "llmperf: cannot write baseline file {file}: No space left on device; the file is unchanged",
        1,
        args=UPDATE,
        files={"baselines/README": "kept"},
        inject=disk_full,
        also=(NOT_WRITTEN, "*llmperf summary*"),
    ),
    # A report path that cannot be written is refused before anything runs (issue 47): usage error 4.
    *(
        Case(
            f"{option}-report-path-unwritable",
            f"--llmperf-{option}: cannot write {{root}}/afile/{name}: Not a directory; give it a writable path",
            4,
            args=(f"--llmperf-{option}={{root}}/afile/{name}",),
            files={"afile": "a file, not a folder"},
        )
        for option, name in (("json", "session.json"), ("html", "report.html"), ("markdown", "summary.md"))
    ),
    Case(
        "step-summary-unwritable",
        "llmperf: cannot write {root}/afile/summary.md: Not a directory",
        0,
        files={"afile": "a file, not a folder"},
        env={"GITHUB_STEP_SUMMARY": "{root}/afile/summary.md"},
        also=("*llmperf summary*",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_session(pytester: pytest.Pytester, server: str, monkeypatch: pytest.MonkeyPatch, case: Case):
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    root = pytester.path
    names = {"url": f"{server}/{case.fault}/v1/completions", "file": root / BASELINE, "root": root}
    pytester.makepyfile(test_inner=case.source)
    for rel, text in case.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "baselines").mkdir(exist_ok=True)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.format(**names))
    before = snapshot(root)
    if case.inject is not None:
        case.inject(monkeypatch, root)
    args = [a.format(**names) for a in case.args]
    started = time.monotonic()
    result = run(
        pytester, f"--llmperf-endpoint={server}/{case.fault}/v1", "--llmperf-baseline-dir=baselines", "-rN", *args
    )
    elapsed = time.monotonic() - started
    monkeypatch.undo()  # writable again, real os.fdopen, before the checks read the files
    output = result.stdout.str() + result.stderr.str()
    assert elapsed < case.seconds, f"took {elapsed:.1f} s"
    assert result.ret == case.exit, output
    if case.message is not None:
        message = case.message.format(**names)
        assert "\n" not in message
        assert output.count(message) == 1, output
    else:
        result.assert_outcomes(passed=1)
    assert "Traceback" not in output and "During handling of the above exception" not in output, output
    if case.also:
        result.stdout.fnmatch_lines(list(case.also))
    stored = [p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".xml", ".corrupt", ".md")]
    assert API_KEY not in output and not [p for p in stored if API_KEY in p.read_text(errors="replace")]
    assert not list(root.rglob(".*.tmp"))  # no temp file left by a failed write
    case.after(root, before)


# -- the llmperf command on session files it cannot use -------------------------------------------


def session_file(path: Path, tests: list[str], edit: Callable[[dict], None] | None = None) -> str:
    from pytest_llmperf.judge.result import MeasurementResult
    from pytest_llmperf.reports.session_file import session_json

    results = [
        MeasurementResult(test=t, key=t, baseline_file="x.json", hardware_key="hw", record=Measurement.read(entry()))
        for t in tests
    ]
    data = json.loads(session_json(results, "2026-12-01T00:00:00+00:00"))
    if edit is not None:
        edit(data)
    path.write_text(json.dumps(data))
    return str(path)


def drop(key: str) -> Callable[[dict], None]:
    return lambda data: data["results"][0].pop(key)


def set_run(value) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["results"][0]["record"]["runs"]["ttft_ms"] = value

    return edit


def set_record(key: str, value) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["results"][0]["record"][key] = value

    return edit


BAD = "write the report again with pytest --llmperf-json"
CLI_CASES = [
    # (id, command, edit of the second file, its tests, the one line on stderr)
    (
        "compare-nothing-in-common",
        "compare",
        None,
        ["t_b"],
        "llmperf: error: no test in both {a} and {b}: nothing to compare",
    ),
    (
        "compare-runs-not-numbers",
        "compare",
        set_run("fast"),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0].record.runs['ttft_ms'] is a string, not an array; {BAD}",
    ),
    (
        "compare-runs-empty",
        "compare",
        set_run([]),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0].record.runs['ttft_ms'] is empty; {BAD}",
    ),
    (
        "compare-test-missing",
        "compare",
        drop("test"),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0] has no 'test'; {BAD}",
    ),
    (
        "compare-schema-version-text",
        "compare",
        lambda d: d.update(schema_version="1"),
        ["t_a"],
        f"llmperf: error: {{b}}: schema_version is a string, not an integer; {BAD}",
    ),
    (
        "compare-itl-not-lists",
        "compare",
        set_record("itl_ms", [1.0, 2.0]),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0].record.itl_ms[0] is a number, not an array; {BAD}",
    ),
    (
        "report-workload-missing",
        "report",
        set_record("workload", None),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0].record.workload is null, not an object; {BAD}",
    ),
    (
        "report-summary-not-object",
        "report",
        set_record("summary", [1]),
        ["t_a"],
        f"llmperf: error: {{b}}: results[0].record.summary is an array, not an object; {BAD}",
    ),
]


@pytest.mark.parametrize(("name", "command", "edit", "tests", "message"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_hostile_command(tmp_path: Path, capsys: pytest.CaptureFixture, name, command, edit, tests, message):
    """Exit 2 ("unusable input / nothing comparable", as documented), one line on stderr."""
    a = session_file(tmp_path / "a.json", ["t_a"])
    b = session_file(tmp_path / "b.json", tests, edit)
    argv = ["compare", a, b] if command == "compare" else ["report", b, "-o", str(tmp_path / "r.html")]
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    expected = message.format(a=a, b=b)
    assert err.count(expected) == 1 and err.strip() == expected, err
    assert "Traceback" not in out + err
    assert not (tmp_path / "r.html").exists()


def test_compare_of_a_report_with_itself_still_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The exit-2 rows above are not an always-2 command."""
    a = session_file(tmp_path / "a.json", ["t_a"])
    assert cli_main(["compare", a, a]) == 0


# -- pieces the table cannot reach ----------------------------------------------------------------


def test_llama_cpp_checks_the_context_before_building_a_prompt(tiny_engine) -> None:
    """2**24 prompt tokens (within the Workload bound) fail the context check at once, without
    building a 16M-token prompt first."""
    from pytest_llmperf import EngineError, Workload, measure

    started = time.monotonic()
    with pytest.raises(EngineError, match=r"context too small: 16777216 prompt \+ 8 generated tokens > n_ctx"):
        measure(tiny_engine, Workload(prompt_tokens=2**24, max_tokens=8, runs=1, warmup=0))
    assert time.monotonic() - started < 2


def test_engine_fixture_error_printed_once(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """plugin.py's session fixtures fail with the engine's line alone, not a chained second copy."""
    missing = tmp_path / "nowhere" / "model.gguf"
    pytester.makepyfile("def test_a(llmperf_engine):\n    pass\n")
    result = run(pytester, f"--llmperf-model={missing}", "-rN")
    output = result.stdout.str() + result.stderr.str()
    line = f"model file not found: {missing}; give a GGUF path or a preset name (tiny, small)"
    assert result.ret == 1 and output.count(line) == 1, output
    assert "During handling of the above exception" not in output


def test_deadline_is_per_request_in_concurrent_load(server: str) -> None:
    """Under load, each request thread has its own deadline: trickling requests all end at
    about the request timeout, together, not one after another."""
    from pytest_llmperf import EngineError, Workload, measure
    from pytest_llmperf.engines.http import HttpEngine

    engine = HttpEngine(f"{server}/trickle/v1", request_timeout_s=1, token_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(EngineError, match="all 4 requests failed; first: request to .* took longer than 1 s"):
        measure(engine, Workload(prompt_tokens=4, max_tokens=8, requests=4, concurrency=4, warmup=0))
    assert time.monotonic() - started < 8


def test_redaction_covers_the_json_escaped_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_llmperf.engines.http import HttpEngine

    monkeypatch.setenv("LLMPERF_API_KEY", 'k/e"y-0123')
    engine = HttpEngine("http://127.0.0.1:9/v1")  # nothing is sent: only the redaction is tested
    assert engine.redact('echo k/e"y-0123 and k/e\\"y-0123') == "echo *** and ***"
