"""``--llmperf-against REF``: every llmperf test measured on two sides, interleaved pair by pair,
and the current side judged against REF with paired statistics (docs/against.md). No pytest.

Each side is a long-lived process of the same shape (``pytest_plugin/side.py``): a pytest
session of the current tests whose code under test comes from the side's tree (the current
one, or REF's git worktree) and whose interpreter is the side's (this one, or REF's
``python:PATH``). The controller here names the test both sides run; each side runs it up to
its first measurement and waits; then the controller asks for the warm-ups and the runs, one
side at a time (step by step where both sides' engines can pause between tokens: ``Pairing``),
in seeded AB/BA order per pair, adds pairs while the verdict is undecided (up to
the cap, every look at alpha / looks), judges them (``judge.paired.judged_pairs``) and hands
each side its measurement's end. The current side's reports become the test's. A measurement's
pairs run over 2 or more process pairs (``Processes``: fresh processes of both sides, started for
it and closed after it), judged by a model of both levels (``judge.paired.two_level_ci``).

The sides' processes and their events are ``session/sides.py``'s; ``drive`` steps one test
through each side's ``SideState`` on those events."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import LLMPerfError
from ..core.formats import sig6
from ..core.measurement import Attribution
from ..core.progress import current, task
from ..core.settings import DEFAULT_MAX_PROCESSES, usable_cpus
from ..core.workload import SEQUENTIAL_FACTOR, RunTrace, Workload, drawn
from ..engines.capabilities import NeedsPromptIds, TokenProbabilities
from ..judge.attribution import compare_attributions, moved_phases
from ..judge.attribution import why as why_attribution
from ..judge.paired import FIRST_BLOCK, PAIRS_PER_PROCESS, Levels, needs_more_pairs, pairs_per_process
from ..judge.paired import look as at_look
from ..judge.parts import explained_phases, gated, paired_parts, prompt_changes
from ..judge.result import comparison_json
from ..judge.rule import JUDGED
from ..judge.verdict import BaselineStatus, Verdict
from ..measuring.agreement import compare_outputs
from ..measuring.attribution import interleaved
from ..measuring.interleave import Interleaved, block_orders, pass_orders, turns
from ..measuring.metrics import run_metrics
from ..measuring.worker import idlest_cpus, logits_of
from .refs import Project, Reference, Worktrees, code_packages, resolve_reference
from .sides import (
    CURRENT,
    REF,
    Attributed,
    Exit,
    Logits,
    Measure,
    Missing,
    Paused,
    Released,
    Report,
    RunError,
    Side,
    SideEvent,
    SideGone,
    SideSpec,
    Trace,
    Turn,
    Unstepped,
    harness_link,
    start_all,
    wait_any,
)

if TYPE_CHECKING:
    from ..core.measurement import Agreement, RunMetrics
    from ..core.workload import TokenLogits
    from ..judge.parts import PartChange
    from ..judge.verdict import Comparison


@dataclass
class TestOutcome:
    """What the controller knows of one test: the current side's serialized reports (empty when
    it crashed: ``failure`` says why), and the lines for its report."""

    reports: list[dict[str, object]] = field(default_factory=list)
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
    worktrees: Worktrees | None = None  # holds REF's worktree (a lease) until closed
    #: The most processes per side a measurement's pairs run in (``--llmperf-max-processes``;
    #: a marker's ``max_processes`` wins): ``Processes``.
    max_processes: int = DEFAULT_MAX_PROCESSES
    #: The labels of each test's measurements met so far: a test's second and later labelled
    #: measurement is one more member of Holm's family (``family`` counts each test once).
    labels_seen: dict[str, set[str]] = field(default_factory=dict)
    extra_measurements: int = 0
    #: Per measurement compared, what its decision cost: test, pairs, seconds of pairs (warm-ups
    #: excluded), the look it stopped at of how many, and why (``pairs``).
    decisions: list[dict[str, object]] = field(default_factory=list)

    def family_for(self, nodeid: str, label: str) -> int:
        """Holm's family size once this measurement is counted (the session's ``family_size``)."""
        labels = self.labels_seen.setdefault(nodeid, set())
        if labels and label not in labels:  # a test's later labels: new members
            self.extra_measurements += 1
        labels.add(label)
        return self.family + self.extra_measurements * len(JUDGED)

    def start(self) -> None:
        start_all(list(self.sides.values()))

    def run_test(self, nodeid: str, next_nodeid: str | None) -> TestOutcome:
        """Both sides run the test; its measurements are interleaved and judged (its progress on
        one line: ``core.progress``; the heartbeat's while a side works on its own)."""
        with task(f"against {self.reference.describe()}: {nodeid}") as progress:
            progress.step("starting the sides")
            self.start()
            progress.step("the sides run the test")
            return drive(self, nodeid, next_nodeid)

    def close(self) -> None:
        for side in self.sides.values():
            side.close()
        if self.worktrees is not None:
            self.worktrees.close()
            self.worktrees = None


def open_against(
    text: str,
    project: Project,
    cache_dir: Path,
    args: Sequence[str],
    cwd: str,
    *,
    alpha: float,
    threshold: float,
    tail_threshold: float,
    family: int,
    timeout_s: float,
    max_processes: int = DEFAULT_MAX_PROCESSES,
) -> Against:
    """Resolve REF (a ConfigError names what is wrong), check out its worktree (the project's
    folder mapped into it, its submodules filled), and set up both sides (their processes start
    at the first test)."""
    reference = resolve_reference(text, project.where)
    base, packages = code_packages(project.folder)
    here = project.folder / base
    ref_root, worktrees = here, None
    if reference.commit and project.top is not None:
        worktrees = Worktrees(project.top, cache_dir)
        inside = here.relative_to(project.top)
        needed = [(inside / name).as_posix() for name in packages] or [inside.as_posix()]
        with task(f"against {reference.describe()}") as progress:
            progress.step("checking out its worktree")
            ref_root = project.in_worktree(worktrees.checkout(reference.commit, needed)) / base
    harness = harness_link(cache_dir)
    specs = {
        CURRENT: SideSpec(CURRENT, "this tree", sys.executable, str(here), packages),
        REF: SideSpec(REF, reference.describe(), reference.python or sys.executable, str(ref_root), packages),
    }
    sides = {name: Side(spec, args, cwd, str(harness), timeout_s) for name, spec in specs.items()}
    return Against(reference, sides, alpha, threshold, tail_threshold, family, timeout_s, worktrees, max_processes)


def describe_sides(against: Mapping[str, Any] | None, *, verbose: bool = False) -> list[str]:
    """The session's last lines: what each side was (``Session.against_sides``: the controller's,
    or an xdist worker's shipped on its reports); ``verbose`` (``-v``): what each level of each
    decision's pairs contributed."""
    sides = ((against or {}).get("sides") or {}).items()
    decisions = (against or {}).get("decisions") or ()
    lines = [_side_line(name, side) for name, side in sides]
    for d in decisions:
        lines.append(_decision_line(d))
        if verbose:
            lines += [f"llmperf: against: {d.get('test')}: {_levels_line(one)}" for one in d.get("levels") or ()]
    return lines


def _levels_line(one: Mapping[str, object]) -> str:
    """A decision's stored levels of one metric (``Levels.to_json``) as ``Levels.line`` says them."""
    try:
        counts = (int(str(one["process_pairs"])), int(str(one["pairs"])))
        sds = (float(str(one["between_sd"])), float(str(one["within_sd"])))
        return Levels(str(one["metric"]), *counts, *sds).line()
    except (KeyError, ValueError):
        return f"levels not readable: {one!r}"[:200]


def _side_line(name: str, side: Mapping[str, Any]) -> str:
    code = ", ".join(f"{k} from {v}" for k, v in (side.get("code") or {}).items() if v) or "no code of this tree"
    return (
        f"llmperf: against: {name} = {side.get('shown')}: Python {side.get('python') or '?'}, "
        f"llama-cpp-python {side.get('llama_cpp') or '?'}, {code}"
    )


def _decision_line(d: Mapping[str, Any]) -> str:
    processes = int(d.get("processes") or 1)
    started = f"; {processes} process pairs, the extra ones started in {float(d.get('start_s') or 0):.1f} s"
    return (
        f"llmperf: against: {d.get('test')}: {d.get('pairs')} pairs in {float(d.get('seconds') or 0):.1f} s "
        f"(look {d.get('look')} of {d.get('looks')}: {d.get('stopped')}){started if processes > 1 else ''}"
    )


#: The pairs are judged every ``runs`` x this many pairs (10 of the default 20): a look costs
#: its share of alpha (alpha / looks), and a measurement whose verdict cannot change stops at
#: the first look that shows it (``judge.paired.pairs_settled``).
LOOK_SHARE = 0.5
#: No look before this many pairs: the signed-rank 95% CI needs 6; 10 give it some room.
MIN_LOOK_PAIRS = 10


def looks_for(runs: int, max_runs: Any) -> tuple[int, int, int]:
    """(the most pairs, the looks at them, the pairs between looks) for a measurement of
    ``runs`` runs: a look every ``LOOK_SHARE`` x runs pairs (at least ``MIN_LOOK_PAIRS``, at most
    runs), the last at the cap."""
    cap = int(max_runs) if max_runs else SEQUENTIAL_FACTOR * runs
    cap = max(cap, runs)
    step = min(max(math.ceil(LOOK_SHARE * runs), MIN_LOOK_PAIRS), runs)
    return cap, max(1, math.ceil(cap / step)), step


class RunFailed(LLMPerfError):
    """A side's run raised (the user's callable, llama.cpp's error): the pairs stop."""


def _run(side: Side, index: int, timeout_s: float, cpus: Sequence[int] | None = None) -> RunTrace:
    side.send({"op": "run", "index": index, "cpus": list(cpus or ())})
    reply = side.receive(timeout_s, f"run {index}" if index >= 0 else f"warm-up run {-index}")
    if isinstance(reply, RunError):
        raise RunFailed(f"{side.who}: {reply.line}")
    if not isinstance(reply, Trace):
        raise side.kill(f"{side.who} answered {reply.ev!r} to a run: it left its measurement; it was killed")
    return RunTrace.from_json(reply.trace)


class SideLogits(TokenProbabilities):
    """A side's engine as ``measuring.agreement`` sees it: its token probabilities, asked over
    the side's pipe ("logits") once the pairs are done; ``of``: as its "measure" event said."""

    def __init__(self, side: Side, timeout_s: float) -> None:
        self.side, self.timeout_s = side, timeout_s

    @staticmethod
    def of(side: Side, event: Mapping[str, object], timeout_s: float) -> SideLogits | None:
        if not event.get("logits"):
            return None  # the side's engine gives none
        return (SideIdLogits if event.get("needs_ids") else SideLogits)(side, timeout_s)

    def token_logits(
        self, workload: Workload, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> TokenLogits | str:
        self.side.send(
            {
                "op": "logits",
                "workload": asdict(workload),
                "forced": None if forced is None else list(forced),
                "prompt_ids": None if prompt_ids is None else list(prompt_ids),
            }
        )
        reply = self.side.receive(self.timeout_s, "reading its token probabilities")
        if not isinstance(reply, Logits):
            raise self.side.kill(f"{self.side.who} answered {reply.ev!r} to a logits request; it was killed")
        return reply.line if reply.line is not None else logits_of(reply.got)


class SideIdLogits(SideLogits, NeedsPromptIds):
    needs_prompt_ids = True  # the side's engine takes the prompt as the other side's token ids (an endpoint)


def pairs(ag: Against, events: Mapping[str, Mapping[str, Any]], nodeid: str) -> tuple[Looked, str, Agreement]:
    """The measurement both sides wait at: warm-ups, then pairs in seeded AB/BA order (A: REF, B:
    the current side) over the measurement's process pairs (``Processes``), looks until decided
    or the cap, then the output agreement. Returns (where the pairs stopped: comparisons and
    parts, the note, the ``Agreement``)."""
    ev = events[CURRENT]
    workload = Workload(**ev["workload"])
    cap, looks, step = looks_for(workload.runs, ev.get("max_runs"))
    by_letter = {"A": ag.sides[REF], "B": ag.sides[CURRENT]}
    threads = max(int(events[name].get("threads") or usable_cpus()) for name in (CURRENT, REF))
    cpus = idlest_cpus(threads)  # the same CPUs for both sides (idlest_cpus says why)
    pairing = Pairing(by_letter, ag.timeout_s, cpus, all(events[name].get("stepped") for name in (CURRENT, REF)))
    budget = int(ev.get("max_processes") or ag.max_processes)
    processes = Processes(ag, nodeid, str(ev.get("label") or ""), pairing, budget)
    try:
        with task(f"measurement {ev['label']}" if ev.get("label") else "measurement") as progress:
            progress.step("warm-up pairs", 0, workload.warmup)
            _warm_up(pairing, workload)
            looked = _looks(processes, workload, (cap, looks, step), _judging(ag, ev, nodeid))
            progress.step("output agreement")  # this tree's outputs against REF's (REF is A), after every pair
            ref, cur = (SideLogits.of(ag.sides[name], events[name], ag.timeout_s) for name in (REF, CURRENT))
            agreement = compare_outputs(ref, cur, workload, a_name=f"REF {ag.reference.describe()}", b_name="this tree")
    finally:
        processes.close()
    test = nodeid + (f"[{ev['label']}]" if ev.get("label") else "")
    ag.decisions.append({"test": test, "pairs": looked.n, "seconds": round(looked.seconds, 3), "look": looked.look})
    ag.decisions[-1].update(looks=looks, stopped=looked.why, interleaved=processes.interleaved.value)
    if processes.started > 1:
        ag.decisions[-1].update(
            processes=processes.started,
            start_s=round(processes.start_s, 3),
            levels=[one.to_json() for one in looked.levels],
        )
    kept = by_request(workload, looked.runs)
    if kept is not None:  # a prompt set: each side's TTFT by the request each run sent (the HTML chart)
        ag.decisions[-1]["by_request"] = kept
    same = "" if events[REF]["workload"] == ev["workload"] else "; REF's workload differs from this tree's"
    note = _pairs_note(ag, workload, looked, (cap, looks, step), processes) + same
    return looked, note, agreement


def by_request(workload: Workload, runs: Mapping[str, Sequence[RunMetrics]]) -> dict[str, Any] | None:
    """A prompt set's pairs as the HTML report draws them (TTFT against prompt length, REF and
    this tree): the request each pair's runs sent (run i sends ``drawn(set, seed, i)`` on both
    sides), and per side each run's prompt tokens and TTFT; None without a set, or where a
    side's run did not count its prompt's tokens."""
    if workload.prompt_set is None:
        return None
    out: dict[str, Any] = {"request": [drawn(workload.prompt_set, workload.seed, i) for i in range(len(runs["B"]))]}
    for letter, name in (("A", REF), ("B", CURRENT)):
        lengths = [r.prompt_tokens for r in runs[letter]]
        if any(n is None for n in lengths):
            return None
        out[name] = {"prompt_tokens": lengths, "ttft_ms": [sig6(r.ttft_ms) for r in runs[letter]]}
    return out


class Processes:
    """A measurement's process pairs (docs/against.md, "Processes"): the pairs run in blocks,
    each block on a fresh pair of side processes (fresh placement in memory and on the cores),
    the first on the test's own pair of sides. A block's process pair is started for it, runs
    the test up to the same measurement, warms up, runs its pairs, and is closed before the next
    one starts; its start-up and close lie outside every timed region and are counted
    (``start_s``). The block sizes: ``FIRST_BLOCK`` for the first two, then chosen from the
    measured levels and costs (``judge.paired.pairs_per_process``). A budget of 1: every pair on
    the test's own sides (one level). At most the test's own sides and one block's are alive."""

    def __init__(self, ag: Against, nodeid: str, label: str, first: Pairing, budget: int) -> None:
        self.ag, self.nodeid, self.label, self.budget = ag, nodeid, label, max(budget, 1)
        self.own = first
        self.live = first  # the process pair the current block runs on
        self.group = 0  # its number: 0 for the test's own sides
        self.started = 1  # process pairs used so far, the test's own one included
        self.live_sides: list[Side] = []  # the current block's sides when they are not the test's
        self.turns = {first.interleaved}
        self.unstepped: str | None = None
        self.start_s = 0.0
        self.unavailable: str | None = None  # why no more process pairs could start

    @property
    def interleaved(self) -> Interleaved:
        return Interleaved.RUN if Interleaved.RUN in self.turns else Interleaved.TOKEN

    @property
    def full(self) -> bool:
        """No fresh process pair may start: the budget is used (a budget of 1 never is)."""
        return self.budget > 1 and self.started >= self.budget

    def pair(self, i: int, order: str) -> dict[str, RunTrace]:
        try:  # a block's process pair lost: the pairs stop, the test's own sides go on
            traces = self.live.pair(i, order)
        except SideGone as exc:
            if self.live is self.own:
                raise
            raise RunFailed(f"process pair {self.group + 1}: {exc}") from None
        self.turns.add(self.live.interleaved)
        self.unstepped = self.unstepped or self.live.unstepped
        return traces

    def next_block(self, workload: Workload, first: bool) -> int:
        """Start the next block's process pair (the test's own for the first block, and for
        every block with a budget of 1 or when no fresh one can start): its group number."""
        began = time.monotonic()  # the last block's close counts as this one's start
        self.close()
        self.live, self.group = self.own, 0
        if first or self.budget < 2 or self.unavailable is not None:
            return 0
        sides = {name: Side(s.spec, s.args, s.cwd, s.harness, s.timeout_s) for name, s in self.ag.sides.items()}
        current().step(f"starting process pair {self.started + 1}")
        try:
            pairing = self._start(sides, workload)
        except (SideGone, RunFailed) as exc:
            self.unavailable = f"process pair {self.started + 1} did not start: {exc}"
            for side in sides.values():
                side.close()
            return 0
        finally:
            self.start_s += time.monotonic() - began
        self.live_sides = list(sides.values())
        self.live, self.group = pairing, self.started
        self.started += 1
        return self.group

    def _start(self, sides: Mapping[str, Side], workload: Workload) -> Pairing:
        start_all(list(sides.values()))
        for side in sides.values():
            if (missing := side.missing(self.nodeid)) is not None:
                raise SideGone(missing.line, side.spec.name)
            side.send({"op": "test", "nodeid": self.nodeid, "next": None})
        reached = [_reach(side, self.label, self.ag.timeout_s) for side in sides.values()]  # every side, always
        stepped = all(bool(event.get("stepped")) for event in reached)
        pairing = Pairing({"A": sides[REF], "B": sides[CURRENT]}, self.ag.timeout_s, self.own.cpus, stepped)
        _warm_up(pairing, workload)
        return pairing

    def close(self) -> None:
        """The current block's process pair closed (never the test's own sides)."""
        for side in self.live_sides:
            side.close()
        self.live_sides = []


def _reach(side: Side, label: str, timeout_s: float) -> Mapping[str, object]:
    """Run a fresh side's test up to the measurement labelled ``label`` (an exclusive turn on the
    way is granted, an earlier measurement ended unjudged): its "measure" event's data."""
    while True:
        event = side.receive(timeout_s, "reaching the measurement")
        if isinstance(event, Measure) and str(event.data.get("label") or "") == label:
            return event.data
        if isinstance(event, Measure):
            side.send({"op": "done"})
        elif isinstance(event, Turn):
            side.send({"op": "go"})
        elif not isinstance(event, Released):
            raise SideGone(f"{side.who} ended the test before this measurement ({event.ev})", side.spec.name)


def _undecided(c: Comparison) -> bool:
    """Not decided yet: more pairs may move it (``needs_more_pairs``), or INCONCLUSIVE."""
    return bool(needs_more_pairs(c)) or c.verdict is Verdict.INCONCLUSIVE


def held_by_budget(comparisons: Sequence[Comparison], why: str) -> list[Comparison]:
    """The comparisons of pairs the process budget stopped: each one more pairs could still have
    moved is INCONCLUSIVE, its reason the budget's (its reach the one it got), its rate too."""
    held = {c.metric for c in comparisons if c.mirror_of is None and _undecided(c)}
    reason = f"cannot decide: {why}; raise max_processes (--llmperf-max-processes)"
    return [
        dataclasses.replace(c, verdict=Verdict.INCONCLUSIVE, reason=reason, runs_needed=None)
        if c.metric in held or c.mirror_of in held
        else c
        for c in comparisons
    ]


#: A step of a side's attribution pass (an instrumented run, its prompt steps and a plain run)
#: may take this many times the engine timeout.
ATTRIBUTION_STEP_RUNS = 10


class NoPass(LLMPerfError):
    """A side has no attribution pass (its engine is no llama.cpp engine, the pass failed): why."""


class SidePass:
    """A side's attribution pass as ``measuring.attribution.Stepping``: each step an "attribute"
    op over the side's pipe, in the side's process; ``figures`` its roofline and memory figures
    once its result came."""

    def __init__(self, side: Side, timeout_s: float, workload: Workload) -> None:
        self.side, self.timeout_s = side, timeout_s * ATTRIBUTION_STEP_RUNS
        self.figures: dict[str, float] = {}
        self.open = False
        self._step("open")
        self.open = True

    def _step(self, step: str, **more: object) -> Attributed:
        self.side.send({"op": "attribute", "step": step, **more})
        reply = self.side.receive(self.timeout_s, "running its attribution pass")
        if not isinstance(reply, Attributed):
            raise self.side.kill(f"{self.side.who} answered {reply.ev!r} to an attribution step; it was killed")
        if reply.line is not None:
            self.open = False
            raise NoPass(f"{self.side.who}: {reply.line}")
        return reply

    def warm_up(self) -> None:
        self._step("warm")

    def run(self, index: int) -> None:
        self._step("run", index=index)

    def result(self) -> Attribution:

        reply = self._step("result")
        self.open = False
        self.figures = dict(reply.figures or {})
        return Attribution.from_json(reply.got)

    def close(self) -> None:
        if self.open:
            self.open = False
            self._step("close")


def attribution(
    ag: Against, measures: Mapping[str, Measure], parts: Sequence[PartChange]
) -> dict[str, Any] | str | None:
    """After the pairs, when the test asked for it on either side or llama.cpp's time moved:
    both sides' attribution passes, each in its side's process, interleaved run by run in
    seeded AB/BA order as the pairs were, compared (``judge.attribution``), as the verdict's
    JSON; a line when a side has none (asked, or the pass failed); else None."""

    asked = any(bool(m.data.get("attribution")) for m in measures.values())
    reason = why_attribution(asked, moved_phases(parts))
    able = all(bool(m.data.get("attributable")) for m in measures.values())
    if reason is None or not (asked or able):
        return None  # not due, or due by itself where a side cannot have it (a callable): nothing to say
    data: Mapping[str, Any] = measures[CURRENT].data
    workload = Workload(**data["workload"])
    passes: dict[str, SidePass] = {}
    try:
        for letter, name in (("A", REF), ("B", CURRENT)):
            passes[letter] = SidePass(ag.sides[name], ag.timeout_s, workload)
        got = interleaved(passes, *pass_orders(workload.seed))
    except NoPass as exc:
        for one in passes.values():
            with contextlib.suppress(NoPass):
                one.close()
        return f"attribution not run ({reason}): {exc}"
    change = compare_attributions(
        got["A"],
        got["B"],
        reason=reason,
        a_name=f"REF {ag.reference.describe()}",
        b_name="this tree",
        sides={"A": passes["A"].figures, "B": passes["B"].figures},
    )
    return change.to_json()


def _judging(ag: Against, ev: Mapping[str, Any], nodeid: str) -> dict[str, Any]:
    """``judged_pairs``' keywords for this measurement: the session's alpha and thresholds (the
    marker's where it sets them), its family size and REF's name."""
    settings = {"alpha": ag.alpha, "threshold": ag.threshold, "tail_threshold": ag.tail_threshold}
    settings.update({k: v for k, v in (ev.get("settings") or {}).items() if k in settings})
    family = ag.family_for(nodeid, str(ev.get("label") or ""))
    return {**settings, "family": family, "reference": ag.reference.describe()}


def _warm_up(pairing: Pairing, workload: Workload) -> None:

    for i, order in enumerate(block_orders(workload.warmup, workload.seed + 1)):
        pairing.pair(-1 - i, order)
        current().advance(i + 1)


class Pairing:
    """How one measurement's pairs run on the two sides (``by_letter``: A is REF, B this tree).

    Token by token while both sides' engines can pause between tokens (``SteppedRuns``, their
    "measure" events' ``stepped``): both runs start paused; then each side takes one step (the
    prompt, then one token) in turn, the first side of the pair's order first, the order turning
    at every step; a side that has finished its run is passed over. The machine's speed drifts
    over tenths of a second on a shared VM; two runs a second apart see different speeds, two
    steps a few milliseconds apart the same. Else, and from the first run that showed it could
    not pause (``Unstepped``: the pair is taken again whole), run by run: each side's whole run
    in the pair's order."""

    def __init__(
        self, by_letter: Mapping[str, Side], timeout_s: float, cpus: Sequence[int] | None, stepped: bool
    ) -> None:
        self.sides, self.timeout_s, self.cpus = by_letter, timeout_s, cpus
        self.interleaved = Interleaved.TOKEN if stepped else Interleaved.RUN
        self.unstepped: str | None = None  # why token by token stopped (the side's line)

    def pair(self, index: int, order: str) -> dict[str, RunTrace]:
        """Run ``index`` (< 0: a warm-up) on both sides: each side's trace by its letter."""
        if self.interleaved is Interleaved.TOKEN:
            traces = self._stepped(index, order)
            if traces is not None:
                return traces
        return {letter: _run(self.sides[letter], index, self.timeout_s, self.cpus) for letter in order}

    def _stepped(self, index: int, order: str) -> dict[str, RunTrace] | None:
        """One pair token by token; None when a side could not pause (then run by run)."""
        what = f"run {index}" if index >= 0 else f"warm-up run {-index}"
        for letter in order:
            self.sides[letter].send({"op": "run", "index": index, "cpus": list(self.cpus or ()), "stepped": True})
        waiting = set(order)  # sides whose answer is still to be read
        traces: dict[str, RunTrace] = {}
        open_ = list(order)
        turn = 0
        while open_:
            for letter in open_[:] if turn % 2 == 0 else open_[::-1]:
                if turn > 0:  # the first turn reads each side's pause before its run starts
                    self.sides[letter].send({"op": "go"})
                    waiting.add(letter)
                ended = self._answer(letter, what, traces, waiting)
                if self.interleaved is Interleaved.RUN:
                    return None  # both sides' runs have ended (``_answer``)
                if ended:
                    open_.remove(letter)
            turn += 1
        return traces

    def _answer(self, letter: str, what: str, traces: dict[str, RunTrace], waiting: set[str]) -> bool:
        """A side's answer to a step: False while it waits for its next one; True when its run
        ended (its trace kept). A failed run or one that cannot pause lets the other side's run
        end first, so that both sides wait at their measurement again."""
        side = self.sides[letter]
        reply = side.receive(self.timeout_s, what)
        waiting.discard(letter)
        if isinstance(reply, Paused):
            return False
        if isinstance(reply, Trace):
            traces[letter] = RunTrace.from_json(reply.trace)
            return True
        if isinstance(reply, (RunError, Unstepped)):
            for other in self.sides:
                if other != letter:
                    self._finish(other, what, waiting, paused=other not in waiting and other not in traces)
            if isinstance(reply, RunError):
                raise RunFailed(f"{side.who}: {reply.line}")
            self.interleaved, self.unstepped = Interleaved.RUN, f"{side.who}: {reply.line}"
            return True
        raise side.kill(f"{side.who} answered {reply.ev!r} to a step of a run: it left its measurement; it was killed")

    def _finish(self, letter: str, what: str, waiting: set[str], *, paused: bool) -> None:
        """Steps for a side until its run ends (its trace dropped): its answer read if one is
        due, "go" while it pauses."""
        side = self.sides[letter]
        while True:
            if letter in waiting:
                waiting.discard(letter)
                reply = side.receive(self.timeout_s, what)
                paused = isinstance(reply, Paused)
            if not paused:
                return
            side.send({"op": "go"})
            waiting.add(letter)


@dataclass(frozen=True)
class Looked:
    """Where the pairs stopped: the comparisons at the last look, the pairs, the looks taken,
    why they stopped, their seconds, and the AB/BA order of each pair."""

    comparisons: list[Comparison]
    n: int
    look: int
    why: str
    seconds: float
    orders: Sequence[str]
    #: Where the change went: each phase's parts over the same pairs (``judge.parts``).
    parts: tuple[PartChange, ...] = ()
    #: What differs between the sides' requests beyond the timings ("prompt tokens 22 -> 170").
    changes: tuple[str, ...] = ()
    #: What each level contributed per judged metric (two process pairs or more; ``judge.paired.Levels``).
    levels: tuple[Levels, ...] = ()
    #: Each side's runs of the pairs by letter (A: REF, B: this tree), pair i's run i of each.
    runs: Mapping[str, Sequence[RunMetrics]] = field(default_factory=dict)


def _looks(processes: Processes, workload: Workload, plan: tuple[int, int, int], judging: Mapping[str, Any]) -> Looked:
    """Pairs in blocks, each block on a fresh process pair (``Processes``), a look at the first
    block's end at or past every ``step`` pairs, until settled, the cap, the bound or the process
    budget."""
    cap, looks, step = plan
    orders = block_orders(cap, workload.seed)
    runs: dict[str, list[RunMetrics]] = {"A": [], "B": []}
    groups: list[int] = []  # each pair's process pair
    started, start_s = time.monotonic(), processes.start_s
    look, size = 0, min(FIRST_BLOCK, max(PAIRS_PER_PROCESS[0], step // 2))
    levels: tuple[Levels, ...] = ()
    progress = current()
    while True:
        n = len(runs["A"])
        group = processes.next_block(workload, first=n == 0)
        progress.step(f"look {look + 1} of at most {looks}: pairs", n, cap)
        for i in range(n, min(n + size, cap)):
            groups.append(group)
            for letter, trace in processes.pair(i, orders[i]).items():
                runs[letter].append(run_metrics(trace))
            progress.advance(i + 1)
        n = len(runs["A"])
        if n < cap and n < step * (look + 1):
            continue  # the next look comes at a later block's end
        look += 1
        seen = at_look(runs["A"], runs["B"], cap=cap, looks=looks, groups=groups, **judging)
        comparisons, why, levels = seen.comparisons, seen.why, seen.levels
        if why is None and time.monotonic() - started > PAIRS_TIME_CAP_S:
            why = f"the {PAIRS_TIME_CAP_S:.0f} s bound"
        if why is None and processes.full:
            why = f"the budget of {processes.budget} process pairs (max_processes) reached"
            comparisons = held_by_budget(comparisons, why)
        seconds = time.monotonic() - started - (processes.start_s - start_s)  # a process pair's start: not pairs
        if why is not None:
            parts = gated(paired_parts(runs["A"], runs["B"], alpha=judging["alpha"]), explained_phases(comparisons))
            changes = prompt_changes(runs["A"][0].prompt_tokens, runs["B"][0].prompt_tokens)
            return Looked(comparisons, n, look, why, seconds, orders, parts, changes, levels, runs)
        if len(set(groups)) > 1:  # the next blocks' size from the levels of what is not decided yet
            unsettled = {c.metric for c in comparisons if c.mirror_of is None and _undecided(c)}
            # The costs as measured so far: a fresh process pair's start-up, one pair (seconds).
            costs = processes.start_s / max(processes.started - 1, 1), seconds / max(n, 1)
            size = min(pairs_per_process([one for one in levels if one.metric in unsettled], *costs), step)


def _pairs_note(
    ag: Against, workload: Workload, looked: Looked, plan: tuple[int, int, int], processes: Processes
) -> str:
    cap, looks, step = plan
    cpus = processes.own.cpus
    how = turns(processes.interleaved, processes.unstepped)
    n = looked.n
    n_ab = sum(1 for o in looked.orders[:n] if o == "AB")
    ref, cur = ag.sides[REF].ready, ag.sides[CURRENT].ready
    return (
        f"against {ag.reference.describe()}: {n} pairs interleaved {how} ({n_ab} AB, {n - n_ab} BA, seeded; "
        f"{looked.seconds:.1f} s; look {looked.look} of {looks}, a look every {step} pairs up to {cap}: {looked.why}) "
        f"after {workload.warmup} warm-up run(s) each"
        f"{'' if cpus is None else '; both on CPU ' + ','.join(map(str, cpus))}; llama-cpp-python "
        f"{ref.get('llama_cpp') or '?'} (REF) vs {cur.get('llama_cpp') or '?'} (this tree)"
        f"{_processes_note(processes)}"
    )


def _processes_note(processes: Processes) -> str:
    """The process level in the pairs' note: how many process pairs, their start-up's seconds
    (outside every timed region), why no more could start; nothing with a budget of 1."""
    if processes.budget < 2:
        return ""
    note = (
        f"; {processes.started} process pair(s) of at most {processes.budget}, the pairs in blocks, each "
        f"block on a fresh one, their start {processes.start_s:.1f} s (outside the timed runs)"
    )
    return note + (f"; {processes.unavailable}" if processes.unavailable else "")


#: The pairs of one measurement stop at the run cap; this bound is for tests whose runs take
#: seconds each. It is not the baseline mode's 120 s: on a loaded runner the pairs are slower
#: exactly when noise needs more of them, and a time cap then decides with fewer pairs (60 pairs
#: of the small preset, pp32 tg64, take about 5 minutes with one of 2 cores busy).
PAIRS_TIME_CAP_S = 900.0


def solo(ag: Against, side: Side, event: Mapping[str, Any]) -> None:
    """A measurement with nothing to pair it with: its runs alone (budgets still apply)."""
    workload = Workload(**event["workload"])
    with task("measurement alone") as progress:
        progress.step("warm-up runs", 0, workload.warmup)
        for i in range(workload.warmup):
            _run(side, -1 - i, ag.timeout_s)
        progress.step("runs", 0, workload.runs)
        for i in range(workload.runs):
            _run(side, i, ag.timeout_s)
            progress.advance(i + 1)


class SideState(enum.Enum):
    """Where one side is in the test ``drive`` runs on it."""

    BUSY = "busy"  # running: its next event is awaited
    ABSENT = "absent"  # REF without the test: the current side is measured alone
    MEASURE = "measure"  # waits at a measurement (``Measure``) for its runs
    TURN = "turn"  # asks for an exclusive turn (``Turn``)
    DONE = "done"  # ended the test (``Report``)
    DEAD = "dead"  # died, hung or ended its session (``Drive.lost`` says why)


#: The events that move a side that runs to where it waits.
WAITS = {Measure: SideState.MEASURE, Turn: SideState.TURN, Report: SideState.DONE}


def drive(ag: Against, nodeid: str, next_nodeid: str | None) -> TestOutcome:
    """Run one test on both sides (module docstring). A side that dies or hangs while the test
    runs fails it (named, with its signal or deadline) and is started again for the next test;
    REF without the test (it lacks a name the tests import) leaves it measured here alone."""
    ref_missing = ag.sides[REF].missing(nodeid)
    for why in (ag.sides[CURRENT].missing(nodeid), ref_missing):
        if why is not None and (why.fails or why is not ref_missing):
            return TestOutcome(failure=why.line)
    return Drive(ag, nodeid, ref_missing).run(next_nodeid)


class Drive:
    """One test on both sides: each side's state, its last measurement and report, and the
    line of each side lost. While a side runs, its events move it (``listen``); once none
    runs, the controller acts on where they wait (``step``) until both are done or lost."""

    def __init__(self, ag: Against, nodeid: str, ref_missing: Missing | None) -> None:
        self.ag, self.nodeid, self.ref_missing = ag, nodeid, ref_missing
        self.cur, self.ref = ag.sides[CURRENT], ag.sides[REF]
        self.active = [self.cur] if ref_missing else [self.cur, self.ref]
        self.state = {CURRENT: SideState.BUSY, REF: SideState.ABSENT if ref_missing else SideState.BUSY}
        self.measures: dict[str, Measure] = {}
        self.reports: dict[str, Report] = {}
        self.lost: dict[str, str] = {}
        self.told: set[str] = set()  # lines the test's report carries already (its failure, the verdict's note)
        #: The sides this controller told to fail their measurement (``finish(side, fail=...)``):
        #: a failure that follows is the controller's line, not one raised there.
        self.failed_by_us: set[str] = set()

    def run(self, next_nodeid: str | None) -> TestOutcome:
        for side in self.active:
            try:
                side.send({"op": "test", "nodeid": self.nodeid, "next": next_nodeid})
            except SideGone as exc:
                self.gone(side, str(exc))
        while True:
            busy = [s for s in self.active if self.state[s.spec.name] is SideState.BUSY]
            if busy:
                self.listen(busy)
            elif not self.step():
                return self.outcome()

    def gone(self, side: Side, line: str) -> None:
        self.state[side.spec.name] = SideState.DEAD
        self.lost[side.spec.name] = line
        side.close()

    def finish(self, side: Side, **done: object) -> None:
        """The side's measurement ends (``fail``: not measured; ``verdict``: its judgement)."""
        if "fail" in done:
            self.failed_by_us.add(side.spec.name)
        self.state[side.spec.name] = SideState.BUSY
        side.send({"op": "done", **done})

    def listen(self, busy: Sequence[Side]) -> None:
        """The next event of each side that has one (the sides that have none within the
        timeout are killed)."""
        ready = wait_any(busy, self.ag.timeout_s)
        if not ready:
            for side in busy:
                line = (
                    f"{side.who} did not reach its next measurement or the test's end "
                    f"within {self.ag.timeout_s:g} s; it was killed (--llmperf-engine-timeout)"
                )
                self.gone(side, str(side.kill(line)))
            return
        for side in ready:
            try:
                self.move(side, side.receive(self.ag.timeout_s, f"running {self.nodeid}"))
            except SideGone as exc:
                self.gone(side, str(exc))

    def move(self, side: Side, event: SideEvent) -> None:
        name = side.spec.name
        if isinstance(event, Exit):
            code = event.code
            raise side.kill(f"{side.who} ended its pytest session (exit status {code}) while running {self.nodeid}")
        if type(event) in WAITS:
            self.state[name] = WAITS[type(event)]
        if isinstance(event, Measure):
            self.measures[name] = event
        elif isinstance(event, Report):
            self.reports[name] = event

    def step(self) -> bool:
        """Act on the sides that wait: a turn first, then a measurement on both sides (its
        pairs), or on one alone; False when neither waits (the test is over)."""
        turn = next((s for s in self.active if self.state[s.spec.name] is SideState.TURN), None)
        waiting = {name for name, st in self.state.items() if st is SideState.MEASURE}
        try:
            if turn is not None:
                self.state[turn.spec.name] = SideState.BUSY
                turn.send({"op": "go"})
            elif waiting == {CURRENT, REF}:
                self.paired()
            elif CURRENT in waiting:
                self.alone()
            elif REF in waiting:
                self.finish(self.ref, fail="the current side ended the test before this measurement")
            else:
                return False
        except SideGone as exc:
            self.gone(self.ag.sides[exc.side], str(exc))
        return True

    def paired(self) -> None:
        """Both sides wait at the measurement: its pairs, judged; the verdict goes to the current side."""
        try:
            events = {name: m.data for name, m in self.measures.items()}
            looked, note, agreement = pairs(self.ag, events, self.nodeid)
        except RunFailed as exc:
            self.told.add(f"not measured: {exc}")
            self.finish(self.cur, fail=f"not measured: {exc}")
            self.finish(self.ref, fail=f"not measured: {exc}")
            return
        verdict = {
            "status": BaselineStatus.COMPARED.value,
            "note": note,
            "comparisons": [comparison_json(c) for c in looked.comparisons],
            "parts": [p.to_json() for p in looked.parts],
            "agreement": agreement.to_json(),
        }
        if looked.changes:  # what differs between the sides' requests ("prompt tokens 22 -> 170")
            verdict["changes"] = list(looked.changes)
        where = attribution(self.ag, self.measures, looked.parts)
        if isinstance(where, str):
            verdict["note"] = f"{note}; {where}"
        elif where is not None:
            verdict["attribution"] = where
        self.finish(self.cur, verdict=verdict)
        self.finish(self.ref)

    def alone(self) -> None:
        """The current side waits at a measurement REF will not reach: it fails when REF was
        lost in this test, else it is measured alone and not compared."""
        if REF in self.lost:  # REF died or hung in this test: it fails
            self.told.add(self.lost[REF])
            self.finish(self.cur, fail=self.lost[REF])
            return
        if self.ref_missing:
            reason = self.ref_missing.line
        else:
            said = self.reports[REF].line if REF in self.reports else None
            reason = f"{self.ref.who} ended the test before this measurement{f': {said}' if said else ''}"
        try:
            solo(self.ag, self.cur, self.measures[CURRENT].data)
        except RunFailed as exc:
            self.finish(self.cur, fail=f"not measured: {exc}")
            return
        self.told.add(reason)
        self.finish(self.cur, verdict={"status": BaselineStatus.NOT_COMPARED.value, "note": f"not compared: {reason}"})

    def outcome(self) -> TestOutcome:
        """The current side's reports (or why there are none), and the lines about REF the
        test's report does not carry yet."""
        out = TestOutcome()
        if self.state[CURRENT] is SideState.DONE:
            out.reports = self.reports[CURRENT].reports
        else:
            out.failure = self.lost.get(CURRENT, f"{self.cur.who} did not finish {self.nodeid}")
        if self.ref_missing is not None and self.ref_missing.line not in self.told:
            out.notes.append(f"not compared: {self.ref_missing.line}")
        elif REF in self.lost and self.lost[REF] not in self.told:
            out.notes.append(self.lost[REF])
        elif (note := self._ref_failure()) is not None:
            out.notes.append(note)
        return out

    def _ref_failure(self) -> str | None:
        """The line for REF's failed test, on the side that raised: None where REF failed only
        because this controller told it to (this tree's side ended the test first, or a run of
        either side raised: the test's report names that side); the test's own failure where
        both sides raised the same (its code, not REF's: ``raised at`` names where)."""
        if self.state[REF] is not SideState.DONE or not self.reports[REF].failed or REF in self.failed_by_us:
            return None
        line = self.reports[REF].line
        mine = self.reports.get(CURRENT)
        if mine is not None and mine.failed and mine.line == line:
            return f"the test failed on both sides alike (not REF's doing): {line}"
        return f"{self.ref.who}: the test failed there: {line}"
