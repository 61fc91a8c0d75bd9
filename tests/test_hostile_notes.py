"""Identity, leftovers and messages (issue 34, classes 4 and 5): each case is a real inner
pytest session (or a unit of the layer that says it) asserting the one line, printed once; the
exit status; the files left as they were; and no process or temporary file left behind.

Class 4: two same-named modules outside the rootdir are two tests in the history too; a pytest
killed by SIGTERM or SIGKILL mid-run leaves no engine worker and no worker log in $TMPDIR.
Class 5: a stream with no token, ``baselines`` a file, a session whose every measurement
failed, an n_ctx whose KV cache does not fit, an unreachable PostgreSQL history, gpu_layers on
a CPU-only build, test ids holding ``|`` or a line break in the Markdown tables.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakeserver import Streaming, serving
from inner import run

from pytest_llmperf.engines.llama_cpp_native import gpu_offload_missing
from pytest_llmperf.measuring.worker import FAULT_ENV
from pytest_llmperf.reports.session_file import md_cell, md_code

MODULE = "test_inner.py"
MARKED = """
import pytest

@pytest.mark.llmperf({marker})
def test_a(llmperf):
    pass
"""
WORKLOAD = "prompt_tokens=4, max_tokens=8, runs=3, warmup=0"
STEADY = WORKLOAD + ", max_runs=3, threshold=9, tail_threshold=9"  # a busy machine fails nothing
DIR = "--llmperf-baseline-dir=baselines"
UPDATE = "--llmperf-update-baselines"


def once(output: str, text: str) -> None:
    assert output.count(text) == 1, output
    assert "Traceback" not in output and "During handling" not in output, output


def output_of(result: pytest.RunResult) -> str:
    return result.stdout.str() + result.stderr.str()


# -- class 4: identity -------------------------------------------------------------------------


def test_same_named_modules_outside_the_rootdir_are_two_tests_in_the_history(pytester: pytest.Pytester) -> None:
    root = pytester.path
    for name, tokens in (("a", 8), ("b", 9)):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        (root / name / "test_x.py").write_text(
            MARKED.format(
                marker=f"prompt_tokens=4, max_tokens={tokens}, runs=3, warmup=0, threshold=9, tail_threshold=9"
            )
        )
    (root / "ci").mkdir()
    args = (f"--rootdir={root}/ci", DIR, f"--llmperf-history={root}/h.sqlite", "a", "b")
    assert run(pytester, *args, UPDATE).ret == 0
    result = run(pytester, *args)
    assert result.ret == 0, output_of(result)
    with sqlite3.connect(root / "h.sqlite") as db:
        rows = db.execute("SELECT test, workload FROM llmperf_measurements ORDER BY id").fetchall()
    tests = {t: set() for t, _ in rows}
    for t, w in rows:
        tests[t].add(json.loads(w)["max_tokens"])
    assert tests == {"../a/test_x.py::test_a": {8}, "../b/test_x.py::test_a": {9}}, rows
    assert len(rows) == 4  # two sessions of each


# -- class 4: leftovers of a killed pytest ------------------------------------------------------

SLEEPER = """
import time
from pathlib import Path
import pytest

@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, warmup=0)
def test_a(llmperf):
    llmperf.measure()
    Path("measured").write_text("")
    time.sleep(120)
"""


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_session_leaves_no_worker_and_no_log(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / MODULE).write_text(SLEEPER)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "LLMPERF_HISTORY": "off"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--rootdir={tmp_path}", DIR, "-q"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "measured").exists():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "the inner session never measured"
            time.sleep(0.2)
        workers = descendants(proc.pid)
        assert workers, "no engine worker was started"
        assert [p for p in tmpdir.iterdir() if p.name.startswith("llmperf-worker-")] == []  # none, even now
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in workers if alive(p)], "a worker outlived the killed session"
    assert sorted(p.name for p in tmpdir.iterdir() if "llmperf" in p.name) == []


# -- class 5: messages ---------------------------------------------------------------------------

STOP = threading.Event()


class NoToken(Streaming):
    """A stream that ends with [DONE] before any token."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._start_stream()
        self._chunk(b"data: [DONE]\n\n")
        self._end()


def test_a_stream_with_no_token_says_the_server_sent_none(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=MARKED.format(marker=WORKLOAD))
    with serving(NoToken, STOP) as url:
        result = run(pytester, "-rN", f"--llmperf-endpoint={url}/v1", DIR)
    output = output_of(result)
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    once(output, "sent no token: the stream ended with [DONE] before any")
    assert "ignore_eos" not in output


@pytest.mark.parametrize("update", [False, True], ids=["compare", "update"])
def test_baselines_a_regular_file_is_named_as_such(pytester: pytest.Pytester, update: bool) -> None:
    pytester.makepyfile(test_inner=MARKED.format(marker=WORKLOAD))
    folder = pytester.path / "baselines"
    folder.write_text("not a folder")
    result = run(pytester, "-rN", DIR, *([UPDATE] if update else []))
    output = output_of(result)
    assert result.ret == 1, output
    once(output, f"{folder} is a file, not a folder; move it aside (mv {folder} {folder}.old)")
    assert "Errno 20" not in output and "File exists" not in output
    assert folder.read_text() == "not a folder"


def test_every_measurement_failed_still_writes_the_markdown(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "run:SIGSEGV")
    summary = pytester.path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(test_inner=MARKED.format(marker=WORKLOAD))
    result = run(pytester, "-rN", DIR, "--llmperf-markdown=summary.md")
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    for path in (pytester.path / "summary.md", summary):
        assert "every llmperf measurement of this session failed (1 planned, none measured)" in path.read_text()


def test_an_n_ctx_whose_kv_cache_does_not_fit_says_its_size(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=MARKED.format(marker=WORKLOAD + ", n_ctx=16777216"))
    result = run(pytester, "-rN", DIR)
    output = output_of(result)
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    once(output, "but could not allocate its KV cache of 64.0 GiB for n_ctx 16777216, and ")
    assert "of memory is available; lower n_ctx" in output and "Failed to create llama_context" not in output


def test_an_unreachable_postgresql_history_is_said_once(pytester: pytest.Pytester) -> None:
    pytest.importorskip("psycopg")
    pytester.makepyfile(test_inner=MARKED.format(marker=STEADY))
    assert run(pytester, DIR, UPDATE, "--llmperf-history=off").ret == 0
    url = "postgresql://llmperf@127.0.0.1:1/nowhere"  # port 1: refused at once
    for args in ((), (UPDATE,)):  # compare (a read, then the write) and update (the write)
        result = run(pytester, "-rN", DIR, f"--llmperf-history={url}", *args)
        output = output_of(result)
        assert result.ret == 0, output
        once(output, "cannot connect to the history postgresql://llmperf@127.0.0.1:1/nowhere")


def test_gpu_layers_on_a_cpu_only_build_is_said_once(pytester: pytest.Pytester) -> None:
    if not gpu_offload_missing():
        pytest.skip("this llama.cpp build has GPU offload")
    pytester.makepyfile(test_inner=MARKED.format(marker=WORKLOAD + ", gpu_layers=99"))
    result = run(pytester, "-rN", DIR)
    output = output_of(result)
    assert result.ret == 0, output
    once(output, "test_inner.py::test_a: marker gpu_layers=99: this llama.cpp build has no GPU offload")
    assert "0 layers are offloaded" in output


PIPES = """
import pytest

@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, warmup=0)
@pytest.mark.parametrize("v", [1, 2], ids=["a|b", "c`d|"])
def test_a(llmperf, v):
    pass
"""


def cells(row: str) -> int:
    """The cells of a Markdown table row: its unescaped ``|`` less one."""
    return row.replace("\\|", "").count("|") - 1


def test_test_ids_with_pipes_keep_the_markdown_tables_whole(pytester: pytest.Pytester, monkeypatch) -> None:
    summary = pytester.path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(test_inner=PIPES)
    result = run(pytester, "-rN", DIR, "--llmperf-markdown=summary.md")
    assert result.ret == 0, output_of(result)
    for path in (pytester.path / "summary.md", summary):
        table = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
        assert len({cells(ln) for ln in table}) == 1, table
        assert any("a\\|b" in ln for ln in table) and any("c`d\\|" in ln for ln in table), table


def test_markdown_cells_hold_line_breaks_pipes_and_backticks() -> None:
    assert md_cell("t.py::test_a[c\nd|e]") == "t.py::test_a[c\\nd\\|e]"
    assert md_code("a`b") == "``a`b``" and md_code("`a") == "`` `a ``"
    assert "\n" not in md_code("x\r\ny")
