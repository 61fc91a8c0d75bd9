"""Building llama.cpp's own tools: what a user sees when it cannot work (one line, with the
build log's path), and that the real build's binaries are what ``tool_path`` returns."""

from __future__ import annotations

import fcntl
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from pytest_llmperf.cli import main
from pytest_llmperf.core.errors import ToolBuildError
from pytest_llmperf.engines import servers as native_tools


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _sdist(path: Path, cmakelists: str) -> Path:
    """A stand-in sdist: the layout of llama-cpp-python's, with our CMakeLists.txt."""
    with tarfile.open(path, "w:gz") as tar:
        data = cmakelists.encode()
        info = tarfile.TarInfo("llama_cpp_python-0.0.0/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_unknown_tool_and_not_built(empty_cache):
    with pytest.raises(ToolBuildError, match="unknown llama.cpp tool 'llama-cli'"):
        native_tools.tool_path("llama-cli")
    with pytest.raises(
        ToolBuildError, match=r"llama-server is not built for llama-cpp-python .*run `llmperf server build`"
    ):
        native_tools.tool_path("llama-server", build=False)


def test_no_cmake_is_one_line(empty_cache, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(empty_cache))  # nothing on it
    assert main(["server", "build"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "llmperf: error: cmake not found: building llama-server needs cmake and a C++ compiler "
        "(apt-get install cmake g++, or pip install cmake)"
    ]


def test_a_failing_build_names_its_log(empty_cache, tmp_path, monkeypatch):
    sdist = _sdist(tmp_path / "fake.tar.gz", 'cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "boom")\n')
    monkeypatch.setenv(native_tools.SDIST_ENV, str(sdist))
    with pytest.raises(ToolBuildError) as exc:
        native_tools.tool_path("llama-bench")
    log = native_tools.tools_root() / "build.log"
    assert str(exc.value) == f"configuring llama.cpp failed (exit status 1); see {log}"
    assert "boom" in log.read_text()
    assert not (native_tools.tools_root() / "build" / native_tools.STAMP).exists()


def test_a_second_process_waits_for_the_lock(empty_cache, monkeypatch):
    monkeypatch.setattr(native_tools, "LOCK_TIMEOUT_S", 1.5)
    root = native_tools.tools_root()
    root.mkdir(parents=True)
    said = []
    with (root / ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ToolBuildError, match="waited 2 s for another process's llama.cpp build"):
            native_tools.build_tools(progress=said.append)
    assert said and "another process is building" in said[0]


def test_built_tools_run(llama_server_binary):
    """The real build (once per version, cached; tests/conftest.py): both tools start."""
    bench = native_tools.tool_path("llama-bench", build=False)
    assert bench.parent == llama_server_binary.parent
    for binary in (llama_server_binary, bench):
        out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr[-500:]
    assert (
        "--parallel"
        in subprocess.run(
            [str(llama_server_binary), "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )


SLOW_CONFIGURE = """cmake_minimum_required(VERSION 3.14)
project(slow NONE)
execute_process(COMMAND sh -c "echo $$ > ${CMAKE_BINARY_DIR}/../sleeper.pid; exec sleep 120")
"""

BUILDER = "from pytest_llmperf.engines.servers import build_tools; build_tools()"


def test_a_stopped_build_leaves_no_process(empty_cache, tmp_path, monkeypatch):
    """SIGTERM (a CI job cancelled, `timeout`) kills the build's whole process group."""
    import os
    import signal
    import sys
    import time

    sdist = _sdist(tmp_path / "slow.tar.gz", SLOW_CONFIGURE)
    monkeypatch.setenv(native_tools.SDIST_ENV, str(sdist))
    proc = subprocess.Popen([sys.executable, "-c", BUILDER], stderr=subprocess.PIPE, text=True)
    pid_file = native_tools.tools_root() / "sleeper.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    sleeper = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(sleeper, signal.SIGKILL)
    pytest.fail("the build's child outlived the stopped build")


def _teller_lines(monkeypatch, script: str, tmp_path: Path, status: list[str] | None = None) -> list[str]:
    """The lines ``_step`` tells while ``script`` (Python) runs and writes into the build log."""
    import sys

    monkeypatch.setattr(native_tools, "POLL_S", 0.05)
    monkeypatch.setattr(native_tools, "LINE_S", 0.0)
    monkeypatch.setattr(native_tools, "SILENCE_S", 0.3)
    monkeypatch.setattr(native_tools, "STATUS_S", 0.0)
    said: list[str] = []
    tell = native_tools._Teller(said.append, status.append if status is not None else None)
    log = tmp_path / "build.log"
    with log.open("w") as out:
        native_tools._step([sys.executable, "-c", script], out, log, "building", 60, tell)
    return said


MAKE_LIKE = """import sys, time
for line in ("[  5%] Building a", "[ 45%] Building b", "[100%] Built target c"):
    print(line, flush=True)
    time.sleep(1.0)
"""


def test_a_build_tells_its_percentage_from_the_log(monkeypatch, tmp_path):
    """make's `[ 45%]` lines become the build's progress lines, in order, never going back."""
    said = _teller_lines(monkeypatch, MAKE_LIKE, tmp_path)
    percents = [int(m.group(1)) for m in (re.search(r": (\d+)% \(", line) for line in said) if m]
    assert percents and percents == sorted(percents), said
    assert {5, 45} <= set(percents), said
    assert all(line.startswith("llmperf: building llama.cpp: ") and "s so far)" in line for line in said), said


def test_a_silent_build_step_still_says_something(monkeypatch, tmp_path):
    """A step that writes nothing (a download, a long compile) is told as running all the same."""
    said = _teller_lines(monkeypatch, "import time; time.sleep(1.5)", tmp_path)
    assert said and all(line.startswith("llmperf: still building llama.cpp (") for line in said), said


def test_ninja_counts_are_percentages_too(monkeypatch, tmp_path):
    script = "import time\nprint('[3/4] Building CXX object x.o', flush=True)\ntime.sleep(1.0)"
    said = _teller_lines(monkeypatch, script, tmp_path)
    assert any("building llama.cpp: 75% (" in line for line in said), said


def test_on_a_terminal_the_percentage_goes_to_the_status_line(monkeypatch, tmp_path):
    status: list[str] = []
    said = _teller_lines(monkeypatch, MAKE_LIKE, tmp_path, status)
    assert said == []
    assert status and any("45%" in text for text in status), status


def test_a_wheel_without_shared_libraries_builds_all_of_llama_cpp_saying_why(empty_cache, tmp_path, monkeypatch):
    sdist = _sdist(tmp_path / "fake.tar.gz", 'cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "boom")\n')
    monkeypatch.setenv(native_tools.SDIST_ENV, str(sdist))
    monkeypatch.setattr(native_tools, "shipped_libraries", lambda: "the installed llama-cpp-python ships no X")
    said: list[str] = []
    with pytest.raises(ToolBuildError, match=r"^configuring llama.cpp failed \(exit status 1\)"):
        native_tools.build_tools(progress=said.append)
    why = [line for line in said if line.startswith("llmperf: building all of llama.cpp")]
    assert len(why) == 1 and why[0].endswith(": the installed llama-cpp-python ships no X"), said


@pytest.mark.parametrize(
    ("sources", "why"),
    [
        (None, "the sdist's llama.cpp has no tools/server/CMakeLists.txt"),  # sources it cannot link
        ((), "linking to llama-cpp-python's libraries failed (exit status 1"),  # cmake fails
    ],
)
def test_a_failed_link_falls_back_once_and_is_remembered(empty_cache, tmp_path, monkeypatch, sources, why):
    """The linked build failing falls back to the full build with one line, and the next build
    goes the full way at once, naming the folder to delete to try again."""
    if isinstance(native_tools.shipped_libraries(), str):
        pytest.fail(
            f"this test needs a llama-cpp-python wheel with shared libraries: {native_tools.shipped_libraries()}"
        )
    sdist = _sdist(tmp_path / "fake.tar.gz", 'cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "boom")\n')
    monkeypatch.setenv(native_tools.SDIST_ENV, str(sdist))
    if sources is not None:
        monkeypatch.setattr(native_tools, "LINKED_SOURCES", sources)
    said: list[str] = []
    with pytest.raises(ToolBuildError, match="^configuring llama.cpp failed"):
        native_tools.build_tools(progress=said.append)
    told = [line for line in said if line.startswith("llmperf: building all of llama.cpp")]
    assert len(told) == 1 and why in told[0], said
    plan = native_tools.build_plan(native_tools.tools_root())
    assert plan.route is native_tools.BuildRoute.FULL and plan.folder == native_tools.tools_root()
    assert plan.why_full.startswith(why) and "(before; delete " in plan.why_full and "linked-" in plan.why_full


def test_an_old_full_build_is_not_taken_for_a_linked_one(empty_cache, monkeypatch):
    """A cache with the full build of an earlier pytest-llmperf: the linked tools live in their
    own folder, so the old build is neither used as them nor in their way (built once anew)."""
    shipped = native_tools.shipped_libraries()
    if isinstance(shipped, str):
        pytest.fail(f"this test needs a llama-cpp-python wheel with shared libraries: {shipped}")
    root = native_tools.tools_root()
    for tool in native_tools.TOOLS:
        binary = root / "build" / "bin" / tool
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    (root / "build" / native_tools.STAMP).write_text("llama-cpp-python, built in 700 s\n")
    plan = native_tools.build_plan(root)
    assert plan.route is native_tools.BuildRoute.LINKED and plan.folder == root / f"linked-{shipped.key}"
    with pytest.raises(ToolBuildError, match="llama-server is not built"):
        native_tools.tool_path("llama-server", build=False)
    monkeypatch.setattr(native_tools, "shipped_libraries", lambda: "not shaped so")
    assert native_tools.tool_path("llama-server", build=False) == root / "build" / "bin" / "llama-server"


def test_built_tools_load_the_libraries_llama_cpp_python_ships(llama_server_binary):
    """The linked route: llama-server and llama-bench load libllama, ggml and mtmd from the
    installed llama-cpp-python (the in-process engine's very files), not copies of their own."""
    shipped = native_tools.shipped_libraries()
    if isinstance(shipped, str):
        pytest.fail(f"this test needs a llama-cpp-python wheel with shared libraries: {shipped}")
    bench = native_tools.tool_path("llama-bench", build=False)
    for binary in (llama_server_binary, bench):
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=60, check=True).stdout
        loaded = {
            parts[0]: Path(parts[2]).resolve()
            for parts in (line.split() for line in out.splitlines())
            if len(parts) >= 3 and parts[1] == "=>"
        }
        for name in ("libllama.so.0", "libggml.so.0", "libggml-base.so.0"):
            assert loaded[name].parent == shipped.lib_dir.resolve(), (name, loaded)
        assert loaded["libllama-common.so.0"].parent == shipped.common.resolve().parent, loaded
        assert not any(p.is_relative_to(binary.parent.parent) for p in loaded.values()), loaded


def test_server_build_prints_the_cached_tools_on_stdout(llama_server_binary, capsys):
    """Cached: the paths on stdout (for scripts), nothing on stderr."""
    assert main(["server", "build"]) == 0
    out, err = capsys.readouterr()
    assert f"llama-server: {llama_server_binary}\n" in out and "were cached" in out
    assert err == ""


@pytest.mark.parametrize("tty", [False, True])
def test_server_build_tells_its_steps_on_stderr(monkeypatch, capsys, tmp_path, tty):
    """Piped: every step and percentage a line of its own on stderr; on a terminal the percentage
    is one status line rewritten in place, cleared before the next step and at the end."""
    import sys

    def fake_build(progress, *, status=None):
        progress("llmperf: compiling")
        running = "llmperf: building llama.cpp: 45% (3 s so far)"
        (status or progress)(running)
        progress("llmperf: done")
        bin_dir = tmp_path / "build" / "bin"
        paths = {t: bin_dir / t for t in native_tools.TOOLS}
        return native_tools.NativeTools("0.0.0", tmp_path / "build", paths, 12.0, tmp_path / "build.log")

    monkeypatch.setattr(native_tools, "build_tools", fake_build)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert main(["server", "build"]) == 0
    out, err = capsys.readouterr()
    assert "llmperf: built for llama-cpp-python 0.0.0 in 12 s, all of llama.cpp compiled" in out
    if tty:
        assert err == (
            "\r\x1b[Kllmperf: compiling\n\r\x1b[Kllmperf: building llama.cpp: 45% (3 s so far)"
            "\r\x1b[Kllmperf: done\n\r\x1b[K"
        )
    else:
        assert err == "llmperf: compiling\nllmperf: building llama.cpp: 45% (3 s so far)\nllmperf: done\n"
