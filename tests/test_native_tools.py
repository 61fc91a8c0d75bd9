"""Building llama.cpp's own tools: what a user sees when it cannot work (one line, with the
build log's path), and that the real build's binaries are what ``tool_path`` returns."""

from __future__ import annotations

import fcntl
import io
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
