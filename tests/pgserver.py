"""A throw-away PostgreSQL server for the history tests: Debian's binaries (``apt-get install
postgresql``; ``.ci/run`` installs them), a fresh cluster made by ``initdb`` in a temporary
folder, started by ``pg_ctl`` on a free loopback port and stopped (and deleted) afterwards.

PostgreSQL refuses to run as root, and the tests run as root here and in CI: the cluster then
belongs to ``nobody`` and every server command runs through ``runuser -u nobody --``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

#: Set to 1 where PostgreSQL is installed on purpose (``.ci/run``): a missing server then
#: fails the PostgreSQL tests instead of skipping them.
REQUIRE_POSTGRES_ENV = "LLMPERF_REQUIRE_POSTGRES"
NO_POSTGRES = (
    "no PostgreSQL server binaries (apt-get install -y postgresql) or no psycopg (pip install psycopg[binary])"
)
START_TIMEOUT_S = 60


def bindir() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def unavailable() -> None:
    """Skip (with the reason shown) or, where PostgreSQL is required, fail."""
    if os.environ.get(REQUIRE_POSTGRES_ENV, "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{NO_POSTGRES}; {REQUIRE_POSTGRES_ENV}=1 requires it", pytrace=False)
    pytest.skip(f"{NO_POSTGRES}; {REQUIRE_POSTGRES_ENV}=1 makes this a failure")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """``with PgServer() as pg: pg.new_database()`` -> a ``postgresql://`` URL of an empty database."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.folder: Path | None = None
        self.port = _free_port()
        self.user = "llmperf"

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        return subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )

    def start(self) -> PgServer:
        assert self.bin is not None
        self.folder = Path(tempfile.mkdtemp(prefix="llmperf-pg-"))
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.folder, nobody.pw_uid, nobody.pw_gid)
        data = self.folder / "data"
        out = self._run(
            str(self.bin / "initdb"),
            "-D",
            str(data),
            "-U",
            self.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.strip() or out.stdout.strip()}")
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=40"
        )
        out = self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )
        if out.returncode != 0:
            log = (self.folder / "log").read_text(errors="replace")[-2000:] if (self.folder / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {out.stderr.strip()} {log}")
        return self

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh, empty database on this server (one per test: no test sees another's rows)."""
        import psycopg

        name = "h_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.folder is None:
            return
        if self.bin is not None and (self.folder / "data" / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
