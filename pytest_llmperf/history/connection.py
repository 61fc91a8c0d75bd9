"""Where the session history lives and how it is reached: its location (SQLite path or PostgreSQL
URL), and a connection on which every wait ends.

The location: ``--llmperf-history PATH|URL|off`` > ``$LLMPERF_HISTORY`` >
ini ``llmperf_history`` > ``<rootdir>/.llmperf/history.sqlite`` (the setting is read with the
others, ``core.settings``; ``parse`` turns its value into a ``Location``).

A plain path is a SQLite file (stdlib, nothing to install); ``postgresql://...`` (or libpq's
``host=... dbname=...`` form) is a shared PostgreSQL database for a fleet of CI runners (``pip
install "pytest-llmperf[postgres]"``). Shown only through ``core.redact``: never a password.
Light: imported by the plugin at configure time to reject a bad value in one line.

SQLite: a writer waits for another one (or a reader for a writer's commit) in short busy
timeouts with a pause in Python between them, so Ctrl-C ends the wait at once and is still a
``KeyboardInterrupt`` (``HistoryInterrupted``, whose one line names the lock's holder); after
``LOCK_WAIT_S`` the wait ends in a ``HistoryError`` naming the process that holds the lock.

PostgreSQL: ``connect_timeout`` bounds reaching the server and its startup answer, the
server's ``lock_timeout`` the wait for another writer, and a watchdog thread (``Deadline``)
ends a statement the server leaves unanswered (a stalled server, a lost network) after
``ANSWER_WAIT_S``: it shuts the connection's socket down, so the blocked read fails at once.
A server-side ``statement_timeout`` would not: a stalled server enforces nothing."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..core.documents import file_kind
from ..core.errors import ConfigError, LLMPerfError
from ..core.progress import task
from ..core.redact import Redactor, Url, display, is_dsn
from ..core.settings import SETTINGS

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

_env = SETTINGS["history"].env
assert _env is not None  # the history setting has an environment variable
ENV: str = _env  # also what ``llmperf history``/``detect`` read
DEFAULT_DIR = ".llmperf"
DEFAULT_FILE = "history.sqlite"
OFF = ("off", "none", "no", "false", "0")
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
INSTALL_POSTGRES = 'pip install "pytest-llmperf[postgres]"'


@dataclass(frozen=True)
class Location:
    """A history store: ``kind`` is ``sqlite`` (``target`` a file path) or ``postgresql``
    (``target`` a libpq URL or keyword/value connection string, which may hold a password:
    show ``display``, never ``target``; ``redact`` cleans a driver's message of it)."""

    kind: str
    target: str
    source: str = "default"

    @property
    def display(self) -> str:
        return display(self.target) if self.kind == "postgresql" else self.target

    @property
    def conninfo(self) -> str:
        """What libpq is given: a URL with its userinfo percent-encoded (an unencoded ``@`` in
        a password would otherwise move the host), a keyword/value string as it is."""
        url = Url.split(self.target)
        return str(url.normalized()) if url is not None else self.target

    def redact(self, text: str) -> str:
        return Redactor.of([self.target]).text(text) if self.kind == "postgresql" else text


def parse(value: str, source: str, rootdir: Path | str | None = None) -> Location | None:
    """One configured value: ``off`` -> None; a ``postgresql://`` URL or a libpq keyword/value
    string (``host=h dbname=d password=p``) -> PostgreSQL; else a SQLite file path (relative
    to ``rootdir``)."""
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{source}: empty history location; give a file path, a postgresql:// URL or off")
    if text.lower() in OFF:
        return None
    if text.lower().startswith(POSTGRES_SCHEMES) or is_dsn(text):
        if importlib.util.find_spec("psycopg") is None:
            raise ConfigError(f"{source}: a PostgreSQL history needs psycopg 3: {INSTALL_POSTGRES}")
        return _well_formed(Location("postgresql", text, source))
    if "://" in text:
        raise ConfigError(
            f"{source}: {display(text)!r} is not a supported history location; "
            "give a SQLite file path, a postgresql:// URL or off"
        )
    path = Path(text).expanduser()
    if not path.is_absolute() and rootdir is not None:
        path = Path(rootdir) / path
    if path.is_dir():
        raise ConfigError(f"{source}: {path} is a folder; give the history file's path, e.g. {path / DEFAULT_FILE}")
    return Location("sqlite", str(path), source)


def _well_formed(loc: Location) -> Location:
    """``loc`` when libpq can read it (nothing is connected to); else one line before anything
    runs (before, a malformed URL was found at the first use, after the tests had run)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        ports = str(conninfo_to_dict(loc.conninfo).get("port") or "")
        bad = next((p for p in ports.split(",") if p and not (p.isdigit() and 0 < int(p) < 65536)), None)
        if bad is not None:
            raise psycopg.ProgrammingError(f"port {bad!r} is not a number from 1 to 65535")
    except psycopg.Error as exc:
        raise ConfigError(
            f"{loc.source}: {loc.display!r} is not a valid PostgreSQL location ({first_line(exc, loc)}); give "
            "e.g. postgresql://user@host:5432/db or host=... dbname=..."
        ) from None
    return loc


def default(rootdir: Path | str) -> Location:
    return Location("sqlite", str(Path(rootdir) / DEFAULT_DIR / DEFAULT_FILE), "default")


def for_cli(given: str | None, start: Path | None = None) -> Location:
    """The ``llmperf history/detect`` location: ``--history``, else ``$LLMPERF_HISTORY``, else
    the nearest ``.llmperf/history.sqlite`` from the current folder up."""
    if given is not None:  # an empty one is refused by parse, never taken for "not given"
        found = parse(given, "--history", Path.cwd())
    elif os.environ.get(ENV, "").strip():
        found = parse(os.environ[ENV], f"${ENV}", Path.cwd())
    else:
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents):
            candidate = folder / DEFAULT_DIR / DEFAULT_FILE
            if candidate.is_file():
                return Location("sqlite", str(candidate), "found")
        raise ConfigError(
            f"no history found ({DEFAULT_DIR}/{DEFAULT_FILE} in {here} or above); "
            "run pytest with llmperf tests first, or pass --history PATH|URL"
        )
    if found is None:
        raise ConfigError("history is off; pass --history PATH|URL")
    if found.kind == "sqlite" and not Path(found.target).is_file():
        raise ConfigError(f"no history at {found.target}; run pytest with llmperf tests first")
    return found


#: Seconds a writer waits for another one (SQLite, in Python; PostgreSQL's lock_timeout).
LOCK_WAIT_S = 60
#: Seconds to reach a PostgreSQL server and have its startup answer, before giving up.
CONNECT_TIMEOUT_S = 10
#: Seconds a PostgreSQL statement may go unanswered before the connection is cut (more than
#: the lock wait, which the server ends itself when it answers at all).
ANSWER_WAIT_S = LOCK_WAIT_S + 30
#: SQLite: the busy timeout of one try, and the pause (in Python: Ctrl-C is seen) between tries.
SQLITE_TRY_S = 0.05
#: PostgreSQL advisory lock key of history writers (any constant shared by all writers).
ADVISORY_LOCK = 0x6C6C6D70  # "llmp"
#: PostgreSQL's SQLSTATE of a lock wait ended by lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"
#: SQLite's lock bytes (its os_unix.c): PENDING_BYTE, then RESERVED_BYTE and the 510 shared ones.
SQLITE_LOCK_BYTES = range(0x40000000, 0x40000000 + 512)


class HistoryError(LLMPerfError):
    """The history cannot be read or written; one line that says what to do."""

    #: No use trying it again this session: a damaged file, a server that cannot be reached.
    lasting = False


class LastingHistoryError(HistoryError):
    """A SQLite history that is not a database or whose pages are damaged, another
    application's database, a PostgreSQL server that cannot be reached, a lock still held at
    the end of its wait: said once, the session goes on without history (no second wait)."""

    lasting = True


#: SQLite's names of a damaged file: not a database at all, or damaged pages behind its header.
SQLITE_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


def corrupt_history(path: str | Path, exc: BaseException) -> LastingHistoryError:
    return LastingHistoryError(
        f"the history {path} is not a usable SQLite database ({exc}); move it aside "
        f"(mv {path} {path}.corrupt) and the next session starts a new history there"
    )


def _damaged(exc: BaseException) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    if name:
        return name.startswith(SQLITE_DAMAGED)  # SQLITE_CORRUPT and its extended codes too
    return "malformed" in str(exc) or "not a database" in str(exc)  # Python 3.10: only the message says it


def elsewhere(loc: Location) -> str:
    """The fix that always works: the history somewhere else, by the setting the user gave."""
    flag = {"default": "--llmperf-history", "found": "--history"}.get(loc.source, loc.source)
    return f"or give {flag} another {'path' if loc.kind == 'sqlite' else 'database'} (off: keep no history)"


def translated(doing: str, exc: BaseException, loc: Location) -> HistoryError:
    """``doing``'s one line for a driver's error: its cause and fix where the error is one we
    know (a read-only file, folder or file system, a leftover journal, a full disk; a
    PostgreSQL role, standby, disk or database), lasting (the session does not try again);
    else the driver's first line."""
    cause = sqlite_cause(exc, loc) if loc.kind == "sqlite" else _postgres_cause(exc)
    if cause is None:
        return HistoryError(f"{doing}: {first_line(exc, loc)}")
    if loc.kind == "postgresql":
        return LastingHistoryError(f"{doing}: {first_line(exc, loc)}; {cause}")
    return LastingHistoryError(f"{doing}: {cause}")


#: Python 3.10's SQLite errors carry no name: their message says which it is.
_SQLITE_MESSAGES = (
    ("readonly database", "SQLITE_READONLY"),
    ("disk I/O error", "SQLITE_IOERR"),
    ("disk is full", "SQLITE_FULL"),
    ("unable to open", "SQLITE_CANTOPEN"),
)


def _sqlite_name(exc: BaseException) -> str:
    """SQLite's name of the error (``SQLITE_READONLY_DIRECTORY``...), else ""."""
    name = getattr(exc, "sqlite_errorname", "")
    return name or next((n for text, n in _SQLITE_MESSAGES if text in str(exc)), "")


def sqlite_cause(exc: BaseException, loc: Location) -> str | None:
    """What a SQLite error on the history file means and how to fix it, in words; None for
    an error of another kind (the driver's words are shown)."""
    name, path = _sqlite_name(exc), Path(loc.target)
    if name.startswith("SQLITE_FULL"):
        return f"the disk holding {path.parent} is full; free space there {elsewhere(loc)}"
    if not name.startswith(("SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN")):
        return None
    blocked = _unwritable(path)
    journal = next((Path(f"{path}{s}") for s in ("-journal", "-wal") if Path(f"{path}{s}").exists()), None)
    if journal is not None and blocked is not None:
        what, fix = blocked
        return (
            f"a leftover journal {journal} (a writer stopped mid-write) must be rolled back into it, but {what}; "
            f"{fix} and run again (keep the journal: it restores the history's last whole session)"
        )
    if blocked is not None:
        what, fix = blocked
        return f"{what}; {fix} {elsewhere(loc)}"
    if name.startswith("SQLITE_IOERR"):
        return (
            f"the disk reported an I/O error ({name}) on it; check the disk (dmesg), then move the file aside "
            f"(mv {path} {path}.bad) and the next session starts a new history there"
        )
    return None


def _unwritable(path: Path) -> tuple[str, str] | None:
    """What keeps this process from writing the history ``path`` (a read-only file system,
    the file, its folder: SQLite writes its journal beside the file) and the fix, in words;
    None when all of it is writable."""
    folder = path.parent
    with suppress(OSError):
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"the file system holding {folder} is mounted read-only", "remount it read-write"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        mode, what = stat.S_IMODE(os.stat(path).st_mode), "written" if os.access(path, os.R_OK) else "read or written"
        return f"{path} (mode {mode:04o}) may not be {what} by this process", f"make it writable (chmod u+rw {path})"
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"its folder {folder} may not be written by this process (SQLite writes a journal beside the file)",
            f"make the folder writable (chmod u+w {folder})",
        )
    return None


#: PostgreSQL's SQLSTATEs of a history that cannot be used as it is, and what to do.
POSTGRES_CAUSES = {
    "42501": "the role lacks a privilege on the history's tables; GRANT it (docs/history.md) or connect as their owner",
    "25006": "the server takes no writes (a read-only standby?); give the primary server's URL",
    "53100": "the server's disk is full; free space there",
    "53200": "the server is out of memory; try again when it has some",
}
#: libpq's words of a connection refused (it gives no SQLSTATE then), and what to do.
POSTGRES_CONNECT_FIXES = (
    (r"Connection refused", "is the server running and listening at that host and port?"),
    (r"socket .* No such file or directory", "is the server running on this machine? (no host in the URL: its socket)"),
    (r"could not translate host name", "check the host name in the URL"),
    (r"timeout expired", "check the server and the network to it"),
    (r'database ".*" does not exist', "create that database (createdb NAME) or fix the database name in the URL"),
    (r'role ".*" does not exist', "fix the user in the URL, or create that role"),
    (r"password authentication failed", "fix the user or the password (in the URL or ~/.pgpass)"),
    (r"no pg_hba.conf entry", "the server's pg_hba.conf does not let this role in from here; ask its administrator"),
)


def _postgres_cause(exc: BaseException) -> str | None:
    return POSTGRES_CAUSES.get(str(getattr(exc, "sqlstate", "") or ""))


def _postgres_fix(exc: BaseException) -> str:
    """``; what to do`` after a failed connection's driver line ("" when nothing is known)."""
    fix = _postgres_cause(exc) or next((f for words, f in POSTGRES_CONNECT_FIXES if re.search(words, str(exc))), None)
    return f"; {fix}" if fix else ""


class HistoryInterrupted(KeyboardInterrupt):
    """Ctrl-C while waiting for the history: still an interrupt; ``str()`` is its one line."""


def first_line(exc: BaseException, loc: Location | None = None) -> str:
    """The driver's message, first line, cleaned of the location's secrets (libpq may quote
    a piece of a connection string it cannot parse)."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return loc.redact(line) if loc is not None else line


def errors_of(kind: str) -> tuple[type[BaseException], ...]:
    if kind == "sqlite":
        return (sqlite3.Error,)
    import psycopg

    return (psycopg.Error,)


class Deadline:
    """Cuts a PostgreSQL connection whose statement went ``limit_s`` unanswered (one thread
    per connection; ``statement()`` around each statement, ``stop()`` when done)."""

    def __init__(self, raw: psycopg.Connection[TupleRow], limit_s: float) -> None:
        self.raw, self.limit_s, self.fd = raw, limit_s, raw.fileno()
        self.fired = False
        self._since: float | None = None
        self._done = False
        self._cond = threading.Condition()
        threading.Thread(target=self._watch, name="llmperf-history-deadline", daemon=True).start()

    @contextmanager
    def statement(self) -> Iterator[None]:
        with self._cond:
            self._since = time.monotonic()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._since = None

    def stop(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._done and not self.raw.closed:
                if self._since is None:
                    self._cond.wait(1.0)
                    continue
                left = self._since + self.limit_s - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.fired = True
                # the fd stays the connection's until the statement returns: it cannot return now
                with suppress(OSError), socket.socket(fileno=os.dup(self.fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                return


#: A statement's parameters, for its ``?`` placeholders in order.
SQLParams = Sequence[object]


class Cursor(Protocol):
    """What a statement gives back on either backend (sqlite3's and psycopg's cursors)."""

    def fetchone(self) -> TupleRow | None: ...

    def fetchall(self) -> list[TupleRow]: ...


class Conn:
    """A DB-API connection with ``?`` placeholders on both backends, whose waits all end."""

    def __init__(self, kind: str, raw: sqlite3.Connection | psycopg.Connection[TupleRow], loc: Location) -> None:
        self.kind, self.raw, self.loc = kind, raw, loc
        self.deadline = Deadline(raw, ANSWER_WAIT_S) if not isinstance(raw, sqlite3.Connection) else None

    def execute(self, sql: str, params: SQLParams = ()) -> Cursor:
        if self.deadline is not None:
            with self.deadline.statement():
                cur = self.raw.cursor()
                cur.execute(sql.replace("?", "%s"), tuple(params))
                return cur
        try:
            return self.raw.execute(sql, tuple(params))
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
        return self._wait_for_lock(sql, params)

    def one(self, sql: str, params: SQLParams = ()) -> TupleRow:
        """The row of a statement that returns one (``RETURNING``, ``COUNT(*)``)."""
        row = self.execute(sql, params).fetchone()
        if row is None:
            raise TypeError(f"no row from {sql.split()[0]}")
        return row

    def _wait_for_lock(self, sql: str, params: SQLParams) -> Cursor:
        """Tries until the lock is free, ``LOCK_WAIT_S`` at most: then one line naming the
        holder, lasting (the session does not wait a second time)."""
        started = time.monotonic()
        try:
            with task(f"history {self.loc.display}") as progress:  # a line every few seconds while it waits
                progress.step(f"waiting for its lock, {LOCK_WAIT_S} s at most")
                return self._tries(sql, params, started)
        except KeyboardInterrupt:
            raise HistoryInterrupted(
                f"interrupted after waiting {time.monotonic() - started:.0f} s for the history "
                f"{self.loc.display}, locked by {sqlite_holder(self.loc.target)}; nothing was written to it"
            ) from None

    def _tries(self, sql: str, params: SQLParams, started: float) -> Cursor:
        while True:
            time.sleep(SQLITE_TRY_S)
            try:
                return self.raw.execute(sql, tuple(params))
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
            if time.monotonic() - started >= LOCK_WAIT_S:
                raise LastingHistoryError(  # waited once: not again this session
                    f"the history {self.loc.display} stayed locked for {LOCK_WAIT_S} s by "
                    f"{sqlite_holder(self.loc.target)}; let that process finish (or stop it), then run again"
                )

    def failure(self, doing: str, exc: BaseException) -> HistoryError:
        """The one line of a failed statement (``doing``: "read", "write", "lock")."""
        if self.deadline is not None and self.deadline.fired:
            return HistoryError(
                f"the history {self.loc.display} did not answer within {ANSWER_WAIT_S} s, so it was not "
                f"{'read' if doing == 'read' else 'written'}; check the server and the network to it"
            )
        if self.kind == "sqlite" and _damaged(exc):
            return corrupt_history(self.loc.target, exc)
        return translated(f"cannot {doing} the history {self.loc.display}", exc, self.loc)

    def close(self) -> None:
        if self.deadline is not None:
            self.deadline.stop()
        self.raw.close()


#: SQLite's result codes SQLITE_BUSY and SQLITE_LOCKED (the sqlite3 module names them from Python 3.11).
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is None:  # Python 3.10: only the message says it
        return str(exc).startswith(("database is locked", "database table is locked"))
    return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def sqlite_holder(path: str) -> str:
    """``process 1234 (python3)``: another process holding one of SQLite's locks on ``path``,
    from ``/proc/locks`` (Linux; opening the file here to ask would drop this process's own
    locks on it); else one that has the file or its journal open (``/proc/*/fd``); else
    what may hold it where this machine cannot see."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines, st = [], None
    found = [] if st is None else [held for held in (_sqlite_lock(line.split(), st) for line in lines) if held]
    if found:
        return _process(min(found)[1])  # a writer first
    opened = _opened_by(path)
    if opened is not None:
        return _process(opened) + ", which has it open"
    return "a process this machine does not show (another container or machine sharing the file?)"


def _process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return f"process {pid} ({fh.read().strip()})"
    except OSError:
        return f"process {pid}"


#: The files beside a SQLite database that its writers hold open.
SQLITE_COMPANIONS = ("", "-journal", "-wal", "-shm")


def _opened_by(path: str) -> int | None:
    """The lowest pid of another process with ``path`` or its journal, WAL or shared-memory
    file open (``/proc/*/fd``: the processes this user may look into), else None."""
    targets = {os.path.realpath(path) + suffix for suffix in SQLITE_COMPANIONS}
    try:
        pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return None
    return next((pid for pid in pids if pid != os.getpid() and targets & _open_files(pid)), None)


def _open_files(pid: int) -> set[str]:
    """What process ``pid`` has open (none when it is gone or not ours to look into)."""
    found: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        with suppress(OSError):  # closed since the listing
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def _sqlite_lock(f: list[str], st: os.stat_result) -> tuple[bool, int] | None:
    """(not a write lock, pid) of a ``/proc/locks`` line (split) when another process holds a
    lock on the file ``st`` over SQLite's lock bytes; None for any other line (a waiter's too)."""
    if "->" in f or len(f) < 8:
        return None  # a waiter, not a holder
    try:
        major, minor, inode = f[5].split(":")
        pid, start, end = int(f[4]), int(f[6]), SQLITE_LOCK_BYTES.stop if f[7] == "EOF" else int(f[7])
        same = (int(major, 16), int(minor, 16), int(inode)) == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    except ValueError:
        return None
    ours = pid <= 0 or pid == os.getpid()
    overlaps = start < SQLITE_LOCK_BYTES.stop and end >= SQLITE_LOCK_BYTES.start
    return (f[3] != "WRITE", pid) if same and not ours and overlaps else None


def postgres_holder(conn: Conn) -> str:
    """``PostgreSQL backend 1234 (client 10.0.0.5)``: who holds the writers' advisory lock,
    read after the failed transaction is rolled back; ``another writer`` when that fails."""
    try:
        conn.execute("ROLLBACK")
        row = conn.execute(
            "SELECT a.pid, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid::bigint = ? AND l.objsubid = 1",
            (ADVISORY_LOCK,),
        ).fetchone()
    except errors_of(conn.kind):
        return "another writer"
    if not row:
        return "another writer"
    return f"PostgreSQL backend {row[0]}" + (f" (client {row[1]})" if row[1] else " (a local client)")


def connect(loc: Location, *, create: bool) -> Conn:
    """A connection to the history at ``loc``; ``create``: a SQLite file (and its folder) may be made."""
    if loc.kind == "sqlite":
        return _connect_sqlite(loc, create)
    return _connect_postgres(loc)


def _connect_sqlite(loc: Location, create: bool) -> Conn:
    """The SQLite file at ``loc``: a regular file (or none yet, when ``create``), whose header
    is read here so a file that is no database fails now, in one line."""
    path = Path(loc.target)
    if create:
        _make_folder(path.parent)
    elif not path.is_file():
        raise HistoryError(f"no history at {path}")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # none yet: SQLite creates it
    if not stat.S_ISREG(mode):
        raise HistoryError(f"{path} is {file_kind(mode)}, not a regular file; give the history file's path")
    raw = None
    try:
        raw = sqlite3.connect(str(path), timeout=SQLITE_TRY_S, isolation_level=None)
        try:
            raw.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # reads the header: a database?
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                raise  # busy: a writer holds it; the wait for it comes later, in tries
    except sqlite3.Error as exc:
        if raw is not None:
            raw.close()
        if _damaged(exc):
            raise corrupt_history(path, exc) from None
        raise translated(f"cannot open the history {path}", exc, loc) from None
    return Conn("sqlite", raw, loc)


def _connect_postgres(loc: Location) -> Conn:
    """A PostgreSQL connection (psycopg 3) to ``loc``, with a bounded connect."""
    try:
        import psycopg
    except ImportError:
        raise HistoryError(f"a PostgreSQL history needs psycopg 3: {INSTALL_POSTGRES}") from None
    try:
        pg = psycopg.connect(loc.conninfo, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
    except psycopg.Error as exc:
        raise LastingHistoryError(
            f"cannot connect to the history {loc.display}: {first_line(exc, loc)}" + _postgres_fix(exc)
        ) from None
    return Conn("postgresql", pg, loc)


def _make_folder(folder: Path) -> None:
    """The history's folder; a new ``.llmperf`` one gets a ``.gitignore`` of ``*`` (as pytest's
    cache does), so the history stays out of git unless the user removes it to keep it."""
    existed = folder.is_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not existed and folder.name == ".llmperf":
            (folder / ".gitignore").write_text("# created by pytest-llmperf: the session history stays out of git\n*\n")
    except OSError as exc:
        raise HistoryError(f"cannot create the history folder {folder}: {exc.strerror or exc}") from None


@contextmanager
def transaction(conn: Conn) -> Iterator[Conn]:
    """One writer at a time, all or nothing."""
    try:
        if conn.kind == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn.execute("BEGIN")
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_S}s'")
            with task(f"history {conn.loc.display}") as progress:  # says so if another writer holds it
                progress.step(f"waiting for its write lock, {LOCK_WAIT_S} s at most")
                conn.execute("SELECT pg_advisory_xact_lock(?)", (ADVISORY_LOCK,))
    except errors_of(conn.kind) as exc:
        if getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise LastingHistoryError(  # waited once: not again this session
                f"the history {conn.loc.display} stayed locked for {LOCK_WAIT_S} s by {postgres_holder(conn)}; "
                "let that writer finish (or stop it), then run again"
            ) from None
        raise conn.failure("lock", exc) from None
    try:
        yield conn
    except BaseException:
        with suppress(*errors_of(conn.kind)):  # a broken connection: the server drops the transaction itself
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
