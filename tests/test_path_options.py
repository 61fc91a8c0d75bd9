"""Every option that takes a path or a URL, and every output path of every command (issue 47,
points 5 and 6): the empty, malformed and unreachable forms are one line each, before anything
runs, and an output path is checked as the report paths are (``core.documents``: a device or a
FIFO written in place, an existing file replaced whole, a directory, a file in the way of its
folders or an empty value refused).

Before: ``--llmperf-json=`` (and ``-markdown``/``-html``) wrote nothing, silently;
``--llmperf-endpoint=`` measured llama.cpp in process instead; ``--llmperf-against=`` measured
one side; a malformed endpoint failed every test, a malformed PostgreSQL URL was found after
the tests had run; ``llmperf history --csv PATH`` on a file, a FIFO or a device was a traceback.

The settings are found in the settings table (``core.settings.SETTINGS``) by their parser or
their metavar, so a new path or URL option is covered here without a line of this file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from inner import run
from test_hostile_outputs import FULL, NULL, device, leftovers, shape
from test_hostile_waits import seeded_history

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.settings import PATH_PARSERS, SETTINGS, Setting
from pytest_llmperf.session.options import SessionSettings

#: Metavar words of a value that is a path or a URL.
PATH_WORDS = ("PATH", "FILE", "DIR", "URL", "REF")


def path_settings() -> list[Setting]:
    return [s for s in SETTINGS.values() if s.parse in PATH_PARSERS or any(w in (s.metavar or "") for w in PATH_WORDS)]


def test_every_path_or_url_setting_has_a_path_parser() -> None:
    """A setting whose metavar says path or URL is parsed by one of ``PATH_PARSERS`` (a new
    one with a plain text parser fails here), and there are such settings to check."""
    found = path_settings()
    assert {s.name for s in found} >= {"model", "endpoint", "against", "json", "markdown", "html", "history"}
    assert [s.name for s in found if s.parse not in PATH_PARSERS] == []


@pytest.mark.parametrize("setting", path_settings(), ids=lambda s: s.name)
@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "blank"])
def test_an_empty_path_or_url_is_one_line_before_anything_runs(
    pytester: pytest.Pytester, setting: Setting, value: str
) -> None:
    with pytest.raises(ValueError, match=r"^is empty\b.*; give ") as raised:
        setting.parse(value)
    assert "\n" not in str(raised.value)
    pytester.makepyfile(test_inner="def test_a():\n    raise AssertionError('ran')\n")
    result = run(pytester, f"{setting.option}={value}")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert f"error: argument {setting.option}: {raised.value}" in err
    assert "ran" not in result.stdout.str() and "Traceback" not in err


ENDPOINT_CASES = [
    ("not-a-url", "notaurl", "'notaurl' is not an http(s) URL; give the server's API base URL"),
    ("another-scheme", "ftp://h/v1", "'ftp://h/v1' is not an http(s) URL; give the server's API base URL"),
    ("no-host", "http://", "'http://' names no host; give the server's API base URL"),
    ("no-host-a-path", "http:///v1", "'http:///v1' names no host; give the server's API base URL"),
    (
        "a-port-not-a-number",
        "http://h:port/v1",
        "'http://h:port/v1' is not a valid URL (Port could not be cast to integer value as 'port'); give the",
    ),
    ("a-secret-in-it", "http://user:s3cret@", "'http://user:***@' names no host; give the server's API base URL"),
]


@pytest.mark.parametrize(("name", "value", "line"), ENDPOINT_CASES, ids=[c[0] for c in ENDPOINT_CASES])
def test_a_malformed_endpoint_is_one_line(pytester: pytest.Pytester, name: str, value: str, line: str) -> None:
    """Before: each test failed with the line, or (``http://``) with httpx's words."""
    pytester.makepyfile(test_inner="def test_a():\n    raise AssertionError('ran')\n")
    result = run(pytester, f"--llmperf-endpoint={value}")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and f"argument --llmperf-endpoint: {line}" in err, err
    assert "s3cret" not in err and "Traceback" not in err


def test_a_well_formed_endpoint_is_taken() -> None:
    for url in ("http://127.0.0.1:8000/v1", "https://api.example.org/v1?key=x", "http://[::1]:8080"):
        assert SETTINGS["endpoint"].parse(url) == url


HISTORY_CASES = [
    (
        "unclosed-ipv6",
        "postgresql://[bad",
        "'postgresql://[bad' is not a valid PostgreSQL location (end of string reached when looking for matching "
        '"]" in IPv6 host address in URI: "postgresql://[bad")',
    ),
    (
        "a-port-not-a-number",
        "postgresql://ci:s3cret@db:port/perf",
        "'postgresql://ci:***@db:port/perf' is not a valid PostgreSQL location (port 'port' is not a number from 1 "
        "to 65535)",
    ),
    (
        "keywords-without-a-value",
        "host=db dbname",
        '\'host=db dbname\' is not a valid PostgreSQL location (missing "=" after "dbname" in connection info string)',
    ),
    (
        "keywords-with-a-broken-password",
        "host=127.0.0.1 port=1 dbname=d user=u password=s3cretZq7Kx9wQa s3cretZq7Kx9wQb",
        "'host=127.0.0.1 port=1 dbname=d user=u password=***' is not a valid PostgreSQL location (missing \"=\" "
        'after "***" in connection info string)',
    ),
    (
        "another-scheme",
        "mysql://u:s3cret@h/db",
        "'mysql://u:***@h/db' is not a supported history location; give a SQLite file path, a postgresql:// URL or off",
    ),
]


@pytest.mark.parametrize(("name", "value", "line"), HISTORY_CASES, ids=[c[0] for c in HISTORY_CASES])
def test_a_malformed_history_location_is_one_line_before_anything_runs(
    pytester: pytest.Pytester, name: str, value: str, line: str
) -> None:
    """Before: a malformed PostgreSQL URL was found at the end of the session."""
    if value.startswith(("postgresql", "host=")):
        pytest.importorskip("psycopg")
    with pytest.raises(ConfigError) as raised:
        SessionSettings.of(pytester.path, history=value)
    assert str(raised.value).startswith(f"--llmperf-history: {line}") and "s3cret" not in str(raised.value)
    pytester.makepyfile(test_inner="def test_a():\n    raise AssertionError('ran')\n")
    result = run(pytester, f"--llmperf-history={value}")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret != 0 and output.count(line) == 1 and "ran" not in output, output
    assert "s3cret" not in output and "Traceback" not in output


def test_the_cli_history_option_refuses_an_empty_value(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``--history ""`` was taken for no option (the nearest history was read instead)."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(["history", "--history", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "llmperf history: error: argument --history: is empty; give a SQLite file path, a postgresql:// URL or off "
        "(see llmperf history --help)"
    )


# -- output paths of the session: checked before anything runs --------------------------------------


def _dir(t: Path) -> Path:
    (t / "out").mkdir()
    return t / "out"


def _in_a_file(t: Path) -> Path:
    (t / "afile").write_text("a file")
    return t / "afile" / "r.out"


SESSION_OUTPUT_CASES = [
    ("directory", _dir, "it is a directory; give a file path, a character device, a FIFO or - (standard output)"),
    ("file-in-folder-path", _in_a_file, "Not a directory; give it a writable path"),
]


@pytest.mark.parametrize("option", ["--llmperf-json", "--llmperf-markdown", "--llmperf-html"])
@pytest.mark.parametrize(("name", "make", "reason"), SESSION_OUTPUT_CASES, ids=[c[0] for c in SESSION_OUTPUT_CASES])
def test_a_session_output_that_cannot_be_written_is_refused_first(
    pytester: pytest.Pytester, option: str, name: str, make, reason: str
) -> None:
    """Before: the session measured every test, then could not write its report."""
    path = make(pytester.path)
    before = shape(path) if path.exists() else None
    pytester.makepyfile(test_inner="def test_a():\n    raise AssertionError('ran')\n")
    result = run(pytester, f"{option}={path}")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret != 0 and output.count(f"{option}: cannot write {path}: {reason}") == 1, output
    assert "ran" not in output and "Traceback" not in output
    assert (shape(path) if path.exists() else None) == before and leftovers(pytester.path) == []


# -- output paths of the llmperf commands -----------------------------------------------------------


def _history(t: Path) -> Path:
    return seeded_history(t / "h" / "history.sqlite")


#: (id, the command's argv with OUT where the output goes, its flag as the argparse line names it)
COMMANDS = [
    ("report-o", lambda t: ["report", str(t / "missing-session.json"), "-o", "OUT"], "-o/--output"),
    ("profile-o", lambda t: ["profile", "tiny", "--runs", "50", "-o", "OUT"], "-o/--output"),
    ("history-html", lambda t: ["history", "--history", str(_history(t)), "--html", "OUT"], "--html"),
    ("history-csv", lambda t: ["history", "--history", str(_history(t)), "--csv", "OUT"], "--csv"),
]


def _argv(make, t: Path, out: str) -> list[str]:
    return [out if a == "OUT" else a for a in make(t)]


@pytest.mark.parametrize(("name", "make", "flag"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_an_empty_output_of_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], name, make, flag) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(_argv(make, tmp_path, ""))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"error: argument {flag}: is empty; give " in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("name", "make", "flag"), COMMANDS[1:], ids=[c[0] for c in COMMANDS[1:]])
def test_an_output_in_a_file_s_folder_path_is_refused_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name, make, flag
) -> None:
    (tmp_path / "afile").write_text("a file")
    out = tmp_path / "afile" / "out"
    assert cli_main(_argv(make, tmp_path, str(out))) == 2
    _, err = capsys.readouterr()
    short = flag.split("/")[0]
    assert err.strip() == f"llmperf: error: cannot write {out}: Not a directory; give {short} a writable path"
    assert (tmp_path / "afile").read_text() == "a file"


def _regular(t: Path) -> Path:
    (t / "export").write_text("someone's file")
    return t / "export"


def _fifo(t: Path) -> Path:
    os.mkfifo(t / "export")
    return t / "export"


CSV_CASES = [
    ("existing-file", _regular, "a regular file"),
    ("fifo", _fifo, "a FIFO (named pipe)"),
    ("own-dev-null", lambda t: device(t / "export", NULL), "a character device"),
    ("own-dev-full", lambda t: device(t / "export", FULL), "a character device"),
]


@pytest.mark.parametrize(("name", "make", "kind"), CSV_CASES, ids=[c[0] for c in CSV_CASES])
def test_history_csv_into_something_not_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, make, kind: str
) -> None:
    """Before: a traceback (``FileExistsError``) after the history was read."""
    db = _history(tmp_path)
    path = make(tmp_path)
    before = shape(path)
    assert cli_main(["history", "--history", str(db), "--csv", str(path)]) == 2
    out, err = capsys.readouterr()
    assert (
        err.strip()
        == f"llmperf: error: cannot write {path}: it is {kind}, not a folder; give a folder (made when missing)"
    )
    assert out == "" and shape(path) == before and leftovers(tmp_path) == []
    if stat.S_ISREG(os.lstat(path).st_mode):
        assert path.read_text() == "someone's file"


def test_history_csv_again_replaces_its_own_files_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the report paths: an existing file is replaced whole (atomically), a missing folder made."""
    db = _history(tmp_path)
    folder = tmp_path / "new" / "export"
    for _ in range(2):
        assert cli_main(["history", "--history", str(db), "--csv", str(folder)]) == 0
    files = sorted(p.name for p in folder.iterdir())
    assert "otava.yaml" in files and any(f.endswith(".csv") for f in files) and leftovers(tmp_path) == []
    assert "Traceback" not in capsys.readouterr().err


#: Every path argument a command reads (an input, a model), empty: (argv, the argument as named).
INPUTS = [
    (["compare", "", "b.json"], "base", "the path of a session report"),
    (["compare", "a.json", ""], "new", "the path of a session report"),
    (["report", ""], "session", "the path of a session report"),
    (["profile", ""], "model", "a GGUF path or a preset"),
    (["load", "--serve", ""], "--serve", "a GGUF path or a preset"),
    (["load", "--endpoint", ""], "--endpoint", "the server's API base URL"),
    (["detect", "--history", ""], "--history", "a SQLite file path"),
    (["calibrate", "--history", ""], "--history", "a SQLite file path"),
]


@pytest.mark.parametrize(("argv", "name", "give"), INPUTS, ids=[" ".join(c[0][:2]) for c in INPUTS])
def test_an_empty_path_argument_of_a_command(capsys: pytest.CaptureFixture[str], argv, name, give) -> None:
    """Before: ``compare ""`` read the current folder (". is a directory"), ``profile ""``
    profiled the default preset, ``load --serve ""`` asked for an endpoint."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert f"error: argument {name}: is empty; give {give}" in err
