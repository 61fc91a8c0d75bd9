"""Output paths that are not regular files (issue 34, point 1): a report is never renamed over
what is there.

``core.documents.write_output`` is the one writer of every output a user names
(``--llmperf-json``/``-markdown``/``-html``, ``llmperf report -o``, ``profile -o``,
``history --html``). Before, each wrote a temporary file and renamed it over the path: run as
root, ``--llmperf-markdown=/dev/full`` replaced the system's ``/dev/full`` by a regular file,
exit 0, nothing printed, and ``--llmperf-json=/dev/stdout`` into a pipe failed.

Each case asserts the exit status, the one line (or none), that the path is what it was (a
device keeps its device numbers, a FIFO stays a FIFO, a link stays a link) and that no
temporary file is left. The devices are this test's own nodes in ``tmp_path`` (``os.mknod``,
as root; skipped where that is not permitted), never the system's ``/dev/full`` or
``/dev/null``, so a regressed writer replaces nothing of the machine's.
"""

from __future__ import annotations

import os
import select
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from inner import run
from test_hostile import server, session_file  # noqa: F401  (the fake streaming server)

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.documents import write_output

CHECKOUT = Path(__file__).resolve().parent.parent
FULL, NULL = os.makedev(1, 7), os.makedev(1, 3)  # Linux's /dev/full and /dev/null
NO_SPACE = "No space left on device"
NO_READER = "no process is reading this FIFO; start its reader first"
IS_DIR = "it is a directory; give a file path, a character device, a FIFO or - (standard output)"
#: The bound of one command on a busy 2-core VM (imports of numpy, scipy, matplotlib included).
SECONDS = 60


def device(path: Path, number: int) -> Path:
    """Our own character device node at ``path`` (the same driver as /dev/full or /dev/null)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, number)
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    return path


def shape(path: Path) -> tuple:
    """What must not change: the kind of each thing on the way (a link, its target) and a
    device's numbers."""
    out: list = []
    while path.is_symlink():
        out.append(("link", os.readlink(path)))
        path = path.parent / os.readlink(path)
    st = os.lstat(path)
    out.append((stat.S_IFMT(st.st_mode), st.st_rdev))
    return tuple(out)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or "llmperf-check" in p.name)


@contextmanager
def reader(path: Path) -> Iterator[list[bytes]]:
    """A FIFO at ``path`` with a reader that keeps all it reads. The reader's end is open before
    this yields (a writer that came first would fail: no reader), however slowly its thread runs."""
    os.mkfifo(path)
    got: list[bytes] = []
    ready, stop = threading.Event(), threading.Event()

    def read() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opens at once, writer or not
        ready.set()
        chunks: list[bytes] = []
        deadline = time.monotonic() + SECONDS
        try:
            while time.monotonic() < deadline:
                select.select([fd], [], [], 0.05)
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:  # a writer, nothing written yet
                    continue
                if chunk:
                    chunks.append(chunk)
                elif chunks or stop.is_set():  # the end, after the writer's bytes (or no writer came)
                    break
                else:  # no writer yet: a FIFO without one reads as its end
                    time.sleep(0.01)
        finally:
            os.close(fd)
            got.append(b"".join(chunks))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert ready.wait(SECONDS), "the FIFO's reader did not open it"
    try:
        yield got
    finally:
        stop.set()  # the writer is done: the reader drains what is left and ends
        thread.join(SECONDS)


# -- the writer itself ----------------------------------------------------------------------------


def test_writer_writes_a_device_in_place_and_names_its_error(tmp_path: Path) -> None:
    full, null = device(tmp_path / "full", FULL), device(tmp_path / "null", NULL)
    (tmp_path / "to-null").symlink_to("null")
    before = {p: shape(p) for p in (full, null, tmp_path / "to-null")}
    assert write_output(null, "x" * 100_000) == "in place"
    assert write_output(tmp_path / "to-null", "x") == "in place"
    with pytest.raises(OSError) as raised:
        write_output(full, "x")
    assert raised.value.strerror == NO_SPACE
    assert {p: shape(p) for p in before} == before
    assert leftovers(tmp_path) == []


def test_writer_keeps_regular_files_atomic_and_links_links(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    assert write_output(tmp_path / "link.json", "new") == "file"
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == "new"
    assert write_output(tmp_path / "new" / "folder" / "r.json", "made") == "file"
    assert (tmp_path / "new" / "folder" / "r.json").read_text() == "made"
    with pytest.raises(IsADirectoryError) as raised:
        write_output(tmp_path / "new", "x")
    assert raised.value.strerror == IS_DIR
    assert leftovers(tmp_path) == []


def test_writer_dash_is_standard_output(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert write_output("-", "to stdout\n") == "stdout"
    assert capsys.readouterr().out == "to stdout\n"
    assert list(tmp_path.iterdir()) == []  # no file named "-"


# -- llmperf report -o: every kind of path --------------------------------------------------------


def _link(t: Path, to: str) -> Path:
    (t / "r.html").symlink_to(to)
    return t / "r.html"


def _fifo(t: Path) -> Path:
    os.mkfifo(t / "fifo")
    return t / "fifo"


def _folder(t: Path) -> Path:
    (t / "dir").mkdir()
    return t / "dir"


def _in_a_file(t: Path) -> Path:
    (t / "afile").write_text("a file")
    return t / "afile" / "r.html"


def _to_a_file(t: Path) -> Path:
    (t / "old.html").write_text("old")
    return _link(t, "old.html")


REPORT_CASES: list[tuple[str, Callable[[Path], Path], int, str | None]] = [
    # (id, make the path under tmp_path, exit status, the error after "cannot write PATH: ")
    ("own-dev-full", lambda t: device(t / "full", FULL), 2, NO_SPACE),
    ("own-dev-null", lambda t: device(t / "null", NULL), 0, None),
    ("symlink-to-own-dev-null", lambda t: _link(t, device(t / "null", NULL).name), 0, None),
    ("symlink-to-own-dev-full", lambda t: _link(t, device(t / "full", FULL).name), 2, NO_SPACE),
    ("fifo-with-reader", lambda t: t / "fifo", 0, None),  # made with its reader by the test
    ("fifo-without-reader", _fifo, 2, NO_READER),
    ("directory", _folder, 2, IS_DIR),
    ("missing-folder", lambda t: t / "not" / "yet" / "r.html", 0, None),
    ("file-in-folder-path", _in_a_file, 2, "Not a directory"),
    ("symlink-to-a-file", _to_a_file, 0, None),
]


@pytest.mark.parametrize(("name", "make", "status", "error"), REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report_output_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], name, make, status, error) -> None:
    pytest.importorskip("matplotlib")
    session = session_file(tmp_path / "session.json", ["t_a"])
    work = tmp_path / "work"
    work.mkdir()
    path = make(work)
    with reader(path) if name == "fifo-with-reader" else _nothing() as got:
        before = shape(path) if os.path.lexists(path) else None
        code = cli_main(["report", session, "-o", str(path)])
        after = shape(path) if os.path.lexists(path) else None
    out, err = capsys.readouterr()
    assert code == status, err
    if error is None:
        assert err == "" and out.strip() == f"{path}: 1 measurement(s)"
    else:
        assert err.strip() == f"llmperf: error: cannot write {path}: {error}" and out == ""
    if before is not None:
        assert after == before  # a device, FIFO, directory or link stays what it was
    if name == "fifo-with-reader":
        assert got and got[0].startswith(b"<!DOCTYPE html>")
    if name == "symlink-to-a-file":
        assert (work / "old.html").read_text().startswith("<!DOCTYPE html>")  # the target, through the link
    if name == "missing-folder":
        assert path.read_text().startswith("<!DOCTYPE html>")
    if name == "file-in-folder-path":
        assert (work / "afile").read_text() == "a file"
    assert "Traceback" not in out + err and leftovers(tmp_path) == []


@contextmanager
def _nothing() -> Iterator[list[bytes]]:
    yield []


def command(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The command with its stdout a pipe, as in ``llmperf report -o - | gzip``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, *argv],
        check=False,
        capture_output=True,
        timeout=SECONDS,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("target", ["-", "/dev/stdout"])
def test_report_to_standard_output_in_a_pipe(tmp_path: Path, target: str) -> None:
    pytest.importorskip("matplotlib")
    session = session_file(tmp_path / "session.json", ["t_a"])
    out = command("-m", "pytest_llmperf.cli", "report", session, "-o", target, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b"<!DOCTYPE html>") and out.stdout.rstrip().endswith(b"</html>")
    assert out.stderr.decode().strip() == f"{target}: 1 measurement(s)"  # the count, out of the page's way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]  # no file "-", no temporary file


# -- the pytest session's reports -----------------------------------------------------------------

INNER = (
    "import pytest\n\n@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, warmup=0)\ndef test_a():\n    pass\n"
)


@pytest.mark.parametrize("option", ["--llmperf-markdown", "--llmperf-json", "--llmperf-html"])
def test_session_report_on_a_full_device(pytester: pytest.Pytester, server: str, option: str) -> None:
    """The example of the issue: ``--llmperf-markdown=/dev/full`` (here our own node)."""
    if option == "--llmperf-html":
        pytest.importorskip("matplotlib")
    pytester.makepyfile(test_inner=INNER)
    full = device(pytester.path / "full", FULL)
    before = shape(full)
    result = run(pytester, f"--llmperf-endpoint={server}/ok/v1", "--llmperf-history=off", f"{option}={full}")
    output = result.stdout.str() + result.stderr.str()
    line = f"llmperf: cannot write {full}: {NO_SPACE}"
    assert result.ret != 0 and output.count(line) == 1, output
    assert "llmperf: 1 report file(s) not written: the session fails" in output
    assert "Traceback" not in output and shape(full) == before
    assert leftovers(pytester.path) == []


def test_session_reports_into_a_null_device_a_fifo_and_a_link(pytester: pytest.Pytester, server: str) -> None:
    pytester.makepyfile(test_inner=INNER)
    null = device(pytester.path / "null", NULL)
    (pytester.path / "md-link").symlink_to("null")
    things = [null, pytester.path / "md-link", pytester.path / "fifo"]
    with reader(pytester.path / "fifo") as got:
        before = [shape(p) for p in things]
        result = run(
            pytester,
            f"--llmperf-endpoint={server}/ok/v1",
            "--llmperf-history=off",
            f"--llmperf-json={null}",
            f"--llmperf-markdown={pytester.path / 'md-link'}",
            f"--llmperf-json={pytester.path / 'fifo'}",  # the last one given counts
        )
        after = [shape(p) for p in things]
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    assert "cannot write" not in output and "Traceback" not in output
    assert output.count("--llmperf-json is given twice") == 1, output  # named, once
    assert after == before
    assert got and got[0].startswith(b"{") and b'"results"' in got[0]
    assert leftovers(pytester.path) == []


@pytest.mark.parametrize("target", ["-", "/dev/stdout"])
def test_session_json_to_standard_output_in_a_pipe(tmp_path: Path, server: str, target: str) -> None:
    """Before: /dev/stdout into a pipe failed the session ("No such file or directory")."""
    (tmp_path / "test_inner.py").write_text(INNER)
    out = command(
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:terminal",
        f"--llmperf-endpoint={server}/ok/v1",
        "--llmperf-history=off",
        f"--llmperf-json={target}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    data = json.loads(out.stdout)
    assert [r["test"] for r in data["results"]] == ["test_inner.py::test_a"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "baselines") == ["test_inner.py"]
