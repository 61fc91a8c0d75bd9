"""A report format is one ``Reporter`` and its registration (``reports.reporters``): a toy CSV
of each test's TTFT, registered from outside the package, gets its pytest option, is checked
before the session runs, is written at its end beside the built-in reports and leaves them as
they were; one it cannot write fails the session in one line."""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf.core.documents import write_output
from pytest_llmperf.core.errors import ConfigError, LLMPerfError
from pytest_llmperf.core.settings import SETTINGS, report_file
from pytest_llmperf.judge.result import Outcome
from pytest_llmperf.reports.reporters import REPORTERS, Reporter, SessionEnd, register
from pytest_llmperf.reports.session_file import load_session
from pytest_llmperf.session import SessionSettings
from pytest_llmperf.session.finish import finish, unwritten_lines


class TtftCsv(Reporter):
    """The worked example: one setting, one title, one ``write``."""

    setting = report_file("ttft_csv", "write each test's TTFT median as CSV to this file")
    title = "TTFT CSV"

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        rows = [f"{r.test},{r.figures.ttft_ms!r}\n" for r in end.results if r.figures is not None]
        write_output(path, "test,ttft_ms\n" + "".join(rows))
        return ()


class Unwritable(TtftCsv):
    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        raise OSError(errno.ENOSPC, "No space left on device")


@contextmanager
def registered(reporter: Reporter) -> Iterator[Reporter]:
    register(reporter)
    try:
        yield reporter
    finally:
        REPORTERS.remove(reporter)
        del SETTINGS[reporter.setting.name]


@pytest.fixture
def toy() -> Iterator[Reporter]:
    with registered(TtftCsv()) as reporter:
        yield reporter


SUITE = """
import time
import pytest

def tokens(prompt, max_tokens):
    for _ in range(max_tokens):
        time.sleep(0.001)
        yield "t"

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0)
def test_one(llmperf):
    llmperf.measure(engine=tokens)

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0)
def test_two(llmperf):
    llmperf.measure(engine=tokens)
"""


def _reports(root: Path, results: Sequence[Outcome], **paths: str) -> tuple[bytes, bytes]:
    """The JSON and Markdown that ``finish`` writes of ``results`` (and whatever else ``paths`` asks)."""
    s = SessionSettings.of(root, history="off", json=str(root / "s.json"), markdown=str(root / "s.md"), **paths)
    _, out = finish(s, results, [], "2026-12-06T00:00:00+00:00", None)
    assert not out.failed, unwritten_lines(out)
    return (root / "s.json").read_bytes(), (root / "s.md").read_bytes()


def test_a_registered_report_is_an_option_written_at_the_session_end(pytester: pytest.Pytester, toy: Reporter) -> None:
    assert "--llmperf-ttft-csv" in run(pytester, "--help").stdout.str()
    pytester.makepyfile(test_suite=SUITE)
    result = run(
        pytester,
        "--llmperf-history=off",
        "--llmperf-ttft-csv=t.csv",
        "--llmperf-json=s.json",
        "--llmperf-markdown=s.md",
    )
    assert result.ret == 0, result.stdout.str()
    results = load_session(pytester.path / "s.json")
    assert [r.test for r in results] == ["test_suite.py::test_one", "test_suite.py::test_two"]
    rows = (pytester.path / "t.csv").read_text().splitlines()
    assert rows == ["test,ttft_ms", *(f"{r.test},{r.figures.ttft_ms!r}" for r in results if r.figures)]
    assert len(rows) == 3
    # The built-in reports of the same results are byte for byte what they are without it.
    with_toy = _reports(pytester.path / "with", results, ttft_csv=str(pytester.path / "with" / "t.csv"))
    REPORTERS.remove(toy)
    try:
        assert _reports(pytester.path / "without", results) == with_toy
    finally:
        REPORTERS.insert(0, toy)


def test_a_registered_report_path_is_checked_before_the_session(tmp_path: Path, toy: Reporter) -> None:
    (tmp_path / "afile").write_text("a file, not a folder")
    with pytest.raises(ConfigError) as info:
        SessionSettings.of(tmp_path, ttft_csv=str(tmp_path / "afile" / "t.csv"))
    assert str(info.value) == (
        f"--llmperf-ttft-csv: cannot write {tmp_path}/afile/t.csv: Not a directory; give it a writable path"
    )
    assert SessionSettings.of(tmp_path, ttft_csv="t.csv").reports == {"ttft_csv": "t.csv"}
    assert SessionSettings.of(tmp_path).reports == {}


def test_a_report_that_cannot_be_written_fails_the_session_in_one_line(tmp_path: Path) -> None:
    with registered(Unwritable()):
        s = SessionSettings.of(tmp_path, history="off", ttft_csv=str(tmp_path / "t.csv"))
        _, out = finish(s, [], [], "2026-12-06T00:00:00+00:00", None)
    assert out.failed
    assert [line for _, line in unwritten_lines(out)] == [
        f"llmperf: cannot write {tmp_path}/t.csv: No space left on device",
        "llmperf: 1 report file(s) not written: the session fails",
    ]


def test_a_registered_report_may_not_take_a_setting_s_name() -> None:
    clash = TtftCsv()
    clash.setting = report_file("json", "another JSON")
    with pytest.raises(ConfigError, match="a setting named 'json' exists already"):
        register(clash)
    assert clash not in REPORTERS and SETTINGS["json"] is not clash.setting


def test_the_built_in_reports_are_registered_in_their_settings_order() -> None:
    from pytest_llmperf.reports.reporters import report_names

    assert report_names() == ["json", "markdown", "html"]
    assert [r.setting.name for r in REPORTERS] == ["json", "html", "markdown"]  # the Markdown links the HTML
    with registered(TtftCsv()):
        assert [r.setting.name for r in REPORTERS] == ["json", "html", "ttft_csv", "markdown"]
        assert report_names() == ["json", "markdown", "html", "ttft_csv"]  # pytest --help lists it last


class Linked(TtftCsv):
    """A report whose link the Markdown summary (written after it) and the step summary carry."""

    def write(self, path: str, end: SessionEnd) -> Sequence[str]:
        super().write(path, end)
        return [f"TTFT: `{Path(path).name}`"]

    def step_lines(self, path: str) -> Sequence[str]:
        return ["TTFT: kept as a CI artifact"]


def test_a_report_s_lines_reach_the_markdown_and_the_step_summary(tmp_path: Path) -> None:
    results = [Outcome(test="t.py::test_x")]
    with registered(Linked()):
        s = SessionSettings.of(
            tmp_path, history="off", ttft_csv=str(tmp_path / "t.csv"), markdown=str(tmp_path / "s.md")
        )
        _, out = finish(s, results, [], "2026-12-06T00:00:00+00:00", str(tmp_path / "step.md"))
    assert not out.failed and (tmp_path / "t.csv").read_text() == "test,ttft_ms\n"  # no figures: no row
    md, step = (tmp_path / "s.md").read_text(), (tmp_path / "step.md").read_text()
    assert md.count("TTFT: `t.csv`") == 1 and "CI artifact" not in md
    assert step.count("TTFT: kept as a CI artifact") == 1 and "`t.csv`" not in step


class NeedsAPackage(TtftCsv):
    def ready(self) -> None:
        raise LLMPerfError("the TTFT CSV needs a package: pip install it")


def test_a_report_says_what_it_needs_before_the_session_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    with registered(NeedsAPackage()):
        result = run(pytester, "--llmperf-history=off", "--llmperf-ttft-csv=t.csv")
        quiet = run(pytester, "--llmperf-history=off", "--co")  # not asked for: not asked to be ready
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "the TTFT CSV needs a package: pip install it" in result.stderr.str()
    assert quiet.ret == pytest.ExitCode.OK and not (pytester.path / "t.csv").exists()


def test_a_side_of_against_writes_no_report_not_even_a_registered_one(tmp_path: Path, toy: Reporter) -> None:
    from pytest_llmperf.pytest_plugin.side import side_settings

    s = SessionSettings.of(tmp_path, ttft_csv="t.csv", json="s.json", markdown="s.md")
    assert set(s.reports) == {"json", "markdown", "ttft_csv"}
    assert side_settings(s).reports == {}


PLUGIN = """
from pytest_llmperf.core.settings import report_file
from pytest_llmperf.reports.reporters import Reporter, register


class Names(Reporter):
    setting = report_file("names", "write the measured tests' ids to this file")
    title = "names"

    def write(self, path, end):
        with open(path, "w") as fh:
            fh.write("".join(r.test + "\\n" for r in end.results))
        return ()


register(Names())
"""


def test_a_plugin_registers_a_report_before_pytest_reads_the_options(pytester: pytest.Pytester) -> None:
    """A report from outside the package: its module, given with ``-p``, is imported before
    the plugin adds its options."""
    pytester.makepyfile(names_report=PLUGIN, test_suite=SUITE)
    pytester.syspathinsert()
    before = list(REPORTERS)
    try:
        result = run(pytester, "-p", "names_report", "--llmperf-history=off", "--llmperf-names=ids.txt")
    finally:
        REPORTERS[:] = before
        SETTINGS.pop("names", None)
    assert result.ret == 0, result.stdout.str()
    assert (pytester.path / "ids.txt").read_text() == "test_suite.py::test_one\ntest_suite.py::test_two\n"
