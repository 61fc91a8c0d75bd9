"""``--llmperf-against REF``: every llmperf test measured on two sides, interleaved pair by pair,
and the current side judged against REF with paired statistics (docs/against.md). No pytest.

Each side is a long-lived process of the same shape (``pytest_plugin/side.py``): a pytest
session of the current tests whose code under test comes from the side's tree (the current
one, or REF's git worktree) and whose interpreter is the side's (this one, or REF's
``python:PATH``). The controller here names the test both sides run; each side runs it up to
its first measurement and waits; then the controller asks for the warm-ups and the runs, one
side at a time, in seeded AB/BA order per pair, adds pairs while the verdict is undecided (up to
the cap, every look at alpha / looks), judges them (``judge.ab.paired.judged_pairs``) and hands
each side its measurement's end. The current side's reports become the test's.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.errors import LLMPerfError
from ..core.workload import SEQUENTIAL_FACTOR, SEQUENTIAL_TIME_CAP_S
from .refs import Reference, Worktrees, code_packages, resolve_reference
from .sides import CURRENT, REF, Side, SideGone, SideSpec, harness_link, start_all, wait_any


@dataclass
class TestOutcome:
    """What the controller knows of one test: the current side's serialized reports (empty when
    it crashed: ``failure`` says why), and the lines for its report."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Against:
    """The controller of one session's ``--llmperf-against`` (``open_against`` makes it)."""

    reference: Reference
    sides: dict[str, Side]
    alpha: float
    threshold: float
    tail_threshold: float
    family: int
    timeout_s: float
    harness_dir: Any = None  # the TemporaryDirectory of the harness link
    worktrees: Any = None  # refs.Worktrees: holds REF's worktree (a lease) until closed
    #: The labels of each test's measurements met so far: a test's second and later labelled
    #: measurement is one more member of Holm's family (``family`` counts each test once).
    labels_seen: dict[str, set[str]] = field(default_factory=dict)
    extra_measurements: int = 0

    def family_for(self, nodeid: str, label: str) -> int:
        """Holm's family size once this measurement is counted (the session's ``family_size``)."""
        from ..judge.compare import JUDGED

        labels = self.labels_seen.setdefault(nodeid, set())
        if label not in labels:
            labels.add(label)
            if len(labels) > 1:
                self.extra_measurements += 1
        return self.family + self.extra_measurements * len(JUDGED)

    def describe(self) -> list[str]:
        """The header lines: what each side is (after they started)."""
        out = []
        for side in self.sides.values():
            r = side.ready
            code = ", ".join(f"{k} from {v}" for k, v in (r.get("code") or {}).items() if v) or "no code of this tree"
            out.append(f"llmperf: against: {side.spec.name} = {side.spec.shown}: Python {r.get('python', '?')}, "
                       f"llama-cpp-python {r.get('llama_cpp') or '?'}, {code}")
        return out

    def start(self) -> None:
        start_all(list(self.sides.values()))

    def run_test(self, nodeid: str, next_nodeid: str | None) -> TestOutcome:
        """Both sides run the test; its measurements are interleaved and judged."""
        self.start()
        return drive(self, nodeid, next_nodeid)

    def close(self) -> None:
        for side in self.sides.values():
            side.close()
        if self.harness_dir is not None:
            self.harness_dir.cleanup()
            self.harness_dir = None
        if self.worktrees is not None:
            self.worktrees.close()
            self.worktrees = None


def open_against(
    text: str, rootdir: Path, cache_dir: Path, args: Sequence[str], cwd: str, *, alpha: float, threshold: float,
    tail_threshold: float, family: int, timeout_s: float,
) -> Against:
    """Resolve REF (a ConfigError names what is wrong), check out its worktree, and set up both
    sides (their processes start at the first test)."""
    reference = resolve_reference(text, rootdir)
    base, packages = code_packages(rootdir)
    here = rootdir / base
    ref_root, worktrees = here, None
    if reference.commit:
        worktrees = Worktrees(rootdir, cache_dir)
        ref_root = worktrees.checkout(reference.commit) / base
    harness = harness_link()
    specs = {
        CURRENT: SideSpec(CURRENT, "this tree", sys.executable, str(here), packages),
        REF: SideSpec(REF, reference.describe(), reference.python or sys.executable, str(ref_root), packages),
    }
    sides = {name: Side(spec, args, cwd, harness.name, timeout_s) for name, spec in specs.items()}
    return Against(reference, sides, alpha, threshold, tail_threshold, family, timeout_s, harness, worktrees)


def looks_for(runs: int, max_runs: Any) -> tuple[int, int]:
    """(the most pairs, the looks at them) for a measurement of ``runs`` runs."""
    cap = int(max_runs) if max_runs else SEQUENTIAL_FACTOR * runs
    cap = max(cap, runs)
    return cap, max(1, math.ceil(cap / runs))


class RunFailed(LLMPerfError):
    """A side's run raised (the user's callable, llama.cpp's error): the pairs stop."""


def _run(side: Side, index: int, timeout_s: float) -> Any:
    from ..measuring.worker import trace_of

    side.send({"op": "run", "index": index})
    reply = side.receive(timeout_s, f"run {index}" if index >= 0 else f"warm-up run {-index}")
    if reply.get("ev") == "error":
        raise RunFailed(f"{side.who}: {reply.get('line')}")
    if reply.get("ev") != "trace":
        raise side.kill(f"{side.who} answered {reply.get('ev')!r} to a run: it left its measurement; it was killed")
    return trace_of(reply["trace"])


def pairs(ag: Against, events: Mapping[str, Mapping[str, Any]], nodeid: str = "") -> tuple[list[Any], str]:
    """The measurement both sides wait at: warm-ups, then pairs in seeded AB/BA order (A: REF, B:
    the current side), looks until decided or the cap. Returns (comparisons, the note)."""
    from ..core.workload import Workload
    from ..judge.ab.paired import judged_pairs
    from ..judge.ab.run import block_orders
    from ..measuring.metrics import RunMetrics

    ev = events[CURRENT]
    workload = Workload(**ev["workload"])
    settings = {"alpha": ag.alpha, "threshold": ag.threshold, "tail_threshold": ag.tail_threshold,
                **{k: v for k, v in (ev.get("settings") or {}).items() if k in ("alpha", "threshold", "tail_threshold")}}
    cap, looks = looks_for(workload.runs, ev.get("max_runs"))
    family = ag.family_for(nodeid, str(ev.get("label") or ""))
    by_letter = {"A": ag.sides[REF], "B": ag.sides[CURRENT]}
    for i, order in enumerate(block_orders(workload.warmup, workload.seed + 1)):
        for letter in order:
            _run(by_letter[letter], -1 - i, ag.timeout_s)
    orders = block_orders(cap, workload.seed)
    runs: dict[str, list[Any]] = {"A": [], "B": []}
    started = time.monotonic()
    while True:
        start = len(runs["A"])
        for i in range(start, min(start + workload.runs, cap)):
            for letter in orders[i]:
                runs[letter].append(RunMetrics.of(_run(by_letter[letter], i, ag.timeout_s)))
        n = len(runs["A"])
        comparisons = judged_pairs(runs["A"], runs["B"], family=family, looks=looks,
                                   reference=ag.reference.describe(), **settings)
        undecided = any(c.worth_more_runs or _loose(c) for c in comparisons if c.mirror_of is None)
        # Each side gets the time a sequential measurement against a baseline gets: a pair is two runs.
        if not undecided or n >= cap or time.monotonic() - started > 2 * SEQUENTIAL_TIME_CAP_S:
            break
    n_ab = sum(1 for o in orders[:n] if o == "AB")
    ref, cur = ag.sides[REF].ready, ag.sides[CURRENT].ready
    same = "" if events[REF]["workload"] == ev["workload"] else "; REF's workload differs from this tree's"
    note = (f"against {ag.reference.describe()}: {n} pairs interleaved ({n_ab} AB, {n - n_ab} BA, seeded; "
            f"up to {cap} in {looks} look(s)) after {workload.warmup} warm-up run(s) each; llama-cpp-python "
            f"{ref.get('llama_cpp') or '?'} (REF) vs {cur.get('llama_cpp') or '?'} (this tree){same}")
    return comparisons, note


#: Under ``--llmperf-against`` an UNCHANGED stands once its 95% CI excludes 1 (a change within
#: the threshold, found) or lies within +- this share of the threshold (a change half the
#: threshold's size is ruled out); until then pairs are added, up to the cap.
UNCHANGED_MARGIN = 0.5


def _loose(c: Any) -> bool:
    """UNCHANGED by the rule (within the threshold at its 80%) while the 95% CI neither excludes
    1 nor lies within +-``UNCHANGED_MARGIN`` x the threshold: pairs are cheap here, so more are
    taken (up to the cap) before an "unchanged" stands that could hide a change of a few percent
    (a +3% change is then found, and stays UNCHANGED: within 5%)."""
    from ..judge.verdict import Verdict

    if c.verdict is not Verdict.UNCHANGED or c.ci_low is None or c.ci_high is None:
        return False
    if c.ci_low > 1.0 or c.ci_high < 1.0:
        return False
    margin = 1.0 + UNCHANGED_MARGIN * c.threshold
    return c.ci_high > margin or c.ci_low < 1.0 / margin


def solo(ag: Against, side: Side, event: Mapping[str, Any]) -> None:
    """A measurement with nothing to pair it with: its runs alone (budgets still apply)."""
    from ..core.workload import Workload

    workload = Workload(**event["workload"])
    for i in range(workload.warmup):
        _run(side, -1 - i, ag.timeout_s)
    for i in range(workload.runs):
        _run(side, i, ag.timeout_s)


def drive(ag: Against, nodeid: str, next_nodeid: str | None) -> TestOutcome:
    """Run one test on both sides (module docstring). A side that dies or hangs while the test
    runs fails it (named, with its signal or deadline) and is started again for the next test;
    REF without the test (it lacks a name the tests import) leaves it measured here alone."""
    from ..judge.result import comparison_json

    out = TestOutcome()
    cur, ref = ag.sides[CURRENT], ag.sides[REF]
    ref_missing = ref.missing(nodeid)
    for why in (cur.missing(nodeid), ref_missing):
        if why is not None and (why.fails or why is not ref_missing):
            out.failure = why.line
            return out
    active = [cur] if ref_missing else [cur, ref]
    state = {CURRENT: "busy", REF: "absent" if ref_missing else "busy"}
    events: dict[str, dict[str, Any]] = {}
    lost: dict[str, str] = {}
    told: set[str] = set()  # lines the test's report carries already (its failure, the verdict's note)

    def gone(side: Side, line: str) -> None:
        state[side.spec.name] = "dead"
        lost[side.spec.name] = line
        side.close()

    def finish(side: Side, **done: Any) -> None:
        state[side.spec.name] = "busy"
        side.send({"op": "done", **done})

    for side in active:
        try:
            side.send({"op": "test", "nodeid": nodeid, "next": next_nodeid})
        except SideGone as exc:
            gone(side, str(exc))
    while True:
        busy = [s for s in active if state[s.spec.name] == "busy"]
        if busy:
            ready = wait_any(busy, ag.timeout_s)
            if not ready:
                for side in busy:
                    gone(side, str(side.kill(f"{side.who} did not reach its next measurement or the test's end "
                                             f"within {ag.timeout_s:g} s; it was killed (--llmperf-engine-timeout)")))
                continue
            for side in ready:
                try:
                    event = side.receive(ag.timeout_s, f"running {nodeid}")
                except SideGone as exc:
                    gone(side, str(exc))
                    continue
                kind = event.get("ev")
                if kind in ("measure", "turn", "report"):
                    state[side.spec.name] = {"measure": "measure", "turn": "turn", "report": "done"}[kind]
                    events[side.spec.name] = event
                elif kind == "exit":
                    gone(side, str(side.kill(f"{side.who} ended its pytest session (exit status "
                                             f"{event.get('code', '?')}) while running {nodeid}")))
            continue
        turn = next((s for s in active if state[s.spec.name] == "turn"), None)
        waiting = {name for name, st in state.items() if st == "measure"}
        try:
            if turn is not None:
                state[turn.spec.name] = "busy"
                turn.send({"op": "go"})
            elif waiting == {CURRENT, REF}:
                try:
                    comparisons, note = pairs(ag, events, nodeid)
                except RunFailed as exc:
                    told.add(f"not measured: {exc}")
                    finish(cur, fail=f"not measured: {exc}")
                    finish(ref, fail=f"not measured: {exc}")
                    continue
                finish(cur, verdict={"status": "compared", "note": note,
                                     "comparisons": [comparison_json(c) for c in comparisons]})
                finish(ref)
            elif CURRENT in waiting and REF in lost:  # REF died or hung in this test: it fails
                told.add(lost[REF])
                finish(cur, fail=lost[REF])
            elif CURRENT in waiting:
                said = events.get(REF, {}).get("line")
                reason = ref_missing.line if ref_missing else (
                    f"{ref.who} ended the test before this measurement{f': {said}' if said else ''}")
                try:
                    solo(ag, cur, events[CURRENT])
                except RunFailed as exc:
                    finish(cur, fail=f"not measured: {exc}")
                    continue
                told.add(reason)
                finish(cur, verdict={"status": "not-compared", "note": f"not compared: {reason}"})
            elif REF in waiting:
                finish(ref, fail="the current side ended the test before this measurement")
            else:
                break
        except SideGone as exc:
            gone(ag.sides[exc.side], str(exc))
    if state[CURRENT] == "done":
        out.reports = events[CURRENT]["reports"]
    else:
        out.failure = lost.get(CURRENT, f"{cur.who} did not finish {nodeid}")
    if ref_missing is not None and ref_missing.line not in told:
        out.notes.append(f"not compared: {ref_missing.line}")
    elif REF in lost and lost[REF] not in told:
        out.notes.append(lost[REF])
    elif state[REF] == "done" and events[REF].get("outcome") == "failed":
        out.notes.append(f"{ref.who}: the test failed there: {events[REF].get('line')}")
    return out
