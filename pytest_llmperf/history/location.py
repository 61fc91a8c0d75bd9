"""Where the session history lives: ``--llmperf-history PATH|URL|off`` > ``$LLMPERF_HISTORY`` >
ini ``llmperf_history`` > ``<rootdir>/.llmperf/history.sqlite`` (the setting is read with the
others, ``core.settings_table``; ``parse`` turns its value into a ``Location``).

A plain path is a SQLite file (stdlib, nothing to install); ``postgresql://...`` (or libpq's
``host=... dbname=...`` form) is a shared PostgreSQL database for a fleet of CI runners (``pip
install "pytest-llmperf[postgres]"``). Shown only through ``core.redact``: never a password.
Light: imported by the plugin at configure time to reject a bad value in one line.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.redact import Redactor, Url, display, is_dsn
from ..core.settings import SETTINGS

ENV: str = SETTINGS["history"].env  # also what ``llmperf history``/``detect`` read
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
        return Location("postgresql", text, source)
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


def default(rootdir: Path | str) -> Location:
    return Location("sqlite", str(Path(rootdir) / DEFAULT_DIR / DEFAULT_FILE), "default")


def for_cli(given: str | None, start: Path | None = None) -> Location:
    """The ``llmperf history/detect`` location: ``--history``, else ``$LLMPERF_HISTORY``, else
    the nearest ``.llmperf/history.sqlite`` from the current folder up."""
    if given:
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
