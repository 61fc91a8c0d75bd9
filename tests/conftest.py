"""Shared fixtures: real llama.cpp engines on the embedded synthetic models; inner pytest
sessions pinned to their own folders; the HTML report's browser.

Models are cached in the repository's ignored ``.llmperf-cache/`` (set before any inner
pytester session starts, so they inherit it) and written once per machine.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

import pytest
from inner import NO_BROWSER, REQUIRE_BROWSER_ENV, BaselinesGuard

CHECKOUT = Path(__file__).resolve().parent.parent
CACHE_DIR = CHECKOUT / ".llmperf-cache"
os.environ.setdefault("LLMPERF_CACHE_DIR", str(CACHE_DIR))
#: One llama.cpp thread for the engines here and, through the environment, every inner session
#: (a test's own --llmperf-threads wins). llama.cpp's threads meet at a barrier after every
#: operation: with as many threads as cores and another process on one core, each operation
#: waits for a descheduled thread, and a block that computes in ~1 ms measured 300 ms. The
#: suite checks what the plugin reports, not how llama.cpp scales, so it must not measure
#: the scheduler.
TEST_THREADS = 1
os.environ.setdefault("LLMPERF_THREADS", str(TEST_THREADS))
#: The suite's own session keeps no history in the checkout (``.llmperf/``); each inner
#: session gets one in its tmp folder (below), and history tests pass their own location.
HISTORY_ENV = "LLMPERF_HISTORY"
#: The terminal width of inner sessions (``COLUMNS``) unless a test sets its own.
WIDE_TERMINAL = 1000
os.environ.setdefault(HISTORY_ENV, "off")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist: the controller watches the checkout
        config.pluginmanager.register(BaselinesGuard(CHECKOUT / "baselines"), "llmperf-baselines-guard")
        config.pluginmanager.register(BaselinesGuard(CHECKOUT / ".llmperf"), "llmperf-history-guard")


@pytest.fixture(autouse=True)
def _inner_sessions_use_their_own_rootdir(request: pytest.FixtureRequest):
    """Every inner session (in-process or subprocess) of a test using ``pytester`` gets
    ``--rootdir=<its tmp folder>``. pytest takes any existing path on the command line for
    a test path when it looks for the rootdir, an option's value too: ``--llmperf-model
    <.llmperf-cache/x.gguf>`` made the checkout the rootdir, and its ``baselines/`` the
    inner session's baseline folder. An explicit ``--rootdir`` in a test's args wins."""
    if "pytester" not in request.fixturenames:
        yield
        return
    pytester: pytest.Pytester = request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS
    # The test's own ``monkeypatch`` (pytester's too): one undo stack, so a test that changes
    # these again is unwound in order (a second MonkeyPatch, undone first, let the test's undo
    # restore this fixture's value after it: a tmp history leaked into later tests).
    patch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    patch.setenv("PYTEST_ADDOPTS", f"--rootdir={shlex.quote(str(pytester.path))}")
    patch.setenv(HISTORY_ENV, str(pytester.path / ".llmperf" / "history.sqlite"))
    # A wide terminal: the tests about what a line says read it whole. The tests about how the
    # report fits a terminal set COLUMNS themselves (tests/test_report_width.py).
    patch.setenv("COLUMNS", str(WIDE_TERMINAL))
    yield


def pytest_terminal_summary(terminalreporter) -> None:
    """Say at the end of the run, without ``-rs``, that browser or PostgreSQL checks were skipped."""
    from pgserver import NO_POSTGRES, REQUIRE_POSTGRES_ENV

    for reason, what, env in (
        (NO_BROWSER, "HTML-report browser check(s)", REQUIRE_BROWSER_ENV),
        (NO_POSTGRES, "PostgreSQL history test(s)", REQUIRE_POSTGRES_ENV),
    ):
        skipped = [
            r
            for r in terminalreporter.stats.get("skipped", [])
            if isinstance(r.longrepr, tuple) and reason in str(r.longrepr[2])
        ]
        if skipped:
            terminalreporter.write_line(
                f"{len(skipped)} {what} skipped: {reason}; {env}=1 makes them fail instead", yellow=True
            )


# The plugin imports numpy, scipy and llama_cpp only once an llmperf test runs. In-process
# inner sessions (pytester) drop the modules first imported during them, and numpy's C
# extensions cannot be loaded twice in a process: import them here, once, for all sessions.
# matplotlib likewise: an in-process HTML session that imported it first left a later one with
# half a module ("type object 'Text' has no attribute 'items'").
import matplotlib.pyplot  # noqa: F401

import pytest_llmperf.engines.llama_cpp
import pytest_llmperf.judge.rule
import pytest_llmperf.reports.session_file  # noqa: F401

try:  # its C extension, for the in-process PostgreSQL history sessions (the postgres extra)
    import psycopg  # noqa: F401
except ImportError:
    pass


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from pytest_llmperf import ensure_model

    return ensure_model("tiny")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path: Path):
    from pytest_llmperf import LlamaCppEngine

    engine = LlamaCppEngine(tiny_model_path, threads=TEST_THREADS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def small_engine():
    from pytest_llmperf import LlamaCppEngine, ensure_model

    engine = LlamaCppEngine(ensure_model("small"), threads=TEST_THREADS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def llama_server_binary(pytestconfig: pytest.Config) -> Path:
    """llama.cpp's llama-server of the installed llama-cpp-python, built once per version
    (a few minutes the first time; `.ci/run` builds it before the tests). A build here
    prints its steps and its percentage (at least every 10 s) on the terminal, past pytest's capture."""
    from pytest_llmperf.core.errors import ToolBuildError
    from pytest_llmperf.engines.servers import tool_path

    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    terminal = pytestconfig.pluginmanager.getplugin("terminalreporter")

    def progress(line: str) -> None:
        if terminal is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            terminal.write_line(line)

    try:
        return tool_path("llama-server", progress=progress)
    except ToolBuildError as exc:
        pytest.fail(str(exc), pytrace=False)
