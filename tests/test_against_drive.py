"""``--llmperf-against``'s controller without processes: its sides' messages parsed once into
typed events (``session.sides.event_of``), and ``drive`` stepping each side's ``SideState`` on
scripted events (the real sides: tests/test_against.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_llmperf.session import against
from pytest_llmperf.session.sides import (
    CURRENT,
    REF,
    Exit,
    Logits,
    Measure,
    Missing,
    Ready,
    Released,
    Report,
    RunError,
    SideGone,
    SideSpec,
    Trace,
    Turn,
    Unknown,
    event_of,
)


def test_each_message_is_parsed_once_into_its_event() -> None:
    assert event_of({"ev": "ready", "collected": ["t"]}) == Ready({"ev": "ready", "collected": ["t"]})
    assert event_of({"ev": "measure", "label": "x"}).data["label"] == "x"  # type: ignore[attr-defined]
    assert event_of({"ev": "trace", "trace": {"a": 1}}) == Trace({"a": 1})
    assert event_of({"ev": "error", "line": "boom"}) == RunError("boom")
    assert event_of({"ev": "logits", "got": {"k": 1}}) == Logits({"k": 1}, None)
    assert event_of({"ev": "logits", "line": "no logits"}) == Logits(None, "no logits")
    assert event_of({"ev": "turn"}) == Turn() and event_of({"ev": "released"}) == Released()
    report = event_of({"ev": "report", "reports": [{"r": 1}], "outcome": "failed", "line": "E"})
    assert report == Report([{"r": 1}], "failed", "E") and report.failed  # type: ignore[attr-defined]
    assert event_of({"ev": "exit", "code": 3}) == Exit(3) and event_of({"ev": "exit"}) == Exit("?")
    assert event_of({"ev": "what"}) == Unknown("what") and event_of({"ev": "what"}).ev == "what"
    assert event_of({"ev": ["not", "a", "word"]}).ev == ["not", "a", "word"]
    assert event_of({}).ev is None


class FakeSide:
    """A side whose events are scripted; what the controller sends it is kept."""

    def __init__(self, name: str, events: list[Any], missing: Missing | None = None) -> None:
        self.spec = SideSpec(name, name, "", "", ())
        self.events, self.sent, self.closed, self._missing = list(events), [], False, missing

    @property
    def who(self) -> str:
        return f"side {self.spec.name}"

    def missing(self, nodeid: str) -> Missing | None:
        return self._missing

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def receive(self, timeout_s: float, doing: str) -> Any:
        event = self.events.pop(0)
        if isinstance(event, SideGone):
            raise event
        return event

    def kill(self, line: str) -> SideGone:
        return SideGone(line, self.spec.name)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The sides with an event waiting are ready; a measurement alone or in pairs is recorded."""
    measured: list[Any] = []
    monkeypatch.setattr(against, "wait_any", lambda busy, timeout_s: [s for s in busy if s.events])
    monkeypatch.setattr(against, "solo", lambda ag, side, data: measured.append(("solo", side.spec.name)))
    return measured


def _ag(cur: FakeSide, ref: FakeSide) -> Any:
    return SimpleNamespace(sides={CURRENT: cur, REF: ref}, timeout_s=5.0)


def test_ref_without_the_test_measures_the_current_side_alone(scripted: list[Any]) -> None:
    cur = FakeSide(CURRENT, [Measure({"workload": {}}), Report([{"r": 1}], "passed")])
    ref = FakeSide(REF, [], missing=Missing("side REF has no test t", fails=False))
    out = against.drive(_ag(cur, ref), "t", None)
    assert out.reports == [{"r": 1}] and out.failure is None
    assert scripted == [("solo", CURRENT)] and ref.sent == []
    assert cur.sent[0] == {"op": "test", "nodeid": "t", "next": None}
    assert cur.sent[1] == {
        "op": "done",
        "verdict": {"status": "not-compared", "note": "not compared: side REF has no test t"},
    }
    assert out.notes == []  # the verdict's note says it already


def test_a_turn_is_granted_and_a_failure_on_ref_is_a_note(scripted: list[Any]) -> None:
    cur = FakeSide(CURRENT, [Turn(), Released(), Report([{"r": 1}], "passed")])
    ref = FakeSide(REF, [Report([], "failed", "E assert 0")])
    out = against.drive(_ag(cur, ref), "t", "u")
    assert {"op": "go"} in cur.sent and out.reports == [{"r": 1}]
    assert out.notes == ["side REF: the test failed there: E assert 0"]


def test_ref_that_ends_its_session_fails_the_measurement_it_left(scripted: list[Any]) -> None:
    cur = FakeSide(CURRENT, [Measure({"workload": {}}), Report([], "failed", "E")])
    ref = FakeSide(REF, [Exit(2)])
    out = against.drive(_ag(cur, ref), "t", None)
    lost = "side REF ended its pytest session (exit status 2) while running t"
    assert ref.closed and cur.sent[-1] == {"op": "done", "fail": lost}
    assert scripted == [] and out.notes == []  # the current side's failure carries it


def test_the_current_side_lost_fails_the_test(scripted: list[Any]) -> None:
    cur = FakeSide(CURRENT, [SideGone("side current died with SIGSEGV", CURRENT)])
    ref = FakeSide(REF, [Measure({"workload": {}})])
    out = against.drive(_ag(cur, ref), "t", None)
    assert out.failure == "side current died with SIGSEGV" and out.reports == []
    assert ref.sent[-1] == {"op": "done", "fail": "the current side ended the test before this measurement"}


def test_a_side_that_cannot_start_fails_the_test_before_it_runs(scripted: list[Any]) -> None:
    cur = FakeSide(CURRENT, [], missing=Missing("side current cannot start", fails=True))
    out = against.drive(_ag(cur, FakeSide(REF, [])), "t", None)
    assert out.failure == "side current cannot start" and cur.sent == []


def test_both_sides_at_the_measurement_are_paired_and_the_current_side_gets_the_verdict(
    scripted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def pairs(ag: Any, events: Any, nodeid: str) -> Any:
        seen.append(events)
        looked = SimpleNamespace(comparisons=[], parts=(), changes=())
        return looked, "against REF: 10 pairs", SimpleNamespace(to_json=lambda: {"top1": 1.0})

    monkeypatch.setattr(against, "pairs", pairs)
    cur = FakeSide(CURRENT, [Measure({"label": "c"}), Report([{"r": 1}], "passed")])
    ref = FakeSide(REF, [Measure({"label": "r"}), Report([], "passed")])
    out = against.drive(_ag(cur, ref), "t", None)
    assert seen == [{CURRENT: {"label": "c"}, REF: {"label": "r"}}]
    assert cur.sent[-1] == {
        "op": "done",
        "verdict": {
            "status": "compared",
            "note": "against REF: 10 pairs",
            "comparisons": [],
            "parts": [],
            "agreement": {"top1": 1.0},
        },
    }
    assert ref.sent[-1] == {"op": "done"} and out.reports == [{"r": 1}] and out.notes == []


def test_a_run_that_raises_ends_the_measurement_on_both_sides(
    scripted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def pairs(ag: Any, events: Any, nodeid: str) -> Any:
        raise against.RunFailed("side REF: RuntimeError: broke")

    monkeypatch.setattr(against, "pairs", pairs)
    cur = FakeSide(CURRENT, [Measure({}), Report([], "failed", "E")])
    ref = FakeSide(REF, [Measure({}), Report([], "failed", "E")])
    out = against.drive(_ag(cur, ref), "t", None)
    line = "not measured: side REF: RuntimeError: broke"
    assert cur.sent[-1] == ref.sent[-1] == {"op": "done", "fail": line}
    assert out.notes == []  # the test's failure names the side whose run raised; REF's is ours


# -- a failure blamed on the side that raised ---------------------------------------------------


def test_this_trees_failure_before_the_measurement_is_not_blamed_on_ref(scripted: list[Any]) -> None:
    """This tree's side raises before its measurement (its code under test, its test body):
    REF, waiting at the measurement, is told to fail it; that failure is not REF's."""
    cur = FakeSide(CURRENT, [Report([{"r": 1}], "failed", "ZeroDivisionError: division by zero")])
    told = "E not measured: the current side ended the test before this measurement"
    ref = FakeSide(REF, [Measure({"workload": {}}), Report([], "failed", told)])
    out = against.drive(_ag(cur, ref), "t", None)
    assert ref.sent[-1] == {"op": "done", "fail": "the current side ended the test before this measurement"}
    assert out.reports == [{"r": 1}] and out.notes == [], out.notes


def test_a_run_of_this_tree_that_raises_is_not_blamed_on_ref(
    scripted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def pairs(ag: Any, events: Any, nodeid: str) -> Any:
        raise against.RunFailed("side current: ValueError: this tree's bug")

    monkeypatch.setattr(against, "pairs", pairs)
    cur = FakeSide(CURRENT, [Measure({}), Report([], "failed", "E not measured: side current: ValueError")])
    ref = FakeSide(REF, [Measure({}), Report([], "failed", "E not measured: side current: ValueError")])
    out = against.drive(_ag(cur, ref), "t", None)
    assert cur.sent[-1]["fail"] == "not measured: side current: ValueError: this tree's bug"
    assert out.notes == [], out.notes


def test_a_failure_both_sides_raise_alike_is_the_tests_not_refs(scripted: list[Any]) -> None:
    line = "ZeroDivisionError: division by zero (raised at tests/test_x.py:7)"
    cur = FakeSide(CURRENT, [Report([{"r": 1}], "failed", line)])
    ref = FakeSide(REF, [Report([], "failed", line)])
    out = against.drive(_ag(cur, ref), "t", None)
    assert out.notes == [f"the test failed on both sides alike (not REF's doing): {line}"]
    assert not any(n.startswith("side REF") for n in out.notes)


def test_the_failure_line_says_where_it_was_raised() -> None:
    from pytest_llmperf.pytest_plugin.side import _failure_line

    crash = {"path": "tests/test_x.py", "lineno": 7, "message": "ZeroDivisionError: division by zero"}
    reports = [{"outcome": "passed"}, {"outcome": "failed", "longrepr": {"reprcrash": crash}}]
    assert _failure_line(reports) == "ZeroDivisionError: division by zero (raised at tests/test_x.py:7)"
    assert _failure_line([{"outcome": "failed", "longrepr": "E boom"}]) == "E boom"


def test_a_fresh_process_pair_runs_the_test_up_to_the_same_measurement() -> None:
    """An extra process pair (issue 50) reaches the measurement the test's own sides wait at: an
    earlier measurement of the test ends unjudged, an exclusive turn on the way is granted."""
    side = FakeSide(REF, [Measure({"label": "first"}), Turn(), Released(), Measure({"label": "second", "x": 1})])
    assert against._reach(side, "second", 5.0) == {"label": "second", "x": 1}  # type: ignore[arg-type]
    assert side.sent == [{"op": "done"}, {"op": "go"}]


def test_a_fresh_process_that_ends_the_test_first_is_no_process_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """It says why, its processes are closed, and the measurement goes on with the pairs it has."""
    with pytest.raises(SideGone, match="ended the test before this measurement"):
        against._reach(FakeSide(REF, [Report([], "failed", "E")]), "", 5.0)  # type: ignore[arg-type]
    made: list[FakeSide] = []

    def fresh(spec: SideSpec, *rest: object) -> FakeSide:
        made.append(FakeSide(spec.name, [Report([], "failed", "E")]))
        return made[-1]

    monkeypatch.setattr(against, "Side", fresh)
    monkeypatch.setattr(against, "start_all", lambda sides: None)
    cur, ref = FakeSide(CURRENT, []), FakeSide(REF, [])
    for one in (cur, ref):
        one.args, one.cwd, one.harness, one.timeout_s = [], "", "", 5.0  # type: ignore[attr-defined]
    first = SimpleNamespace(cpus=None, interleaved=against.Interleaved.TOKEN)
    processes = against.Processes(_ag(cur, ref), "t", "", first, 4)  # type: ignore[arg-type]
    workload = SimpleNamespace(warmup=0, seed=0)
    assert processes.next_block(workload, first=True) == 0 and not made  # type: ignore[arg-type]
    assert processes.next_block(workload, first=False) == 0  # type: ignore[arg-type]  # its block on the test's own sides
    assert processes.unavailable is not None and "process pair 2 did not start" in processes.unavailable
    assert len(made) == 2 and all(one.closed for one in made) and processes.live is first and processes.started == 1
    assert processes.next_block(workload, first=False) == 0 and len(made) == 2  # type: ignore[arg-type]  # not tried again
