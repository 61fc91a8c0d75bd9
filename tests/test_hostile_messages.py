"""Hostile inputs, the messages: every session error and every ``llmperf`` command's is one
line that says what to do, with the right exit status and no traceback (issue 21, class 5).

As in tests/test_hostile.py, each case asserts the exact line, printed exactly once (inner
sessions run with ``-rN``), the exit status, no "Traceback" and no "During handling of the
above exception", a bounded elapsed time, the API key (and a PostgreSQL password) nowhere in
the output, and the files left as they must be. Servers are ours, on 127.0.0.1; PostgreSQL
is a real throw-away server (tests/pgserver.py); the unreadable model is unreadable for real
(a child process without the capability that lets root read any file).
"""

from __future__ import annotations

import ctypes
import fnmatch
import importlib.util
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakeserver import serving
from inner import ctrl_c_default, run
from pgserver import PgServer, bindir, unavailable
from test_hostile import API_KEY, STOP, WORKLOAD, Hostile, snapshot, source

import pytest_llmperf
from pytest_llmperf.cli import INTERRUPTED, INTERRUPTED_LINE
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.settings import usable_cpus

CPUS = usable_cpus()
HISTORY = "hist.sqlite"
NOT_A_DATABASE = "this is a text file, not a SQLite database\n" * 8


class Messages(Hostile):
    """test_hostile's faults, and ``/redirect/``: a 301 to ``/ok/``'s completions."""

    def do_POST(self) -> None:
        if self.path.strip("/").split("/")[0] != "redirect":
            return super().do_POST()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(301)
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/ok/v1/completions")
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def server() -> str:
    with serving(Messages, STOP) as url:
        yield url


def clean(output: str) -> None:
    assert "Traceback" not in output and "During handling of the above exception" not in output, output
    assert API_KEY not in output


def once(output: str, line: str) -> None:
    """``line`` (an fnmatch pattern where it has ``*``) is on exactly one output line."""
    assert "\n" not in line
    found = [x for x in output.splitlines() if fnmatch.fnmatchcase(x, f"*{line}*")] if "*" in line else None
    assert (len(found) if found is not None else output.count(line)) == 1, output


# -- inner sessions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One inner session: placeholders {url} (the endpoint's completions URL), {server} and
    {root}. ``fault``: the server's path (None: llama.cpp in process, embedded ``tiny``)."""

    id: str
    message: str | None  # None: a session that passes
    exit: int
    fault: str | None = "ok"
    scheme: str = "http"
    source: str = source()
    args: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 30.0
    json_subject: dict = field(default_factory=dict)  # what session.json's record subject must hold


TOO_MANY = "must be <= 16777216 (more than any model's context), got {}"
HISTORY_LINE = (
    "llmperf: history not written: the history {root}/hist.sqlite is not a usable SQLite database (file is not a "
    "database); move it aside (mv {root}/hist.sqlite {root}/hist.sqlite.corrupt) and the next session starts a new "
    "history there"
)

#: What ``gpu_layers=-1`` offloads of the tiny preset (4 layers and the output layer).
ALL_LAYERS_OFFLOADED = 5 if __import__("llama_cpp").llama_supports_gpu_offload() else 0

CASES = [
    Case(
        "cache-dir-cannot-be-created",
        "cannot write the embedded model to {root}/afile/cache ($LLMPERF_CACHE_DIR): Not a directory; "
        "set LLMPERF_CACHE_DIR to a writable folder",
        1,
        fault=None,
        files={"afile": "a file, not a folder"},
        env={"LLMPERF_CACHE_DIR": "{root}/afile/cache"},
    ),
    Case(
        "marker-n-ctx-2**40",
        "llmperf marker key 'n_ctx' " + TOO_MANY.format(2**40),
        2,
        fault=None,
        source=source(f"n_ctx=2**40, {WORKLOAD}"),
    ),
    Case(
        "option-n-ctx-wraps-at-2**32",
        "argument --llmperf-n-ctx: " + TOO_MANY.format(2**32 + 512),
        4,
        fault=None,
        args=("--llmperf-n-ctx=4294967808",),
    ),
    Case(
        "marker-threads-10000-warns",
        f"llmperf: warning: test_inner.py::test_a: marker threads 10000 exceeds the {CPUS} usable CPU(s); "
        f"threads will time-slice and the timings measure the scheduler; use at most {CPUS}",
        0,
        fault=None,
        source=source(f"threads=10000, {WORKLOAD}"),
        args=("--collect-only",),
    ),
    Case(
        "gpu-layers-minus-1-as-the-marker",
        None,
        0,
        fault=None,
        args=("--llmperf-gpu-layers=-1", "--llmperf-json=session.json"),
        # -1 is "all": the record says what llama.cpp offloaded (none on a CPU-only build).
        json_subject={"n_gpu_layers": ALL_LAYERS_OFFLOADED},
    ),
    Case(
        "gpu-layers-minus-2-refused",
        "argument --llmperf-gpu-layers: must be >= -1 (-1: all layers), got -2",
        4,
        fault=None,
        args=("--llmperf-gpu-layers=-2",),
    ),
    Case(
        "http-301-not-a-truncated-stream",
        "HTTP 301 from {url}: redirects are not followed; use the final URL as the endpoint "
        "(Location: {server}/ok/v1/completions)",
        1,
        fault="redirect",
    ),
    Case(
        "https-to-a-plain-http-port",
        "TLS handshake with {url} failed ([SSL*); is the server plain http? then give the endpoint as http://",
        1,
        scheme="https",
        seconds=20,
    ),
    Case(
        "history-not-a-database",
        HISTORY_LINE,
        0,
        args=("--llmperf-history={root}/hist.sqlite",),
        files={HISTORY: NOT_A_DATABASE},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_message(pytester: pytest.Pytester, server: str, monkeypatch: pytest.MonkeyPatch, case: Case):
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    root = pytester.path
    endpoint = f"{server.replace('http', case.scheme, 1)}/{case.fault}/v1"
    names = {"url": f"{endpoint}/completions", "server": server, "root": root}
    pytester.makepyfile(test_inner=case.source)
    for rel, text in case.files.items():
        (root / rel).write_text(text)
    (root / "baselines").mkdir()
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.format(**names))
    before, files_before = snapshot(root), {rel: (root / rel).read_bytes() for rel in case.files}
    where = () if case.fault is None else (f"--llmperf-endpoint={endpoint}",)
    started = time.monotonic()
    result = run(pytester, *where, "--llmperf-baseline-dir=baselines", "-rN", *(a.format(**names) for a in case.args))
    elapsed = time.monotonic() - started
    output = result.stdout.str() + result.stderr.str()
    assert elapsed < case.seconds, f"took {elapsed:.1f} s"
    assert result.ret == case.exit, output
    if case.message is not None:
        once(output, case.message.format(**names))
    else:
        result.assert_outcomes(passed=1)
    clean(output)
    assert snapshot(root) == before  # no baseline written or touched
    assert {rel: (root / rel).read_bytes() for rel in case.files} == files_before  # the bad files left as found
    assert not list(root.rglob(".tmp-*.gguf"))  # no half-written model left
    if case.json_subject:
        (record,) = [r["record"] for r in json.loads((root / "session.json").read_text())["results"]]
        assert {k: record["subject"][k] for k in case.json_subject} == case.json_subject


# -- the llmperf command --------------------------------------------------------------------------


def test_profile_checks_its_output_before_profiling(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "afile").write_text("a file, not a folder")
    out = tmp_path / "afile" / "profile.txt"
    started = time.monotonic()
    assert cli_main(["profile", "tiny", "--runs", "50", "-o", str(out)]) == 2
    assert time.monotonic() - started < 3  # refused at once, not after profiling
    stdout, err = capsys.readouterr()
    assert err.strip() == f"llmperf: error: cannot write {out}: Not a directory; give -o a writable path"
    clean(stdout + err)
    assert (tmp_path / "afile").read_text() == "a file, not a folder"


def test_load_min_goodput_is_a_share(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["load", "--endpoint", "http://127.0.0.1:9/v1", "--min-goodput", "2"])
    assert exit_.value.code == 2
    _, err = capsys.readouterr()
    assert err.strip() == (
        "llmperf load: error: argument --min-goodput: must be a share in (0, 1], e.g. 0.95, "
        "got '2' (see llmperf load --help)"
    )


def test_load_reports_a_redirect(server: str, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    """The load client (asynchronous) says what the single-stream one says of a 301."""
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    args = [
        "load",
        "--endpoint",
        f"{server}/redirect/v1",
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--warmup",
        "0",
        "--prompt-tokens",
        "4",
        "--max-tokens",
        "8",
        "--request-timeout",
        "5",
    ]
    assert cli_main(args) == 2
    out, err = capsys.readouterr()
    url = f"{server}/redirect/v1/completions"
    assert err.strip() == (
        f"llmperf: error: all 2 requests failed; first: HTTP 301 from {url}: redirects are not "
        f"followed; use the final URL as the endpoint (Location: {server}/ok/v1/completions)"
    )
    clean(out + err)


def test_history_command_on_a_file_that_is_not_a_database(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / HISTORY
    path.write_text(NOT_A_DATABASE)
    assert cli_main(["history", "--history", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.strip() == "llmperf: error: " + HISTORY_LINE.format(root=tmp_path).removeprefix(
        "llmperf: history not written: "
    )
    assert path.read_text() == NOT_A_DATABASE


# -- Ctrl-C and an unreadable model: the command in a child process ---------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    package_root = Path(pytest_llmperf.__file__).resolve().parent.parent  # the code under test, in the child too
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), env.get("PYTHONPATH", "")])
    return {**env, "LLMPERF_API_KEY": API_KEY, **extra}


def interrupt(argv: list[str], ready: str, seconds: float = 60) -> tuple[int, str]:
    """Run ``llmperf ARGV`` with stdout and stderr on a terminal, press Ctrl-C (SIGINT) once
    ``ready`` appears; returns the exit status and everything it printed."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmperf.cli", *argv],
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env=child_env(COLUMNS="200"),
        preexec_fn=ctrl_c_default,  # noqa: PLW1509  (the caller's shell may ignore SIGINT)
    )
    os.close(child)
    out, sent, deadline = b"", False, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            # a deadline on the read too: a child that prints nothing more must not hang the test
            if not select.select([main], [], [], max(deadline - time.monotonic(), 0.0))[0]:
                break
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not sent and ready.encode() in out:
                proc.send_signal(signal.SIGINT)
                sent = True
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    assert sent, out.decode(errors="replace")
    return rc, out.decode(errors="replace").replace("\r\x1b[K", "\n").replace("\r\n", "\n")


def test_ctrl_c_of_llmperf_load(server: str) -> None:
    started = time.monotonic()
    rc, out = interrupt(
        [
            "load",
            "--endpoint",
            f"{server}/silent/v1",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--warmup",
            "0",
            "--prompt-tokens",
            "4",
            "--max-tokens",
            "8",
        ],
        "unique prompts",
    )
    assert rc == INTERRUPTED, out
    once(out, INTERRUPTED_LINE)
    clean(out)
    assert time.monotonic() - started < 30


def test_ctrl_c_of_llmperf_profile(tmp_path: Path) -> None:
    """While llama.cpp measures (the progress line says so): one line, exit 130, no report."""
    report = tmp_path / "profile.json"
    rc, out = interrupt(
        ["profile", "tiny", "--runs", "100000", "--threads", "1", "--format", "json", "-o", str(report)], "of 100000"
    )
    assert rc == INTERRUPTED, out
    once(out, INTERRUPTED_LINE)
    clean(out)
    assert not report.exists() and not list(tmp_path.iterdir())


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def _without_root_reads() -> None:
    """In the child, before exec: root without the capabilities to read any file (mode 000
    then holds for it, as for everyone else)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


@pytest.fixture
def unreadable_model(tmp_path: Path) -> Path:
    from pytest_llmperf.models.gguf import ensure_model

    model = tmp_path / "model.gguf"
    shutil.copyfile(ensure_model("tiny"), model)
    model.chmod(0o000)
    yield model
    model.chmod(0o644)


def unreadable(model: Path) -> str:
    return (
        f"cannot read the model file {model}: Permission denied; make it readable (chmod a+r {model}) "
        "or give another GGUF path or a preset name (tiny, small)"
    )


def test_mode_000_model_llmperf_profile(unreadable_model: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest_llmperf.cli", "profile", str(unreadable_model)],
        capture_output=True,
        text=True,
        env=child_env(),
        preexec_fn=_without_root_reads,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == "llmperf: error: " + unreadable(unreadable_model)
    clean(out.stdout + out.stderr)


def test_mode_000_model_session(unreadable_model: Path, tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(source())
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-rN",
        f"--rootdir={tmp_path}",
        f"--llmperf-model={unreadable_model}",
        "--llmperf-history=off",
        "test_inner.py",
    ]
    out = subprocess.run(
        argv,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=child_env(),
        preexec_fn=_without_root_reads,
        timeout=120,
        check=False,
    )
    output = out.stdout + out.stderr
    assert out.returncode == 1, output
    once(output, unreadable(unreadable_model))
    clean(output)
    assert not (tmp_path / "baselines").exists()


# -- a PostgreSQL history whose tables were dropped by hand ------------------------------------------


PASSWORD = "pw-hostile-4e1d"


@pytest.fixture(scope="module")
def pg_server():
    if bindir() is None or importlib.util.find_spec("psycopg") is None:
        unavailable()
    with PgServer() as pg:
        yield pg


def sql(url: str, statement: str) -> list:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def history_command(url: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    rc = cli_main(["history", "--history", url])
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    clean(out + err)
    return rc, out + err


def test_dropped_postgresql_tables(
    pytester: pytest.Pytester, server: str, pg_server, monkeypatch, capsys: pytest.CaptureFixture
) -> None:
    """The version table dropped: the history still reads (not "no sessions") and the next
    session recreates it, instead of "relation already exists" forever. A table that rows
    left refer to dropped: one line saying exactly what to do, and doing it works."""
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    url = pg_server.new_database().replace("llmperf@", f"llmperf:{PASSWORD}@")  # trust: ignored, never shown
    shown = url.replace(PASSWORD, "***")
    pytester.makepyfile(test_inner=source())

    def session(line: str) -> None:
        result = run(pytester, f"--llmperf-endpoint={server}/ok/v1", f"--llmperf-history={url}", "-rN")
        capsys.readouterr()  # the inner session's copy: the command's output is read apart
        output = result.stdout.str() + result.stderr.str()
        assert result.ret == 0, output
        once(output, line)
        assert PASSWORD not in output and "already exists" not in output
        clean(output)

    appended = "llmperf: history: session #{} (1 measurement(s)) appended to " + shown
    session(appended.format(1))
    sql(url, "DROP TABLE llmperf_schema")
    rc, out = history_command(url, capsys)
    assert rc == 0 and "test_inner.py::test_a" in out, out
    session(appended.format(2))
    assert sql(url, "SELECT version FROM llmperf_schema") == [(1,)]

    sql(url, "DROP TABLE llmperf_values")  # nothing refers to its rows: recreated by the next writer
    rc, out = history_command(url, capsys)
    assert rc == 2 and out.strip() == (
        f"llmperf: error: the history {shown} lacks table(s) llmperf_values "
        "(dropped?); the next pytest session that writes to it recreates them"
    ), out
    session(appended.format(3))

    sql(url, "DROP TABLE llmperf_sessions CASCADE")  # the measurements' rows refer to it
    refused = (
        f"the history {shown} lacks table(s) llmperf_sessions that its other rows refer to (dropped?); "
        "restore them from a backup, or DROP TABLE llmperf_values, llmperf_measurements, llmperf_schema "
        "to start anew"
    )
    session("llmperf: history not written: " + refused)
    assert sql(url, "SELECT COUNT(*) FROM llmperf_measurements") == [(3,)]  # nothing written, nothing lost
    rc, out = history_command(url, capsys)
    assert rc == 2 and out.strip() == "llmperf: error: " + refused, out
    sql(url, "DROP TABLE llmperf_values, llmperf_measurements, llmperf_schema")  # what the line says
    session(appended.format(1))
