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

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.errors import LLMPerfError
from ..core.workload import SEQUENTIAL_FACTOR, SEQUENTIAL_TIME_CAP_S
from ..measuring.channel import Channel
from .refs import Reference, Worktrees, code_packages, resolve_reference

CURRENT, REF = "current", "REF"


@dataclass(frozen=True)
class SideSpec:
    name: str  # CURRENT or REF
    shown: str  # "this tree", "git:main (3f2a1b9c0d1e)"
    python: str
    code_root: str
    packages: tuple[str, ...]


@dataclass
class TestOutcome:
    """What the controller knows of one test: the current side's serialized reports (empty when
    it crashed: ``failure`` says why), and the lines for its report."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    notes: list[str] = field(default_factory=list)


class SideGone(LLMPerfError):
    """A side died or stopped answering."""


class Side:
    """One side's process (a ``measuring.channel.Channel``), started on first use."""

    def __init__(self, spec: SideSpec, args: Sequence[str], cwd: str, harness: str, timeout_s: float) -> None:
        self.spec, self.args, self.cwd, self.harness, self.timeout_s = spec, list(args), cwd, harness, timeout_s
        self.channel: Any = None
        self.ready: dict[str, Any] = {}
        self.start_error: str | None = None

    @property
    def who(self) -> str:
        return f"side {self.spec.name} ({self.spec.shown})"

    def start(self) -> None:
        if self.channel is not None and self.channel.alive:
            return
        self.close()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.harness, *filter(None, [env.get("PYTHONPATH")])])
        env["LLMPERF_SIDE"] = json.dumps({"name": self.spec.name, "args": self.args, "code_root": self.spec.code_root,
                                          "packages": list(self.spec.packages)})
        env.pop("PYTEST_ADDOPTS", None)  # the controller's arguments, already in args
        env.pop("PYTEST_XDIST_WORKER", None)
        try:
            self.channel = Channel("pytest_llmperf.pytest_plugin.side", python=self.spec.python, env=env, cwd=self.cwd)
        except OSError as exc:
            self.start_error = f"{self.who} cannot start: {exc.strerror or exc}"
            return
        try:
            message = self.receive(self.timeout_s, "starting")
        except SideGone as exc:
            self.start_error = str(exc)
            self.close()
            return
        if message.get("ev") != "ready":
            self.start_error = f"{self.who} did not start: {self._log()}"
            self.close()
            return
        self.ready = message
        problems = message.get("problems") or []
        self.start_error = f"{self.who}: {problems[0]}" if problems else None

    def send(self, message: Mapping[str, Any]) -> None:
        if self.channel is None or not self.channel.send(message):
            raise SideGone(self._died("at work"))

    def receive(self, timeout_s: float, doing: str) -> dict[str, Any]:
        from ..measuring.channel import ChannelClosed

        try:
            message = self.channel.receive(timeout_s)
        except ChannelClosed:
            raise SideGone(self._died(doing)) from None
        if message is None:
            self.channel.kill()
            raise SideGone(f"{self.who} did not answer within {timeout_s:g} s while {doing}; it was killed "
                           f"(raise --llmperf-engine-timeout or shorten the workload). {self._log()}")
        return message

    def _died(self, doing: str) -> str:
        from ..engines.llama_cpp_native import signal_name

        code = self.channel.wait() if self.channel is not None else None
        return f"{self.who} died with {signal_name(code)} while {doing}. {self._log()}"

    def _log(self) -> str:
        lines = self.channel.log_lines() if self.channel is not None else []
        return f"Its last log lines: {' | '.join(lines[-6:])}" if lines else "It logged nothing"

    def missing(self, nodeid: str) -> str | None:
        """Why this side cannot run ``nodeid`` (not collected there), else None."""
        if self.start_error:
            return self.start_error
        if nodeid in self.ready.get("collected", ()):
            return None
        errors: Mapping[str, str] = self.ready.get("errors") or {}
        for where, line in errors.items():
            if nodeid.startswith(where.split("::")[0]):
                return f"{self.who} cannot collect {where or nodeid}: {line}"
        return f"{self.who} has no test {nodeid}"

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


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
        for side in self.sides.values():
            side.start()

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


def harness_link() -> Any:
    """A folder holding only ``pytest_llmperf`` (a link to this one): the sides import the plugin
    from the current tree, never another environment's copy, and nothing else of this one."""
    tmp = tempfile.TemporaryDirectory(prefix="llmperf-harness-")
    here = Path(__file__).resolve().parent.parent
    os.symlink(here, Path(tmp.name) / "pytest_llmperf")
    return tmp


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


def wait_any(sides: Sequence[Side], timeout_s: float) -> list[Side]:
    """The sides with a message waiting (at most ``timeout_s``)."""
    ready = set(map(id, Channel.wait_any([s.channel for s in sides if s.channel is not None], timeout_s)))
    return [s for s in sides if id(s.channel) in ready]


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
        raise SideGone(f"{side.who} answered {reply.get('ev')!r} to a run: it left its measurement")
    return trace_of(reply["trace"])


def pairs(ag: Against, events: Mapping[str, Mapping[str, Any]]) -> tuple[list[Any], str]:
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
        comparisons = judged_pairs(runs["A"], runs["B"], family=ag.family, looks=looks,
                                   reference=ag.reference.describe(), **settings)
        undecided = any(c.worth_more_runs for c in comparisons if c.mirror_of is None)
        if not undecided or n >= cap or time.monotonic() - started > SEQUENTIAL_TIME_CAP_S:
            break
    n_ab = sum(1 for o in orders[:n] if o == "AB")
    ref, cur = ag.sides[REF].ready, ag.sides[CURRENT].ready
    same = "" if events[REF]["workload"] == ev["workload"] else "; REF's workload differs from this tree's"
    note = (f"against {ag.reference.describe()}: {n} pairs interleaved ({n_ab} AB, {n - n_ab} BA, seeded; "
            f"up to {cap} in {looks} look(s)) after {workload.warmup} warm-up run(s) each; llama-cpp-python "
            f"{ref.get('llama_cpp') or '?'} (REF) vs {cur.get('llama_cpp') or '?'} (this tree){same}")
    return comparisons, note


def solo(ag: Against, side: Side, event: Mapping[str, Any]) -> None:
    """A measurement with nothing to pair it with: its runs alone (budgets still apply)."""
    from ..core.workload import Workload

    workload = Workload(**event["workload"])
    for i in range(workload.warmup):
        _run(side, -1 - i, ag.timeout_s)
    for i in range(workload.runs):
        _run(side, i, ag.timeout_s)


def drive(ag: Against, nodeid: str, next_nodeid: str | None) -> TestOutcome:
    """Run one test on both sides (module docstring); a side that dies or hangs fails the test
    when it was measuring, and is started again for the next test."""
    from ..judge.result import comparison_json

    out = TestOutcome()
    cur, ref = ag.sides[CURRENT], ag.sides[REF]
    why = cur.missing(nodeid)
    if why:
        out.failure = why
        return out
    ref_missing = ref.missing(nodeid)
    active = [cur] if ref_missing else [cur, ref]
    state = {CURRENT: "busy", REF: "absent" if ref_missing else "busy"}
    events: dict[str, dict[str, Any]] = {}
    lost: dict[str, str] = {}
    if ref_missing:
        out.notes.append(f"not compared: {ref_missing}")

    def gone(side: Side, line: str) -> None:
        state[side.spec.name] = "dead"
        lost[side.spec.name] = line
        side.close()

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
                    side.channel.kill()
                    gone(side, f"{side.who} did not reach its next measurement or the test's end within "
                               f"{ag.timeout_s:g} s; it was killed (--llmperf-engine-timeout)")
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
                    gone(side, f"{side.who} ended its session while running {nodeid}")
            continue
        turn = next((s for s in active if state[s.spec.name] == "turn"), None)
        waiting = {name for name, st in state.items() if st == "measure"}
        try:
            if turn is not None:
                state[turn.spec.name] = "busy"
                turn.send({"op": "go"})
            elif waiting == {CURRENT, REF}:
                try:
                    comparisons, note = pairs(ag, events)
                except RunFailed as exc:
                    for side in (cur, ref):
                        state[side.spec.name] = "busy"
                        side.send({"op": "done", "fail": f"not measured: {exc}"})
                    continue
                state[CURRENT] = state[REF] = "busy"
                cur.send({"op": "done", "verdict": {"status": "compared", "note": note,
                                                    "comparisons": [comparison_json(c) for c in comparisons]}})
                ref.send({"op": "done"})
            elif CURRENT in waiting:
                reason = lost.get(REF) or ref_missing or f"{ref.who} ended the test before this measurement"
                if REF in lost and state[REF] == "dead" and events.get(REF, {}).get("ev") == "measure":
                    state[CURRENT] = "busy"
                    cur.send({"op": "done", "fail": f"not compared: {reason}"})
                    continue
                solo(ag, cur, events[CURRENT])
                state[CURRENT] = "busy"
                cur.send({"op": "done", "verdict": {"status": "no-baseline", "note": f"not compared: {reason}"}})
            elif REF in waiting:
                state[REF] = "busy"
                ref.send({"op": "done", "fail": "the current side ended the test before this measurement"})
            else:
                break
        except SideGone as exc:
            for side in (cur, ref):
                if str(exc).startswith(side.who):
                    gone(side, str(exc))
            if CURRENT in lost and state[REF] in ("measure", "busy"):
                ref.close()  # nothing to pair with: this side starts again at the next test
                state[REF] = "dead"
    if state[CURRENT] == "done":
        out.reports = events[CURRENT]["reports"]
    else:
        out.failure = lost.get(CURRENT, f"{cur.who} did not finish {nodeid}")
    if REF in lost:
        out.notes.append(lost[REF])
    elif state[REF] == "done" and events[REF].get("outcome") == "failed":
        out.notes.append(f"{ref.who}: the test failed there: {events[REF].get('line')}")
    return out
