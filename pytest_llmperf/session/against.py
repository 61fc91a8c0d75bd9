"""``--llmperf-against REF``: every llmperf test measured on two sides, interleaved pair by pair,
and the current side judged against REF with paired statistics (docs/against.md). No pytest.

Each side is a long-lived process of the same shape (``pytest_plugin/side.py``): a pytest
session of the current tests whose code under test comes from the side's tree (the current
one, or REF's git worktree) and whose interpreter is the side's (this one, or REF's
``python:PATH``). The controller here names the test both sides run; each side runs it up to
its first measurement and waits; then the controller asks for the warm-ups and the runs, one
side at a time, in seeded AB/BA order per pair, adds pairs while the verdict is undecided (up to
the cap, every look at alpha / looks), judges them (``judge.paired.judged_pairs``) and hands
each side its measurement's end. The current side's reports become the test's.

The two sides of ``--llmperf-against`` as the controller (``session/against.py``) sees them:
each a process (``measuring.worker.Channel`` running ``pytest_plugin/side.py``) started on first
use and again after it died, with every wait on a deadline and every way it can fail said in one
line that names the side. No pytest."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, LLMPerfError
from ..core.settings import usable_cpus
from ..core.workload import SEQUENTIAL_FACTOR
from ..engines import NeedsPromptIds, TokenProbabilities
from ..measuring.worker import Channel, idlest_cpus, logits_of
from .refs import Project, Reference, Worktrees, code_packages, resolve_reference

if TYPE_CHECKING:
    from ..core.workload import RunTrace


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
    worktrees: Worktrees | None = None  # holds REF's worktree (a lease) until closed
    #: The labels of each test's measurements met so far: a test's second and later labelled
    #: measurement is one more member of Holm's family (``family`` counts each test once).
    labels_seen: dict[str, set[str]] = field(default_factory=dict)
    extra_measurements: int = 0
    #: Per measurement compared, what its decision cost: test, pairs, seconds of pairs (warm-ups
    #: excluded), the look it stopped at of how many, and why (``pairs``).
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def family_for(self, nodeid: str, label: str) -> int:
        """Holm's family size once this measurement is counted (the session's ``family_size``)."""
        from ..judge.rule import JUDGED

        labels = self.labels_seen.setdefault(nodeid, set())
        if label not in labels:
            labels.add(label)
            if len(labels) > 1:
                self.extra_measurements += 1
        return self.family + self.extra_measurements * len(JUDGED)

    def start(self) -> None:
        start_all(list(self.sides.values()))

    def run_test(self, nodeid: str, next_nodeid: str | None) -> TestOutcome:
        """Both sides run the test; its measurements are interleaved and judged."""
        self.start()
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
        ref_root = project.in_worktree(worktrees.checkout(reference.commit, needed)) / base
    harness = harness_link(cache_dir)
    specs = {
        CURRENT: SideSpec(CURRENT, "this tree", sys.executable, str(here), packages),
        REF: SideSpec(REF, reference.describe(), reference.python or sys.executable, str(ref_root), packages),
    }
    sides = {name: Side(spec, args, cwd, str(harness), timeout_s) for name, spec in specs.items()}
    return Against(reference, sides, alpha, threshold, tail_threshold, family, timeout_s, worktrees)


def describe_sides(against: Mapping[str, Any] | None) -> list[str]:
    """The session's last lines: what each side was (``Session.against_sides``: the controller's,
    or an xdist worker's shipped on its reports)."""
    out = []
    for name, side in ((against or {}).get("sides") or {}).items():
        code = ", ".join(f"{k} from {v}" for k, v in (side.get("code") or {}).items() if v) or "no code of this tree"
        out.append(
            f"llmperf: against: {name} = {side.get('shown')}: Python {side.get('python') or '?'}, "
            f"llama-cpp-python {side.get('llama_cpp') or '?'}, {code}"
        )
    for d in (against or {}).get("decisions") or ():
        out.append(
            f"llmperf: against: {d.get('test')}: {d.get('pairs')} pairs in {float(d.get('seconds') or 0):.1f} s "
            f"(look {d.get('look')} of {d.get('looks')}: {d.get('stopped')})"
        )
    return out


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
    from ..measuring.worker import trace_of

    side.send({"op": "run", "index": index, "cpus": list(cpus or ())})
    reply = side.receive(timeout_s, f"run {index}" if index >= 0 else f"warm-up run {-index}")
    if reply.get("ev") == "error":
        raise RunFailed(f"{side.who}: {reply.get('line')}")
    if reply.get("ev") != "trace":
        raise side.kill(f"{side.who} answered {reply.get('ev')!r} to a run: it left its measurement; it was killed")
    return trace_of(reply["trace"])


class SideLogits(TokenProbabilities):
    """A side's engine as ``measuring.agreement`` sees it: its token probabilities, asked over
    the side's pipe ("logits") once the pairs are done; ``of``: as its "measure" event said."""

    def __init__(self, side: Side, timeout_s: float) -> None:
        self.side, self.timeout_s = side, timeout_s

    @staticmethod
    def of(side: Side, event: Mapping[str, Any], timeout_s: float) -> SideLogits | None:
        if not event.get("logits"):
            return None  # the side's engine gives none
        return (SideIdLogits if event.get("needs_ids") else SideLogits)(side, timeout_s)

    def token_logits(
        self, workload: Any, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> Any:
        self.side.send(
            {
                "op": "logits",
                "workload": asdict(workload),
                "forced": None if forced is None else list(forced),
                "prompt_ids": None if prompt_ids is None else list(prompt_ids),
            }
        )
        reply = self.side.receive(self.timeout_s, "reading its token probabilities")
        if reply.get("ev") != "logits":
            raise self.side.kill(f"{self.side.who} answered {reply.get('ev')!r} to a logits request; it was killed")
        return logits_of(reply["got"]) if "got" in reply else str(reply.get("line"))


class SideIdLogits(SideLogits, NeedsPromptIds):
    needs_prompt_ids = True  # the side's engine takes the prompt as the other side's token ids (an endpoint)


def outputs(ag: Against, events: Mapping[str, Mapping[str, Any]], workload: Any) -> Any:
    """This tree's outputs against REF's (``measuring.agreement``, REF is A), after every pair."""
    from ..measuring.agreement import compare_outputs

    ref, cur = (SideLogits.of(ag.sides[name], events[name], ag.timeout_s) for name in (REF, CURRENT))
    return compare_outputs(ref, cur, workload, a_name=f"REF {ag.reference.describe()}", b_name="this tree")


def pairs(ag: Against, events: Mapping[str, Mapping[str, Any]], nodeid: str) -> tuple[list[Any], str, Any]:
    """The measurement both sides wait at: warm-ups, then pairs in seeded AB/BA order (A: REF, B:
    the current side), looks until decided or the cap, then the output agreement. Returns
    (comparisons, the note, the ``Agreement``)."""
    from ..core.workload import Workload
    from ..judge.ab import block_orders
    from ..judge.paired import judged_pairs, pairs_settled
    from ..measuring.metrics import RunMetrics

    ev = events[CURRENT]
    workload = Workload(**ev["workload"])
    settings = {
        "alpha": ag.alpha,
        "threshold": ag.threshold,
        "tail_threshold": ag.tail_threshold,
        **{k: v for k, v in (ev.get("settings") or {}).items() if k in ("alpha", "threshold", "tail_threshold")},
    }
    cap, looks, step = looks_for(workload.runs, ev.get("max_runs"))
    family = ag.family_for(nodeid, str(ev.get("label") or ""))
    by_letter = {"A": ag.sides[REF], "B": ag.sides[CURRENT]}
    threads = max(int(events[name].get("threads") or usable_cpus()) for name in (CURRENT, REF))
    cpus = idlest_cpus(threads)  # the same CPUs for both sides (idlest_cpus says why)
    for i, order in enumerate(block_orders(workload.warmup, workload.seed + 1)):
        for letter in order:
            _run(by_letter[letter], -1 - i, ag.timeout_s, cpus)
    orders = block_orders(cap, workload.seed)
    runs: dict[str, list[Any]] = {"A": [], "B": []}
    started = time.monotonic()
    look = 0
    while True:
        start = len(runs["A"])
        for i in range(start, min(start + step, cap)):
            for letter in orders[i]:
                runs[letter].append(RunMetrics.of(_run(by_letter[letter], i, ag.timeout_s, cpus)))
        n, look = len(runs["A"]), look + 1
        comparisons = judged_pairs(
            runs["A"], runs["B"], family=family, looks=looks, reference=ag.reference.describe(), **settings
        )
        why = pairs_settled(comparisons) or (f"the cap of {cap} pairs" if n >= cap else None)
        if why is None and time.monotonic() - started > PAIRS_TIME_CAP_S:
            why = f"the {PAIRS_TIME_CAP_S:.0f} s bound"
        if why is not None:
            break
    seconds = time.monotonic() - started
    test = nodeid + (f"[{ev['label']}]" if ev.get("label") else "")
    ag.decisions.append({"test": test, "pairs": n, "seconds": round(seconds, 3), "look": look, "looks": looks})
    ag.decisions[-1]["stopped"] = why
    n_ab = sum(1 for o in orders[:n] if o == "AB")
    ref, cur = ag.sides[REF].ready, ag.sides[CURRENT].ready
    same = "" if events[REF]["workload"] == ev["workload"] else "; REF's workload differs from this tree's"
    note = (
        f"against {ag.reference.describe()}: {n} pairs interleaved ({n_ab} AB, {n - n_ab} BA, seeded; "
        f"{seconds:.1f} s; look {look} of {looks}, a look every {step} pairs up to {cap}: {why}) "
        f"after {workload.warmup} warm-up run(s) each"
        f"{'' if cpus is None else '; both on CPU ' + ','.join(map(str, cpus))}; llama-cpp-python "
        f"{ref.get('llama_cpp') or '?'} (REF) vs {cur.get('llama_cpp') or '?'} (this tree){same}"
    )
    return comparisons, note, outputs(ag, events, workload)


#: The pairs of one measurement stop at the run cap; this bound is for tests whose runs take
#: seconds each. It is not the baseline mode's 120 s: on a loaded runner the pairs are slower
#: exactly when noise needs more of them, and a time cap then decides with fewer pairs (60 pairs
#: of the small preset, pp32 tg64, take about 5 minutes with one of 2 cores busy).
PAIRS_TIME_CAP_S = 900.0


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
                    gone(
                        side,
                        str(
                            side.kill(
                                f"{side.who} did not reach its next measurement or the test's end "
                                f"within {ag.timeout_s:g} s; it was killed (--llmperf-engine-timeout)"
                            )
                        ),
                    )
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
                    gone(
                        side,
                        str(
                            side.kill(
                                f"{side.who} ended its pytest session (exit status "
                                f"{event.get('code', '?')}) while running {nodeid}"
                            )
                        ),
                    )
            continue
        turn = next((s for s in active if state[s.spec.name] == "turn"), None)
        waiting = {name for name, st in state.items() if st == "measure"}
        try:
            if turn is not None:
                state[turn.spec.name] = "busy"
                turn.send({"op": "go"})
            elif waiting == {CURRENT, REF}:
                try:
                    comparisons, note, agreement = pairs(ag, events, nodeid)
                except RunFailed as exc:
                    told.add(f"not measured: {exc}")
                    finish(cur, fail=f"not measured: {exc}")
                    finish(ref, fail=f"not measured: {exc}")
                    continue
                finish(
                    cur,
                    verdict={
                        "status": "compared",
                        "note": note,
                        "comparisons": [comparison_json(c) for c in comparisons],
                        "agreement": agreement.as_dict(),
                    },
                )
                finish(ref)
            elif CURRENT in waiting and REF in lost:  # REF died or hung in this test: it fails
                told.add(lost[REF])
                finish(cur, fail=lost[REF])
            elif CURRENT in waiting:
                said = events.get(REF, {}).get("line")
                reason = (
                    ref_missing.line
                    if ref_missing
                    else (f"{ref.who} ended the test before this measurement{f': {said}' if said else ''}")
                )
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


CURRENT, REF = "current", "REF"
#: The environment variable that makes a process a side (``pytest_plugin/side.py``): the JSON of
#: a ``SideEnv``, written by ``Side.spawn`` and read by the side (``SideEnv.read``).
SIDE_ENV = "LLMPERF_SIDE"
#: The least time a side has to reach ``ready`` (a Python start, pytest's collection, imports):
#: --llmperf-engine-timeout bounds a run, not a start.
START_TIMEOUT_S = 120.0
#: The lines of Python's fault handler dump (``python_fault`` says where it was instead).
_DUMP = re.compile(r'(File "|Thread 0x|Current thread 0x|Extension modules: |\.\.\.$)')
_SEPARATOR = re.compile(r"([=!_-])\1{5,}(?: (.*?) \1{5,})?")


@dataclass(frozen=True)
class SideSpec:
    name: str  # CURRENT or REF
    shown: str  # "this tree", "git:main (3f2a1b9c0d1e)"
    python: str
    code_root: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class SideEnv:
    """What a side process is told at its start: its name, the pytest arguments of the
    controller's session, and where its code under test comes from."""

    name: str
    args: tuple[str, ...]
    code_root: str
    packages: tuple[str, ...]

    def dumps(self) -> str:
        return json.dumps(
            {"name": self.name, "args": list(self.args), "code_root": self.code_root, "packages": list(self.packages)}
        )

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> SideEnv | None:
        """This process's side, or None when it is no side."""
        text = environ.get(SIDE_ENV)
        if text is None:
            return None
        d = json.loads(text)
        return cls(d["name"], tuple(d["args"]), d["code_root"], tuple(d["packages"]))


@dataclass(frozen=True)
class Missing:
    """Why a side cannot run a test: ``fails`` when that fails the test (the side did not start,
    its code under test fails to import), else the test is measured on the current side alone."""

    line: str
    fails: bool


class SideGone(LLMPerfError):
    """A side died or stopped answering; ``side`` names it (CURRENT or REF)."""

    def __init__(self, line: str, side: str) -> None:
        super().__init__(line)
        self.side = side


class Side:
    """One side's process, started on first use (``spawn``, then ``await_ready``) and again
    after it died; a side that failed to start is not started again (``broken``)."""

    def __init__(self, spec: SideSpec, args: Sequence[str], cwd: str, harness: str, timeout_s: float) -> None:
        self.spec, self.args, self.cwd, self.harness, self.timeout_s = spec, list(args), cwd, harness, timeout_s
        self.channel: Channel | None = None
        self.ready: dict[str, Any] = {}
        self.start_error: str | None = None
        self.broken = False  # did not start: every test it was to run fails with start_error
        self.problems: str | None = None  # the redirect's first problem: the side runs, but measures what?
        self.awaiting = False  # started, its ``ready`` not read yet

    @property
    def who(self) -> str:
        return f"side {self.spec.name} ({self.spec.shown})"

    def spawn(self) -> None:
        """Start the process unless it runs (or cannot start); ``await_ready`` waits for it."""
        if self.broken or (self.channel is not None and self.channel.alive):
            return
        self.close()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.harness, *filter(None, [env.get("PYTHONPATH")])])
        env[SIDE_ENV] = SideEnv(self.spec.name, tuple(self.args), self.spec.code_root, self.spec.packages).dumps()
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            env.pop(name, None)  # PYTEST_ADDOPTS stays: the same options on both sides as here
        try:
            self.channel = Channel("pytest_llmperf.pytest_plugin.side", python=self.spec.python, env=env, cwd=self.cwd)
        except OSError as exc:
            self._broke(f"{self.who} cannot start: {exc.strerror or exc}")
            return
        self.awaiting = True

    def await_ready(self, deadline: float) -> None:
        if not self.awaiting:
            return
        self.awaiting = False
        try:
            message = self.receive(max(deadline - time.monotonic(), 0.0), "starting")
        except SideGone as exc:
            self._broke(str(exc))
            return
        if message.get("ev") != "ready":
            self._broke(
                f"{self.who} did not start: its pytest session ended before its first test "
                f"(exit status {message.get('code', '?')}): {self._cause()}. {self._log()}"
            )
            return
        self.ready = message
        problems = message.get("problems") or []
        self.problems = f"{self.who}: {problems[0]}" if problems else None

    def _broke(self, line: str) -> None:
        self.start_error, self.broken = line, True
        if self.channel is not None:
            self.channel.kill()
        self.close()

    def send(self, message: Mapping[str, Any]) -> None:
        if self.channel is None or not self.channel.send(message):
            raise SideGone(self._died("at work"), self.spec.name)

    def receive(self, timeout_s: float, doing: str) -> dict[str, Any]:
        from ..measuring.worker import BadReply, ChannelClosed

        if self.channel is None:
            raise SideGone(f"{self.who} is gone (while {doing})", self.spec.name)
        try:
            message = self.channel.receive(timeout_s)
        except BadReply as exc:
            raise SideGone(
                f"{self.who} answered with a line that is not a JSON object while {doing}: {exc.text}; it was killed",
                self.spec.name,
            ) from None
        except ChannelClosed:
            raise SideGone(self._died(doing), self.spec.name) from None
        if message is None:
            self.channel.kill()
            raise SideGone(
                f"{self.who} did not answer within {timeout_s:g} s while {doing}; it was killed "
                f"(raise --llmperf-engine-timeout or shorten the workload). {self._log()}",
                self.spec.name,
            )
        return message

    def kill(self, line: str) -> SideGone:
        """Kill the process; the SideGone that says why."""
        if self.channel is not None:
            self.channel.kill()
        return SideGone(f"{line}. {self._log()}", self.spec.name)

    def _died(self, doing: str) -> str:
        from ..engines.llama_cpp_native import signal_name

        code = self.channel.wait() if self.channel is not None else None
        where = python_fault(self._text())
        return f"{self.who} died with {signal_name(code)} while {doing}{f' ({where})' if where else ''}. {self._log()}"

    def _text(self) -> str:
        if self.channel is None:
            return ""
        return self.channel.log_tail(65536)

    def _cause(self) -> str:
        """pytest's words for what stopped it (``ImportError while loading conftest ...: E ...``)."""
        text = self._text()
        head = next((ln.strip() for ln in text.splitlines() if re.match(r"(ImportError|ERROR|INTERNALERROR)", ln)), "")
        errors = [ln.strip()[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        return "; ".join(filter(None, [head.rstrip("."), errors[-1] if errors else ""]))[:600] or "it said nothing"

    def _log(self) -> str:
        from ..engines.llama_cpp_native import quoted_log

        kept = []
        for line in self._text().splitlines():
            line = line.strip()
            sep = _SEPARATOR.fullmatch(line)  # pytest's ===== title =====: its title only
            line = (sep.group(2) or "") if sep else line
            if line and not _DUMP.match(line):
                kept.append(line)
        lines = quoted_log("\n".join(kept))
        return f"Its last log lines: {' | '.join(lines[-6:])}" if lines else "It logged nothing"

    def missing(self, nodeid: str) -> Missing | None:
        """Why this side cannot run ``nodeid``, else None."""
        if self.start_error:
            return Missing(self.start_error, fails=True)
        if self.problems:  # the code under test is not the side's own: nothing to compare with
            return Missing(self.problems, fails=False)
        if nodeid in self.ready.get("collected", ()):
            return None
        broken: Mapping[str, str] = self.ready.get("broken") or {}
        errors: Mapping[str, str] = self.ready.get("errors") or {}
        for where, line in [*broken.items(), *errors.items()]:
            if not where or nodeid == where or nodeid.startswith((where + "::", where + "/")):
                if where in broken:
                    return Missing(
                        f"{self.who} cannot import {where or nodeid}: its code under test fails there: {line}",
                        fails=True,
                    )
                return Missing(f"{self.who} cannot collect {where or nodeid}: {line}", fails=False)
        return Missing(f"{self.who} has no test {nodeid}", fails=False)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.awaiting = False


def start_all(sides: Sequence[Side]) -> None:
    """Start the sides that do not run, side by side, each with START_TIMEOUT_S at least."""
    for side in sides:
        side.spawn()
    for side in sides:
        side.await_ready(time.monotonic() + max(side.timeout_s, START_TIMEOUT_S))


def python_fault(text: str) -> str | None:
    """The innermost frame of Python's fault handler dump in a side's log, e.g.
    ``in stream at wrapper/__init__.py:33``; None when there is no dump."""
    at = text.rfind("Fatal Python error:")
    if at < 0:
        return None
    current = text.find("Current thread ", at)  # pytest's fault handler dumps every thread
    frame = re.search(r'^\s*File "([^"]+)", line (\d+) in (\S+)', text[current if current >= 0 else at :], re.MULTILINE)
    if frame is None:
        return None
    path = Path(frame.group(1))
    shown = "/".join(path.parts[-2:]) if len(path.parts) > 1 else str(path)
    return f"in {frame.group(3)} at {shown}:{frame.group(2)}"


def wait_any(sides: Sequence[Side], timeout_s: float) -> list[Side]:
    """The sides with a message waiting (at most ``timeout_s``)."""
    ready = set(map(id, Channel.wait_any([s.channel for s in sides if s.channel is not None], timeout_s)))
    return [s for s in sides if id(s.channel) in ready]


def harness_link(cache_dir: Path) -> Path:
    """A folder holding only ``pytest_llmperf`` (a link to this one): the sides import the plugin
    from the current tree, never another environment's copy, and nothing else of this one. One
    per copy of the plugin under the cache (``harness/<key>``), made once and left for the next
    session: nothing to clean up, so a killed session leaves nothing behind."""
    here = Path(__file__).resolve().parent.parent
    folder = Path(cache_dir) / "harness" / hashlib.sha256(str(here).encode()).hexdigest()[:12]
    link = folder / "pytest_llmperf"
    try:
        if not (link.is_symlink() and os.readlink(link) == str(here)):
            folder.mkdir(parents=True, exist_ok=True)
            made = folder / f".pytest_llmperf.{os.getpid()}"  # made aside, then put in place in one step
            made.unlink(missing_ok=True)
            os.symlink(here, made)
            os.replace(made, link)
    except OSError as exc:
        raise ConfigError(
            f"llmperf: --llmperf-against: cannot link the plugin at {link}: {exc.strerror or exc}"
        ) from None
    return folder
