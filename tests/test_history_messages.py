"""The history's own errors in one line with their cause and their fix (issue 47, point 5): a
read-only file, folder or file system, a leftover journal SQLite cannot roll back, a full disk,
another application's database at the history's place, and PostgreSQL's refusals (a role's
privileges, a read-only server, a missing database, a server not reached). Before, each was the
driver's raw words (``disk I/O error``, ``attempt to write a readonly database``, ``no such
column: id``) with no cause or fix.

Each case writes (``append_session``, what the plugin does at the end of a session) and reads
(``database.read``, what the verdicts and ``llmperf history`` do) and asserts each one line,
that no driver's raw words are left in it, and that the file's bytes are what they were.

Permissions: root ignores file modes, so as root the writer runs in a user namespace of its
own (``unshare --user``: the files' owner is not mapped there and no capability applies to
them), where a mode says what it says for anyone else.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from inner import run
from test_history import pg_server, result, stamp  # noqa: F401  (the PostgreSQL cluster fixture)
from test_hostile import server  # noqa: F401  (the fake streaming server)
from test_hostile_waits import comm, lock_held_elsewhere, seeded_history

from pytest_llmperf.history import append_session
from pytest_llmperf.history import connection as conn_module
from pytest_llmperf.history import database as store
from pytest_llmperf.history.connection import HistoryError, LastingHistoryError, Location

CHECKOUT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
#: The drivers' words that name no cause (before: the whole message).
RAW = ("disk I/O error", "readonly database", "unable to open database file", "no such column", "no such table")

#: The writer and the reader, in a process of their own: each one line ("written", "read N").
SCRIPT = """
import sys
sys.path.insert(0, sys.argv[2])
from test_history import result, stamp
from pytest_llmperf.history import append_session
from pytest_llmperf.history import database as store
from pytest_llmperf.history.connection import HistoryError, Location
loc = Location("sqlite", sys.argv[1], "--llmperf-history")
try:
    append_session(loc, [result("t.py::test_new", 10.0)], stamp(5), ".", compared=False)
    print("written")
except HistoryError as exc:
    print(f"{type(exc).__name__}: {exc}")
try:
    print(f"read {len({r['session_id'] for r in store.read(loc)})} session(s)")
except HistoryError as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def as_a_user(argv: list[str]) -> list[str]:
    """``argv`` where file modes apply: as it is, or as root in a user namespace of its own."""
    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "true"], check=False).returncode != 0:
        pytest.skip("as root, file modes apply only in a user namespace (unshare --user), not available here")
    return [unshare, "--user", *argv]


def digest(*paths: Path) -> list[str | None]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None for p in paths]


def seeded(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    append_session(Location("sqlite", str(path)), [result("t.py::test_old", 10.0)], stamp(0), ".", compared=False)
    return path


def leftover_journal(path: Path) -> Path:
    """A writer killed mid-transaction: its rollback journal left beside the file (a hot journal)."""
    code = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN'); "
        "[c.execute('INSERT INTO llmperf_schema VALUES (?)', (i,)) for i in range(3000)]; "
        "c.execute('UPDATE llmperf_schema SET version = 1'); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    journal = Path(f"{path}-journal")
    assert journal.exists() and journal.stat().st_size > 0
    return journal


def _ro_file(t: Path) -> tuple[Path, list[Path]]:
    db = seeded(t / "h" / "history.sqlite")
    db.chmod(0o444)
    return db, [db.parent]


def _ro_folder(t: Path) -> tuple[Path, list[Path]]:
    db = seeded(t / "h" / "history.sqlite")
    db.parent.chmod(0o555)
    return db, [db.parent]


def _journal_in_ro_folder(t: Path) -> tuple[Path, list[Path]]:
    db = seeded(t / "h" / "history.sqlite")
    leftover_journal(db)
    db.parent.chmod(0o555)
    return db, [db.parent]


def _journal_beside_ro_file(t: Path) -> tuple[Path, list[Path]]:
    db = seeded(t / "h" / "history.sqlite")
    leftover_journal(db)
    db.chmod(0o444)
    return db, [db.parent]


def _mode_000(t: Path) -> tuple[Path, list[Path]]:
    db = seeded(t / "h" / "history.sqlite")
    db.chmod(0)
    return db, [db.parent]


def _new_in_ro_folder(t: Path) -> tuple[Path, list[Path]]:
    (t / "h").mkdir()
    (t / "h").chmod(0o555)
    return t / "h" / "history.sqlite", [t / "h"]


FLAG = "or give --llmperf-history another path (off: keep no history)"
READONLY_CASES: list[tuple[str, Callable[[Path], tuple[Path, list[Path]]], str, str]] = [
    # (id, make it, the writer's line, the reader's line), {db} {dir} {journal} filled in
    (
        "read-only-file",
        _ro_file,
        "LastingHistoryError: cannot write the history {db}: {db} (mode 0444) may not be written by this process; "
        "make it writable (chmod u+rw {db}) " + FLAG,
        "read 1 session(s)",
    ),
    (
        "read-only-folder",
        _ro_folder,
        "LastingHistoryError: cannot write the history {db}: its folder {dir} may not be written by this process "
        "(SQLite writes a journal beside the file); make the folder writable (chmod u+w {dir}) " + FLAG,
        "read 1 session(s)",
    ),
    (
        "leftover-journal-in-a-read-only-folder",
        _journal_in_ro_folder,
        "LastingHistoryError: cannot open the history {db}: a leftover journal {journal} (a writer stopped "
        "mid-write) must be rolled back into it, but its folder {dir} may not be written by this process (SQLite "
        "writes a journal beside the file); make the folder writable (chmod u+w {dir}) and run again (keep the "
        "journal: it restores the history's last whole session)",
        None,
    ),
    (
        "leftover-journal-beside-a-read-only-file",
        _journal_beside_ro_file,
        "LastingHistoryError: cannot open the history {db}: a leftover journal {journal} (a writer stopped "
        "mid-write) must be rolled back into it, but {db} (mode 0444) may not be written by this process; make it "
        "writable (chmod u+rw {db}) and run again (keep the journal: it restores the history's last whole session)",
        None,
    ),
    (
        "mode-000-file",
        _mode_000,
        "LastingHistoryError: cannot open the history {db}: {db} (mode 0000) may not be read or written by this "
        "process; make it writable (chmod u+rw {db}) " + FLAG,
        None,
    ),
    (
        "new-history-in-a-read-only-folder",
        _new_in_ro_folder,
        "LastingHistoryError: cannot open the history {db}: its folder {dir} may not be written by this process "
        "(SQLite writes a journal beside the file); make the folder writable (chmod u+w {dir}) " + FLAG,
        "HistoryError: no history at {db}",
    ),
]


@pytest.mark.parametrize(("name", "make", "write", "read"), READONLY_CASES, ids=[c[0] for c in READONLY_CASES])
def test_a_history_this_process_may_not_write(tmp_path: Path, name: str, make, write: str, read: str | None) -> None:
    db, restore = make(tmp_path)
    journal = Path(f"{db}-journal")
    before = digest(db, journal)
    try:
        out = subprocess.run(
            as_a_user([sys.executable, "-c", SCRIPT, str(db), str(TESTS)]),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])},
        )
    finally:
        for folder in restore:
            folder.chmod(0o755)
        if db.exists():
            db.chmod(0o644)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    filled = {"db": db, "dir": db.parent, "journal": journal}
    wrote, got = out.stdout.splitlines()
    assert wrote == write.format(**filled)
    assert got == (read or write).format(**filled)
    assert not any(words in out.stdout for words in RAW)
    if before[1] is None:
        assert digest(db, journal) == before  # never rewritten
    else:  # SQLite may roll the journal back into the file before it fails to delete it: the last whole session
        assert journal.exists() and {r["session_id"] for r in store.read(Location("sqlite", str(db)))} == {1}


def test_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own ``database or disk is full`` (its page limit standing in for the disk)."""
    db = seeded(tmp_path / "history.sqlite")
    before = digest(db)
    connect = sqlite3.connect

    def filled(*args, **kwargs):
        raw = connect(*args, **kwargs)
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.execute(f"PRAGMA max_page_count = {pages}")  # any growth is a full disk
        return raw

    monkeypatch.setattr(conn_module.sqlite3, "connect", filled)
    loc = Location("sqlite", str(db), "$LLMPERF_HISTORY")
    with pytest.raises(LastingHistoryError) as raised:
        append_session(loc, [result("t.py::test_new", 10.0, runs=400)], stamp(1), ".", compared=False)
    assert str(raised.value) == (
        f"cannot write the history {db}: the disk holding {tmp_path} is full; free space there "
        "or give $LLMPERF_HISTORY another path (off: keep no history)"
    )
    assert digest(db) == before


def _other_application(path: Path) -> None:
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
        c.execute("CREATE TABLE moz_bookmarks (id INTEGER PRIMARY KEY, fk INTEGER)")
        c.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    c.close()


def _our_name_other_columns(path: Path) -> None:
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE llmperf_sessions (uid TEXT, started TEXT)")
        c.execute("INSERT INTO llmperf_sessions VALUES ('x', 'y')")
    c.close()


FOREIGN_CASES = [
    (
        "another-applications-sqlite-file",
        _other_application,
        "{db} is another application's SQLite database (tables moz_bookmarks, moz_places), not a pytest-llmperf "
        "history; it was left as it is: move it away or give --llmperf-history another path (off: keep no history)",
    ),
    (
        "a-table-of-our-name-with-other-columns",
        _our_name_other_columns,
        "the history {db} has a table llmperf_sessions without column(s) branch, commit_sha, compared, dirty, "
        "finished_at, host, id, llmperf_version, started_at: another application's (or one edited by hand), not "
        "pytest-llmperf's; it was left as it is: give --llmperf-history another path (off: keep no history)",
    ),
]


@pytest.mark.parametrize(("name", "make", "line"), FOREIGN_CASES, ids=[c[0] for c in FOREIGN_CASES])
def test_another_applications_sqlite_database(tmp_path: Path, name: str, make, line: str) -> None:
    db = tmp_path / "places.sqlite"
    make(db)
    before = digest(db)
    loc = Location("sqlite", str(db), "--llmperf-history")
    for act in (
        lambda: append_session(loc, [result("t.py::test_new", 10.0)], stamp(1), ".", compared=False),
        lambda: store.read(loc),
        lambda: store.counts(loc),
    ):
        with pytest.raises(LastingHistoryError) as raised:
            act()
        assert str(raised.value) == line.format(db=db)
    assert digest(db) == before


# -- PostgreSQL ----------------------------------------------------------------------------------


def _psql(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for statement in statements:
            c.execute(statement)


def test_postgres_refusals_name_their_cause(pg_server) -> None:
    """A read-only server, a role without privileges, a missing database, a foreign table, a
    server not reached: each one line with the driver's words and what to do."""
    one = [result("t.py::test_new", 10.0)]

    def write(url: str, source: str = "--llmperf-history") -> str:
        with pytest.raises(HistoryError) as raised:
            append_session(Location("postgresql", url, source), one, stamp(1), ".", compared=False)
        assert raised.value.lasting
        return str(raised.value)

    read_only = pg_server.new_database()
    name = read_only.rsplit("/", 1)[1]
    _psql(pg_server.url, f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    assert write(read_only).endswith(
        "cannot execute CREATE TABLE in a read-only transaction; the server takes no writes (a read-only "
        "standby?); give the primary server's URL"
    )

    guest = pg_server.new_database()
    role = "guest_" + guest.rsplit("_", 1)[1]  # roles are the cluster's: one per database
    _psql(guest, f"CREATE ROLE {role} LOGIN PASSWORD 'guest-pw'", "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    as_guest = guest.replace(f"//{pg_server.user}@", f"//{role}:guest-pw@")
    line = write(as_guest)
    assert "permission denied" in line and line.endswith(
        "; the role lacks a privilege on the history's tables; GRANT it (docs/history.md) or connect as their owner"
    )
    assert "guest-pw" not in line

    missing = guest.rsplit("/", 1)[0] + "/no_such_database"
    line = write(missing)
    assert line.endswith(
        'database "no_such_database" does not exist; create that database (createdb NAME) or fix the database '
        "name in the URL"
    )

    foreign = pg_server.new_database()
    _psql(foreign, "CREATE TABLE llmperf_values (metric TEXT, value REAL)")
    assert write(foreign, "$LLMPERF_HISTORY").endswith(
        "has a table llmperf_values without column(s) level, log_level, measurement_id, median, n, phase, runs, se, "
        "spread, unit, upper: another application's (or one edited by hand), not pytest-llmperf's; it was left as "
        "it is: give $LLMPERF_HISTORY another database (off: keep no history)"
    )

    closed = "postgresql://llmperf@127.0.0.1:1/nowhere"
    assert write(closed).endswith("Connection refused; is the server running and listening at that host and port?")


# -- a lock held past its wait: one wait and one line per session -----------------------------------

INNER = (
    "import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=2, warmup=0)\n"
    "def test_a():\n    pass\n\n"
    "@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=2, warmup=0)\ndef test_b():\n    pass\n"
)


@pytest.mark.parametrize("how", ["EXCLUSIVE", "IMMEDIATE"])
def test_a_lock_held_past_its_wait_costs_one_wait_and_one_line(
    pytester: pytest.Pytester, server: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """EXCLUSIVE: the verdicts' read waits, then (before) the end's write waited again and said
    it again; IMMEDIATE: only the write waits. Either way one wait, one line naming the holder."""
    db = seeded_history(pytester.path / "hist" / "history.sqlite")
    before = digest(db)
    monkeypatch.setattr(conn_module, "LOCK_WAIT_S", 2)
    from pytest_llmperf.core import progress

    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # the machine's speed decides nothing: every task speaks
    waits: list[str] = []
    wait = conn_module.Conn._wait_for_lock

    def counted(self, sql, params):
        waits.append(sql)
        return wait(self, sql, params)

    monkeypatch.setattr(conn_module.Conn, "_wait_for_lock", counted)
    pytester.makepyfile(test_inner=INNER)
    with lock_held_elsewhere(db, how) as pid:
        result = run(pytester, f"--llmperf-endpoint={server}/ok/v1", f"--llmperf-history={db}", "-rN")
        holder = f"process {pid} ({comm(pid)})"
    output = result.stdout.str() + result.stderr.str()
    locked = f"the history {db} stayed locked for 2 s by {holder}; let that process finish (or stop it), then run again"
    assert result.ret == 0 and output.count("stayed locked") == 1 and len(waits) == 1, output
    assert f"llmperf: history not written: {locked}" in output
    assert "Traceback" not in output and digest(db) == before
    # the wait is not silent: its line while it lasts (a line per step piped, the heartbeat after)
    assert f"history {db}: waiting for its lock, 2 s at most" in output, output  # alone or in a test's line


def test_the_holder_named_without_a_lock_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No /proc/locks line names the holder (a lock taken elsewhere, a kernel that hides it): the
    process that has the file open is named; none at all: what may hold it, in words."""
    db = seeded_history(tmp_path / "history.sqlite")
    real_open = open

    def no_locks(path, *args, **kwargs):
        if str(path) == "/proc/locks":
            raise PermissionError(13, "hidden")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_locks)
    with lock_held_elsewhere(db, "IMMEDIATE") as pid:
        named = conn_module.sqlite_holder(str(db))
        expected = f"process {pid} ({comm(pid)}), which has it open"
    assert named == expected
    assert conn_module.sqlite_holder(str(db)) == (
        "a process this machine does not show (another container or machine sharing the file?)"
    )
