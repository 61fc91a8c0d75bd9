"""Long waits say where they are (``core.progress``): the reporter's rules on an injected clock
(no timed assertion: the clock is the test's), its two sinks, and the places that use it: an
inner pytest session's fresh loads and attribution pass, ``--llmperf-against``'s pairs, and
``llmperf profile`` piped (progress on stderr, the report alone on stdout)."""

from __future__ import annotations

import io
import itertools
import json
import re
import sys
import threading
from pathlib import Path

import pytest
from inner import run as run_inner

from pytest_llmperf.core import progress
from pytest_llmperf.core.progress import LINE_EVERY_S, QUIET_S, REFRESH_S, Progress, StreamSink, fit, task


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines:
    """A sink that keeps what it was given."""

    def __init__(self, live: bool = False) -> None:
        self.live = live
        self.shown: list[tuple[float, str]] = []
        self.ended: list[str] = []
        self.clock: Clock | None = None

    def show(self, text: str) -> None:
        self.shown.append((self.clock() if self.clock else 0.0, text))

    def end(self, text: str) -> None:
        self.ended.append(text)


def reporter(live: bool = False) -> tuple[Progress, Lines, Clock]:
    clock, sink = Clock(), Lines(live)
    sink.clock = clock
    return Progress("against git:main: t.py::test_a", sink, clock=clock), sink, clock


def test_a_quick_task_says_nothing() -> None:
    one, sink, clock = reporter()
    one.step("pairs", 0, 40)
    clock.now += QUIET_S / 2
    one.beat()
    one.advance(10)
    one.close()
    assert sink.shown == [] and sink.ended == []


def test_piped_a_line_per_step_and_the_heartbeat_bounds_every_silence() -> None:
    """Ten minutes of one step that waits, beaten every 0.2 s as the thread does: a line at
    least every LINE_EVERY_S (well within 10 s), and no flood (one line per LINE_EVERY_S)."""
    one, sink, clock = reporter()
    clock.now += QUIET_S
    one.step("look 1 of at most 4: pairs", 0, 40)
    assert sink.shown[-1][1] == "llmperf: against git:main: t.py::test_a: look 1 of at most 4: pairs 0 of 40 [2 s]"
    start = clock.now
    while clock.now < start + 600:
        clock.now += 0.2
        one.advance(min(40, int(clock.now - start) // 15))  # a pair now and then: counted, not a line
        one.beat()
    times = [t for t, _ in sink.shown]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= LINE_EVERY_S + 0.2 + 1e-9 and min(gaps) >= LINE_EVERY_S - 1e-9
    assert sink.shown[-1][1].endswith(": look 1 of at most 4: pairs 40 of 40 [602 s]")
    assert all("\r" not in text for _, text in sink.shown)
    one.step("look 2 of at most 4: pairs", 40, 80)  # a new step: its line at once
    assert sink.shown[-1][0] == clock.now and "look 2 of at most 4: pairs 40 of 80" in sink.shown[-1][1]
    one.close()
    assert sink.ended == ["llmperf: against git:main: t.py::test_a: done in 602 s"]


def test_on_a_terminal_the_line_is_redrawn_at_most_every_refresh() -> None:
    one, sink, clock = reporter(live=True)
    clock.now += QUIET_S
    for i in range(100):  # a pair every 0.05 s: one redraw per REFRESH_S, steps included
        one.step("pairs", i, 100) if i % 10 == 0 else one.advance(i)
        one.beat()
        clock.now += 0.05
    times = [t for t, _ in sink.shown]
    assert len(times) == pytest.approx(100 * 0.05 / REFRESH_S, abs=1)
    assert all(b - a >= REFRESH_S - 1e-9 for a, b in itertools.pairwise(times))
    one.close("stopped")
    assert sink.ended == ["llmperf: against git:main: t.py::test_a: stopped in 7 s"]


def test_a_part_shows_on_its_parents_line_and_ends_silently() -> None:
    one, sink, clock = reporter()
    clock.now += QUIET_S
    one.step("the sides run the test")
    part = Progress("attribution pass", None, clock=clock, parent=one)
    one.child = part
    part.step("instrumented runs", 3, 8)
    assert (
        sink.shown[-1][1] == "llmperf: against git:main: t.py::test_a: attribution pass: instrumented runs 3 of 8 [2 s]"
    )
    part.close()
    assert one.child is None and sink.ended == []
    clock.now += LINE_EVERY_S
    one.beat()
    assert sink.shown[-1][1] == "llmperf: against git:main: t.py::test_a: the sides run the test [7 s]"


def test_tasks_nest_on_the_sink_and_are_silent_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, sink = Clock(), Lines()
    sink.clock = clock
    monkeypatch.setattr(progress, "_sink", None)
    with task("alone", clock=clock) as quiet:
        clock.now += 60
        quiet.step("runs", 1, 2)
        assert quiet.sink is None
    monkeypatch.setattr(progress, "_sink", sink)
    with pytest.raises(KeyboardInterrupt), task("profile tiny", clock=clock) as outer:
        clock.now += QUIET_S
        with task("timed runs", clock=clock) as inner:
            assert progress.current() is inner and inner.parent is outer
            inner.step("runs", 0, 10)
        assert progress.current() is outer
        raise KeyboardInterrupt
    assert [text for _, text in sink.shown] == ["llmperf: profile tiny: timed runs: runs 0 of 10 [2 s]"]
    assert sink.ended == ["llmperf: profile tiny: stopped in 2 s"]
    assert progress.current().sink is None  # none runs: a silent one


def test_a_task_of_another_thread_while_one_is_shown_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    """One line on the sink at a time: a test's own thread that measures while the test's
    task is shown neither nests in it (another thread's steps) nor draws a second line."""
    monkeypatch.setattr(progress, "_sink", Lines())
    got: list[Progress] = []

    def elsewhere() -> None:
        with task("another thread's") as other:
            got.append(other)

    with task("the test's") as shown:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
    assert shown.sink is not None and got[0].sink is None and got[0].parent is None
    with task("next") as after:  # the line is free again
        assert after.sink is not None


def test_the_heartbeat_thread_speaks_while_the_task_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread alone (the task's own code waits on an event): its line comes."""
    said = threading.Event()

    class Said(Lines):
        def show(self, text: str) -> None:
            super().show(text)
            said.set()

    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    monkeypatch.setattr(progress, "_sink", Said())
    with task("waiting") as one:
        one.step("a side's answer")  # shown at once (piped)
        said.clear()
        assert said.wait(60), "the heartbeat said nothing"


def test_the_heartbeat_holds_its_line_inside_a_timed_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``timed()`` (a run whose clock reads are this process's) no beat writes a line;
    once the region ends, or has lasted ``TIMED_HOLD_S``, the heartbeat speaks again."""
    lines = Lines()
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    monkeypatch.setattr(progress, "_sink", lines)
    clock = [0.0]
    with task("measuring", clock=lambda: clock[0]) as one:
        one.step("runs", 0, 3)
        shown = len(lines.shown)
        with progress.timed():
            clock[0] += 60.0  # the deadline long past
            one.beat()
            assert len(lines.shown) == shown  # held: nothing between the run's clock reads
            monkeypatch.setattr(progress, "TIMED_HOLD_S", 0.0)  # a run past the hold
            one.beat()
            assert len(lines.shown) == shown + 1
        monkeypatch.setattr(progress, "TIMED_HOLD_S", 8.0)
        clock[0] += 60.0
        one.beat()  # the region over: the line again
        assert len(lines.shown) == shown + 2


def test_fit_keeps_both_ends_within_the_width() -> None:
    text = "llmperf: against git:main (3f2a1b9c0d1e): tests/test_some_long_module.py::test_x: pairs 3 of 40 [12 s]"
    short = fit(text, 60)
    assert len(short) == 60 and short.startswith("llmperf: against") and short.endswith("[12 s]")
    assert fit("llmperf: x [1 s]", 60) == "llmperf: x [1 s]"


def test_the_stream_sink_redraws_on_a_terminal_and_writes_lines_when_piped() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped, tty = io.StringIO(), Tty()
    for stream in (piped, tty):
        sink = StreamSink(stream)
        sink.show("llmperf: a [3 s]")
        sink.show("llmperf: b [4 s]")
        sink.end("llmperf: x: done in 5 s")
    assert piped.getvalue() == "llmperf: a [3 s]\nllmperf: b [4 s]\nllmperf: x: done in 5 s\n"
    assert tty.getvalue() == "\r\x1b[Kllmperf: a [3 s]\r\x1b[Kllmperf: b [4 s]\r\x1b[K"


# -- where it is used ---------------------------------------------------------------------------

LOADS_AND_ATTRIBUTION = """
import pytest


@pytest.mark.llmperf(prompt_tokens=8, max_tokens=4, runs=2, warmup=1, model_load="warm", attribution=True)
def test_loads():
    pass
"""


def test_an_inner_session_says_its_steps_piped(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step a line (QUIET_S 0: however quick the machine), none redrawn: the runs, the
    attribution pass (it says it ran), the fresh loads, and the test's end."""
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    before = progress.set_sink(None)  # this suite's own session's sink (its plugin's), put back below
    monkeypatch.setattr(progress, "_sink", before)
    pytester.makepyfile(test_p=LOADS_AND_ATTRIBUTION)
    result = run_inner(pytester, "--llmperf-model", "tiny", "--llmperf-threads", "1", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    steps = [line for line in out.splitlines() if line.startswith("llmperf: test_p.py::test_loads")]
    want = [
        r"timed runs: warm-up runs 0 of 1 \[\d+ s\]",
        r"timed runs: runs 0 of 2 \[\d+ s\]",
        r"attribution pass: warm-up \[\d+ s\]",
        r"attribution pass: instrumented runs 0 of \d+ \[\d+ s\]",
        r"attribution pass: result \[\d+ s\]",
        r"warm model loads: loads 0 of 2 \[\d+ s\]",
        r"done in \d+ s",
    ]
    for pattern in want:
        assert any(re.fullmatch(rf"llmperf: test_p\.py::test_loads: {pattern}", s) for s in steps), (pattern, out)
    assert "\r" not in out
    assert progress._sink is before  # the inner session put the sink it found back


def test_minus_qq_shows_no_progress(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    pytester.makepyfile(
        test_p="""
        import pytest

        @pytest.mark.llmperf(prompt_tokens=8, max_tokens=4, runs=2, warmup=0)
        def test_q():
            pass
        """
    )
    result = run_inner(pytester, "--llmperf-model", "tiny", "--llmperf-threads", "1", "-qq")
    assert result.ret == 0, result.stdout.str()
    assert "llmperf: test_p.py::test_q" not in result.stdout.str()


def test_profile_piped_says_its_steps_on_stderr_and_its_report_alone_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_llmperf.cli import main as cli_main

    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    before = progress._sink
    args = ["profile", "tiny", "--format", "json", "--threads", "1", "--runs", "2", "--max-tokens", "8"]
    assert cli_main(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"]["name"] == "synthetic-tiny"
    lines = err.splitlines()
    assert lines and all(line.startswith("llmperf: profile tiny: ") for line in lines), err
    for step in ("loading it into llama.cpp", "timed runs: runs 0 of 2", "per-layer timing"):
        assert any(step in line for line in lines), (step, err)
    assert re.fullmatch(r"llmperf: profile tiny: done in \d+ s", lines[-1]), err
    assert progress._sink is before  # the command put back the sink it found


AGAINST_TESTS = """
import pytest


@pytest.mark.llmperf(prompt_tokens=8, max_tokens=8, runs=4, warmup=1, attribution=True)
def test_marker():
    pass
"""


def test_against_says_its_pairs_and_attribution_pass(tmp_path: Path, tiny_model_path: Path) -> None:
    """``--llmperf-against`` piped (QUIET_S 0 in the inner session's conftest): the pairs' look,
    the attribution pass, the test's end; plain lines."""
    from test_against import CONFTEST, Runner, make_repo, outcome

    runner = Runner(tmp_path, tiny_model_path)
    root = tmp_path / "repo"
    conftest = CONFTEST + "\nimport pytest_llmperf.core.progress as progress\n\nprogress.QUIET_S = 0.0\n"
    make_repo(root, [("base", {"conftest.py": conftest, "tests/test_p.py": AGAINST_TESTS})])
    ref = f"python:{sys.executable}"
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", ref)
    out = inner.out
    assert outcome(inner, "test_marker") == "PASSED", out
    head = re.escape(f"llmperf: against {ref}: tests/test_p.py::test_marker: ")
    for pattern in (
        r"starting the sides",
        r"measurement: look 1 of at most \d+: pairs 0 of \d+",
        r"attribution pass: instrumented runs 0 of \d+",
    ):
        assert re.search(rf"^{head}{pattern} \[\d+ s\]$", out, re.MULTILINE), (pattern, out)
    assert re.search(rf"^{head[: -len(re.escape(': '))]}: done in \d+ s$", out, re.MULTILINE), out
    assert "\r" not in out
    runner.check_clean(root, inner.pids)
