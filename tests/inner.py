"""Helpers shared by the tests: inner pytest sessions, stored baselines edited to inject a
known change, the headless browser, and the guard that keeps the suite from writing into the
checkout's ``baselines/``."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import statistics
from pathlib import Path

import pytest

LATENCIES = ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p95_ms")
RATES = ("prefill_tps", "decode_tps")

#: Set to 1 where a browser is installed on purpose (``.ci/run``): the browser checks then
#: fail instead of skipping when none is found.
REQUIRE_BROWSER_ENV = "LLMPERF_REQUIRE_BROWSER"
NO_BROWSER = "no headless Chromium found (apt-get install -y chromium)"


def ctrl_c_default() -> None:
    """A child's ``preexec_fn`` for the tests that press Ctrl-C (send SIGINT): SIGINT back to its
    default action. A shell that ignores SIGINT (``nohup``, ``trap '' INT``, a background job of
    a non-interactive shell, several CI agents) passes SIG_IGN down to every process it starts,
    across exec, and Python then installs no KeyboardInterrupt handler: the signal would be lost.
    One system call, no lock taken: safe in a preexec_fn."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner pytest session in this process (no cache folder left behind). Its rootdir,
    hence its default ``baselines/``, is ``pytester.path`` (tests/conftest.py pins it)."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def scale(entry: dict, factor: float) -> None:
    """Make a stored baseline entry ``factor`` times faster than what was measured (run by
    run: the measured noise is kept, so the effect is only as clear as the runs allow)."""
    runs = entry["runs"]
    for key in LATENCIES:
        runs[key] = [v / factor for v in runs[key]]
    for key in RATES:
        runs[key] = [v * factor for v in runs[key]]
    entry["itl_ms"] = [[v / factor for v in run] for run in entry["itl_ms"]]


def _spread(n: int) -> list[float]:
    """Distinct factors 1.000, 1.001, ...: no ties for the rank test, CV far below any guard."""
    return [1.0 + 0.001 * i for i in range(n)]


#: ``outpace`` makes the baseline's machine reference this many times slower.
REFERENCE_SLOWER = 100.0


def outpace(entry: dict, factor: float) -> None:
    """Replace a stored baseline entry by steady runs ``factor`` times faster than its
    *fastest* run. Noise on a shared machine only slows runs down, so every later run on this
    machine is slower than every baseline run however busy the machine is: the injected
    slowdown is certain, not a matter of timing luck (``scale`` keeps the baseline's outliers).

    The baseline's machine reference (the BLAS probe) is made ``REFERENCE_SLOWER`` times
    slower too: the machine can then never look slower than at baseline, and the injected
    slowdown is the subject's. Otherwise a machine that got busier between the two sessions
    turns the REGRESSION into MACHINE_SLOWER, as it should, and the test would be luck."""
    if isinstance(entry.get("reference"), dict):
        ref = entry["reference"]
        ref["runs_ms"] = [v * REFERENCE_SLOWER for v in ref["runs_ms"]]
    runs = entry["runs"]
    spread = _spread(len(runs["tpot_ms"]))
    for key in LATENCIES:
        if key in runs:
            runs[key] = [min(runs[key]) / factor * s for s in spread]
    for key in RATES:
        if key in runs:
            runs[key] = [max(runs[key]) * factor / s for s in spread]
    best = min(entry["itl_ms"], key=statistics.fmean)
    entry["itl_ms"] = [[v / factor * s for v in best] for s in spread]


def busiest_baseline(entry: dict) -> None:
    """Make a stored baseline entry's machine figures the busiest they can be (all steal time,
    every run preempted a billion times), so that no session can look busier and the rule never
    blames a slowdown on the machine (``judge.regression.machine_blame``; on CI runners the
    hypervisor's steal alone did). For the tests about what a REGRESSION line says: the note that
    the baseline was recorded under steal comes with it."""
    entry["machine"] = {
        **(entry.get("machine") or {}),
        "steal_share": 1.0,
        "involuntary_switches_per_run": 1e9,
        "cpu_wait_share": 1.0,
        "others_cpu_share": 1.0,
    }


def lag(entry: dict, factor: float) -> None:
    """Replace a stored baseline entry by steady runs ``factor`` times slower than its
    *slowest* run: a later run on this machine looks ``factor`` times faster unless the
    machine got that much slower (a speed-up as clear as a shared machine allows)."""
    runs = entry["runs"]
    spread = _spread(len(runs["tpot_ms"]))
    for key in LATENCIES:
        if key in runs:
            runs[key] = [max(runs[key]) * factor * s for s in spread]
    for key in RATES:
        if key in runs:
            runs[key] = [min(runs[key]) / factor / s for s in spread]
    worst = max(entry["itl_ms"], key=statistics.fmean)
    entry["itl_ms"] = [[v * factor * s for v in worst] for s in spread]


def chromium() -> str:
    """The headless browser's path. None installed: skip, or fail where it is required."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get(REQUIRE_BROWSER_ENV, "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{NO_BROWSER}; {REQUIRE_BROWSER_ENV}=1 requires it", pytrace=False)
    pytest.skip(f"{NO_BROWSER}; {REQUIRE_BROWSER_ENV}=1 makes this a failure")


class BaselinesGuard:
    """A plugin that fails the session when it changed anything under ``folder`` (a file
    added, changed or removed): the project's tests must never write into the checkout's
    ``baselines/`` (inner sessions use their own tmp folders)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.before: dict[str, str] = {}

    def snapshot(self) -> dict[str, str]:
        if not self.folder.is_dir():
            return {}
        return {
            p.relative_to(self.folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.folder.rglob("*"))
            if p.is_file()
        }

    def changes(self) -> list[str]:
        after = self.snapshot()
        return sorted(k for k in self.before.keys() | after.keys() if self.before.get(k) != after.get(k))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.before = self.snapshot()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        changed = self.changes()
        if not changed:
            return
        shown = ", ".join(changed[:5]) + (f" (+{len(changed) - 5} more)" if len(changed) > 5 else "")
        message = (
            f"the test suite changed {len(changed)} file(s) under {self.folder}: {shown}; "
            "an inner pytest session wrote into the checkout (give it its own baseline dir)"
        )
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
