"""Hostile waits (issue 21): every wait ends, in one line, with the files left as they were.

- Files that are not regular files (a FIFO, ``/dev/zero``, a directory) or over the size
  limit (``core.documents.MAX_DOCUMENT_MIB``), where a baseline file, a session report, the
  history or GitHub's step summary should be: refused before any read (or write) can wait.
- A SQLite history locked by another process: Ctrl-C ends the wait at once, the deadline
  ends it naming the process; a real SIGINT to a real subprocess, a real lock held by another.
- A PostgreSQL server that accepts and never answers, and a real PostgreSQL behind a proxy
  that forwards the startup and then stalls: the client's own deadlines end both.

As in test_hostile.py, each case asserts the exact one line, printed once; the exit status;
no traceback; a bounded time; no secret printed; the files unchanged. A case whose fix
regressed must fail, not hang: FIFOs are unblocked and proxies closed after the bound.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from inner import ctrl_c_default, run
from test_history import pg_server  # noqa: F401  (a real PostgreSQL, tests/pgserver.py)
from test_hostile import API_KEY, BASELINE, NOT_WRITTEN, UPDATE, VALID, server, session_file  # noqa: F401

from pytest_llmperf.cli import INTERRUPTED
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.documents import MAX_DOCUMENT_MIB
from pytest_llmperf.history import connection

CHECKOUT = Path(__file__).resolve().parent.parent
OVER = int(MAX_DOCUMENT_MIB * 2**20) + 2**20  # one MiB over the limit
OVER_MIB = round(OVER / 2**20)
SHRINK = "remove the entries of machines no longer tested from it, or split the test module"
SMALLER = "write smaller reports (fewer tests or runs per session)"
PASSWORD = "pg-s3cret-91"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@contextmanager
def fifo_unblocked_after(path: Path, seconds: float) -> Iterator[None]:
    """A FIFO at ``path``; after ``seconds``, whoever still waits on it is let go (an O_RDWR
    open is a reader and a writer at once), so a regressed reader fails the time bound
    instead of hanging the suite."""
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        if done.wait(seconds):
            return
        while not done.wait(0.2):
            os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def over_size(path: Path) -> None:
    """A valid baseline file, padded with JSON whitespace to a MiB over the limit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(VALID)
        fh.truncate(OVER)  # a sparse tail of NUL bytes...
    with open(path, "r+b") as fh:  # ...made spaces, 1 MiB at a time (a real file, not a sparse one)
        fh.seek(len(VALID.encode()))
        left = OVER - len(VALID.encode())
        while left:
            n = min(left, 2**20)
            fh.write(b" " * n)
            left -= n


# -- inner sessions: baseline files, the history path, the step summary --------------------------


@dataclass(frozen=True)
class Case:
    """``make(root)`` puts the hostile thing in place and returns the path to watch; {file}
    (the baseline file), {root} and {thing} are filled in the message."""

    id: str
    make: Callable[[Path], Path]
    message: str
    exit: int
    args: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 30.0


def baseline_fifo(root: Path) -> Path:
    return root / BASELINE  # made a FIFO by the test (fifo_unblocked_after)


def baseline_dir(root: Path) -> Path:
    (root / BASELINE).mkdir(parents=True)
    (root / BASELINE / "kept").write_text("inside")
    return root / BASELINE


def baseline_over(root: Path) -> Path:
    over_size(root / BASELINE)
    return root / BASELINE


def other_fifo(name: str) -> Callable[[Path], Path]:
    return lambda root: root / name


IS_FIFO = "{thing} is a FIFO (named pipe), not a regular file"
IS_DIR = "{thing} is a directory, not a regular file"
BIG = f"{{thing}} is {OVER_MIB} MiB, over the {MAX_DOCUMENT_MIB} MiB a baseline file may be; {SHRINK}"
NOT_WRITTEN_ALSO = (NOT_WRITTEN, "*llmperf summary*")
CASES = [
    Case("baseline-is-fifo", baseline_fifo, IS_FIFO + "; give the path of a baseline file", 1),
    Case(
        "baseline-is-fifo-update",
        baseline_fifo,
        "llmperf: baselines not written: " + IS_FIFO + "; give the path of a baseline file; the file is unchanged",
        1,
        UPDATE,
        NOT_WRITTEN_ALSO,
    ),
    Case("baseline-is-directory", baseline_dir, IS_DIR + "; give the path of a baseline file", 1),
    Case(
        "baseline-is-directory-update",
        baseline_dir,
        "llmperf: baselines not written: " + IS_DIR + "; give the path of a baseline file; the file is unchanged",
        1,
        UPDATE,
        NOT_WRITTEN_ALSO,
    ),
    Case("baseline-over-size", baseline_over, BIG, 1, seconds=20),
    Case(
        "baseline-over-size-update-keeps-it",
        baseline_over,
        f"llmperf: baselines not written: {BIG}; the file is unchanged",
        1,
        UPDATE,
        NOT_WRITTEN_ALSO,
        seconds=20,
    ),
    Case(
        "history-is-fifo",
        other_fifo("history.sqlite"),
        "llmperf: history not written: " + IS_FIFO + "; give the history file's path",
        0,
        ("--llmperf-history={thing}",),
        ("*llmperf summary*",),
    ),
    Case(
        "step-summary-fifo-nobody-reads",
        other_fifo("summary.md"),
        "llmperf: cannot write {thing}: No such device or address",
        0,
        env={"GITHUB_STEP_SUMMARY": "{thing}"},
        also=("*llmperf summary*",),
    ),
]


def state(path: Path) -> object:
    """What must not change: a FIFO stays a FIFO, a directory keeps its file, a file its bytes."""
    if path.is_fifo():
        return "fifo"
    if path.is_dir():
        return sorted((p.name, p.read_bytes()) for p in path.iterdir())
    return digest(path)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_file_in_session(pytester: pytest.Pytester, server: str, monkeypatch: pytest.MonkeyPatch, case: Case):
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    root = pytester.path
    pytester.makepyfile(
        test_inner="import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, "
        "warmup=0)\ndef test_a():\n    pass\n"
    )
    (root / "baselines").mkdir(exist_ok=True)
    thing = case.make(root)
    names = {"file": root / BASELINE, "root": root, "thing": thing}
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.format(**names))
    fifo = fifo_unblocked_after(thing, case.seconds) if not thing.exists() else None
    with fifo or nullcontext():
        before = state(thing)
        started = time.monotonic()
        result = run(
            pytester,
            f"--llmperf-endpoint={server}/ok/v1",
            "--llmperf-baseline-dir=baselines",
            "-rN",
            *[a.format(**names) for a in case.args],
        )
        elapsed = time.monotonic() - started
        after = state(thing)
    output = result.stdout.str() + result.stderr.str()
    assert elapsed < case.seconds, f"took {elapsed:.1f} s"
    assert result.ret == case.exit, output
    message = case.message.format(**names)
    assert output.count(message) == 1, output
    assert "Traceback" not in output and API_KEY not in output
    if case.also:
        result.stdout.fnmatch_lines(list(case.also))
    assert after == before  # never read, never replaced, never truncated
    assert not list(root.rglob("*.corrupt*")) and not list(root.rglob(".*.tmp"))


# -- the llmperf command on paths that are not session reports ------------------------------------


def limited() -> None:
    """The command's memory capped (2 GiB of address space): reading /dev/zero without end fails
    fast instead of taking the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


def command(*argv: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest_llmperf.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        preexec_fn=limited,
        check=False,
    )
    return out, time.monotonic() - started


def session_over(path: Path) -> Path:
    session_file(path, ["t_a"])
    with open(path, "a", encoding="utf-8") as fh:
        fh.truncate(OVER)
    with open(path, "r+b") as fh:  # NUL bytes made JSON whitespace
        data = fh.read()
        fh.seek(0)
        fh.write(data.replace(b"\0", b" "))
    return path


#: The bound of one command, its start (numpy, scipy, matplotlib imports on a busy 2-core VM) included.
CLI_SECONDS = 30
SESSION_CASES = [
    # (id, how the second path is made, the line after "llmperf: error: ")
    ("fifo", lambda p: p, IS_FIFO + "; give the path of a session report"),
    (
        "dev-zero",
        lambda p: Path("/dev/zero"),
        "{thing} is a character device, not a regular file; give the path of a session report",
    ),
    ("directory", lambda p: (p.mkdir(), p)[1], IS_DIR + "; give the path of a session report"),
    (
        "over-size",
        session_over,
        f"{{thing}} is {OVER_MIB} MiB, over the {MAX_DOCUMENT_MIB} MiB a session report may be; {SMALLER}",
    ),
]


@pytest.mark.parametrize("verb", ["compare", "report"])
@pytest.mark.parametrize(("name", "make", "message"), SESSION_CASES, ids=[c[0] for c in SESSION_CASES])
def test_hostile_session_report_path(tmp_path: Path, verb: str, name: str, make, message: str) -> None:
    """Exit 2 and one line, within seconds: before, a FIFO blocked forever and /dev/zero read
    without bound."""
    if verb == "report":
        pytest.importorskip("matplotlib")  # the command needs it before it reads anything
    a = Path(session_file(tmp_path / "a.json", ["t_a"]))
    target = tmp_path / "b.json"
    fifo = fifo_unblocked_after(target, CLI_SECONDS) if name == "fifo" else None
    with fifo or nullcontext():
        thing = make(target)
        before = state(thing) if thing != Path("/dev/zero") else None
        argv = (
            ["compare", str(a), str(thing)]
            if verb == "compare"
            else ["report", str(thing), "-o", str(tmp_path / "r.html")]
        )
        out, elapsed = command(*argv)
        after = state(thing) if thing != Path("/dev/zero") else None
    expected = "llmperf: error: " + message.format(thing=thing)
    assert out.returncode == 2 and out.stderr.strip() == expected, out.stderr
    assert "Traceback" not in out.stdout + out.stderr and elapsed < CLI_SECONDS
    assert after == before and not (tmp_path / "r.html").exists()


def test_the_capped_command_still_compares(tmp_path: Path) -> None:
    """The rows above are no artefact of the cap: a usable report compares under it, exit 0."""
    a = session_file(tmp_path / "a.json", ["t_a"])
    out, _ = command("compare", a, a)
    assert out.returncode == 0, out.stderr


# -- a SQLite history locked by another process -----------------------------------------------------


def seeded_history(path: Path) -> Path:
    from test_history import result, stamp

    from pytest_llmperf.history import append_session
    from pytest_llmperf.history.connection import Location

    append_session(
        Location("sqlite", str(path)), [result("t.py::test_old", 10.0)], stamp(0), path.parent, compared=False
    )
    return path


@contextmanager
def lock_held_elsewhere(db: Path, how: str = "IMMEDIATE") -> Iterator[int]:
    """Another process holds the history's write lock (``BEGIN IMMEDIATE``, a writer) or
    ``EXCLUSIVE`` (a reader waits too) until the block ends; yields its pid."""
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        f"c.execute('BEGIN {how}'); print('locked', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


LOCKED = (
    "the history {db} stayed locked for 2 s by process {pid} ({comm}); let that process finish (or stop "
    "it), then run again"
)


def test_history_locked_past_the_deadline_in_session(
    pytester: pytest.Pytester, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ends its wait at the deadline (2 s here, 60 s by default) with the one line
    naming the holder; the tests keep their outcome, the history its bytes."""
    db = seeded_history(pytester.path / "hist" / "history.sqlite")
    before = digest(db)
    monkeypatch.setattr(connection, "LOCK_WAIT_S", 2)
    pytester.makepyfile(
        test_inner="import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=2, "
        "warmup=0)\ndef test_a():\n    pass\n"
    )
    with lock_held_elsewhere(db) as pid:
        started = time.monotonic()
        result = run(pytester, f"--llmperf-endpoint={server}/ok/v1", f"--llmperf-history={db}", "-rN")
        elapsed = time.monotonic() - started
        line = "llmperf: history not written: " + LOCKED.format(db=db, pid=pid, comm=comm(pid))
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0 and output.count(line) == 1, output
    assert "Traceback" not in output and 2 <= elapsed < 20
    assert digest(db) == before


def test_history_locked_past_the_deadline_in_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A reader waits for a writer's exclusive lock the same way (``llmperf history``)."""
    db = seeded_history(tmp_path / "history.sqlite")
    monkeypatch.setattr(connection, "LOCK_WAIT_S", 2)
    with lock_held_elsewhere(db, "EXCLUSIVE") as pid:
        started = time.monotonic()
        assert cli_main(["history", "--history", str(db)]) == 2
        elapsed = time.monotonic() - started
        line = "llmperf: error: " + LOCKED.format(db=db, pid=pid, comm=comm(pid))
    err = capsys.readouterr().err.strip().splitlines()
    waiting = [x for x in err if x.startswith(f"llmperf: history {db}: ")]  # the wait's own progress lines
    assert err[-1] == line and len(err) == len(waiting) + 1 and 2 <= elapsed < 10, err


def wait_until_waiting(pid: int, path: Path, seconds: float) -> None:
    """Until process ``pid`` has held ``path`` open for half a second: it waits for the lock."""
    target, since = os.path.realpath(path), None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            is_open = any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            is_open = False
        since = (since or time.monotonic()) if is_open else None
        if since is not None and time.monotonic() - since >= 0.5:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never waited on {path}")


#: The signal ends the wait, not the lock's 60-s deadline: the process exits well within this
#: (a loaded machine takes seconds to tear a Python process down: 9 s seen under load 14).
ENDS_ON_SIGNAL_S = 30


def interrupted(argv: list[str], db: Path, cwd: Path) -> tuple[int, str, float]:
    """``argv`` in a subprocess, SIGINT once it waits for ``db``'s lock: exit status, output,
    seconds from the signal to the exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_default,  # noqa: PLW1509  (the caller's shell may ignore SIGINT)
    )
    try:
        wait_until_waiting(proc.pid, db, 60)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=45)
        return proc.returncode, output, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def waited(db: Path) -> str:
    """The interrupt's line up to the lock's holder (this test's process), seconds as a pattern."""
    return (
        r"llmperf: interrupted after waiting \d+ s for the history "
        + re.escape(str(db))
        + re.escape(f", locked by process {os.getpid()} ({comm(os.getpid())}); nothing was written to it")
    )


@contextmanager
def lock_held_here(db: Path, how: str) -> Iterator[None]:
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute(f"BEGIN {how}")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_ctrl_c_ends_a_session_waiting_for_the_history_lock(tmp_path: Path, server: str) -> None:
    """A real SIGINT to a pytest session waiting (up to 60 s) for the history's lock: it ends
    within seconds, with one line naming the holder and pytest's interrupted status (2)."""
    db = seeded_history(tmp_path / "history.sqlite")
    before = digest(db)
    (tmp_path / "test_inner.py").write_text(
        "import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, "
        "runs=2, warmup=0)\ndef test_a():\n    pass\n"
    )
    argv = [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--rootdir={tmp_path}",
        "-rN",
        "test_inner.py",
        f"--llmperf-endpoint={server}/ok/v1",
        f"--llmperf-history={db}",
        f"--llmperf-json={tmp_path / 's.json'}",
    ]
    with lock_held_here(db, "IMMEDIATE"):
        status, output, after_signal_s = interrupted(argv, db, tmp_path)
    line = waited(db) + re.escape("; the session's files not written yet were left out")
    assert status == 2 and len(re.findall(line, output)) == 1, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert after_signal_s < ENDS_ON_SIGNAL_S and digest(db) == before and not (tmp_path / "s.json").exists()


def test_ctrl_c_ends_a_command_waiting_for_the_history_lock(tmp_path: Path) -> None:
    db = seeded_history(tmp_path / "history.sqlite")
    before = digest(db)
    with lock_held_here(db, "EXCLUSIVE"):
        status, output, after_signal_s = interrupted(
            ["-m", "pytest_llmperf.cli", "history", "--history", str(db)], db, tmp_path
        )
    assert status == INTERRUPTED and re.fullmatch(waited(db), output.strip()), output
    assert after_signal_s < ENDS_ON_SIGNAL_S and digest(db) == before


# -- PostgreSQL that stops answering ----------------------------------------------------------------


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class Stalling:
    """A listener on 127.0.0.1. Without ``upstream`` it accepts and never answers. With it, it
    forwards to that real PostgreSQL the startup (SSL/GSS requests, startup message,
    authentication) and every answer, and stalls at the first query: it neither forwards it
    nor answers, nor closes. ``close()`` ends every stall (the safety net of a regression)."""

    REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: the server answers one byte

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.done = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        if self.upstream is None:
            self.done.wait()
            return
        try:
            up = socket.create_connection(self.upstream)
            self.sockets.append(up)
            threading.Thread(target=self._answers, args=(up, client), daemon=True).start()
            while True:  # untyped messages: the startup's requests, then the startup message
                head = _read(client, 8)
                n, code = struct.unpack("!ii", head)
                up.sendall(head + _read(client, n - 8))
                if code not in self.REQUESTS:
                    break
            while True:  # typed messages: forwarded until the first query
                kind, length = _read(client, 1), _read(client, 4)
                body = _read(client, struct.unpack("!i", length)[0] - 4)
                if kind in (b"Q", b"P"):  # simple or extended query: stall
                    self.done.wait()
                    return
                up.sendall(kind + length + body)
        except OSError:
            return

    @staticmethod
    def _answers(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://llmperf:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        self.done.set()
        for s in [self.listener, *self.sockets]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@contextmanager
def stalling(upstream: tuple[str, int] | None, seconds: float) -> Iterator[Stalling]:
    """A ``Stalling`` listener, closed after ``seconds`` at the latest (a regressed wait then
    fails the time bound instead of hanging the suite)."""
    proxy = Stalling(upstream)
    timer = threading.Timer(seconds, proxy.close)
    timer.start()
    try:
        yield proxy
    finally:
        timer.cancel()
        proxy.close()


def redacted(url: str) -> str:
    return url.replace(PASSWORD, "***")


NO_ANSWER = "the history {url} did not answer within 2 s, so it was not {done}; check the server and the network to it"


def test_postgres_that_accepts_and_never_answers(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    pytest.importorskip("psycopg")
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", 2)
    with stalling(None, 20) as proxy:
        started = time.monotonic()
        status = cli_main(["history", "--history", proxy.url()])
        elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    line = (
        f"llmperf: error: cannot connect to the history {redacted(proxy.url())}: connection timeout expired; "
        "check the server and the network to it"
    )
    assert status == 2 and err.strip() == line and PASSWORD not in err and 2 <= elapsed < 10


def test_postgres_that_stalls_after_the_startup(
    pg_server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """psycopg has no client-side statement deadline and the server's statement_timeout is the
    stalled server's to enforce: the connection is cut at ANSWER_WAIT_S (2 s here)."""
    database = pg_server.new_database().rsplit("/", 1)[1]
    monkeypatch.setattr(connection, "ANSWER_WAIT_S", 2)
    with stalling(("127.0.0.1", pg_server.port), 20) as proxy:
        started = time.monotonic()
        status = cli_main(["history", "--history", proxy.url(database)])
        elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    line = "llmperf: error: " + NO_ANSWER.format(url=redacted(proxy.url(database)), done="read")
    assert status == 2 and err.strip() == line and PASSWORD not in err and 2 <= elapsed < 10


def test_session_with_a_postgres_history_that_stalls(
    pytester: pytest.Pytester, server: str, pg_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of the session cuts the stalled write at the deadline: one line, the tests keep
    their outcome, nothing is written (the real database stays empty)."""
    url = pg_server.new_database()
    database = url.rsplit("/", 1)[1]
    monkeypatch.setattr(connection, "ANSWER_WAIT_S", 2)
    pytester.makepyfile(
        test_inner="import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=2, "
        "warmup=0)\ndef test_a():\n    pass\n"
    )
    with stalling(("127.0.0.1", pg_server.port), 40) as proxy:
        started = time.monotonic()
        result = run(pytester, f"--llmperf-endpoint={server}/ok/v1", f"--llmperf-history={proxy.url(database)}", "-rN")
        elapsed = time.monotonic() - started
    output = result.stdout.str() + result.stderr.str()
    line = "llmperf: history not written: " + NO_ANSWER.format(url=redacted(proxy.url(database)), done="written")
    assert result.ret == 0 and output.count(line) == 1, output
    assert "Traceback" not in output and PASSWORD not in output and elapsed < 30
    from pytest_llmperf.history import database as store
    from pytest_llmperf.history.connection import Location

    assert store.counts(Location("postgresql", url)) == {"sessions": 0, "measurements": 0, "values": 0}


def test_postgres_history_locked_past_the_deadline_names_the_writer(
    pg_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer holds the advisory lock: the server's lock_timeout (1 s here) ends the
    wait, and the line names that writer's backend; nothing is written."""
    import psycopg
    from test_history import result, stamp

    from pytest_llmperf.history import append_session
    from pytest_llmperf.history import database as store
    from pytest_llmperf.history.connection import Location

    url = pg_server.new_database()
    loc = Location("postgresql", url)
    monkeypatch.setattr(connection, "LOCK_WAIT_S", 1)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(%s)", (connection.ADVISORY_LOCK,))
        pid = other.info.backend_pid
        started = time.monotonic()
        with pytest.raises(store.HistoryError) as err:
            append_session(loc, [result("t.py::test_a", 10.0)], stamp(0), tmp_path, compared=False)
        elapsed = time.monotonic() - started
        other.execute("ROLLBACK")
    assert str(err.value) == (
        f"the history {loc.display} stayed locked for 1 s by PostgreSQL backend {pid} (client "
        "127.0.0.1); let that writer finish (or stop it), then run again"
    )
    assert elapsed < 10 and store.counts(loc) == {"sessions": 0, "measurements": 0, "values": 0}
