"""Runs of two sides interleaved, pair by pair: both sides in this process (an A/B
``compare()``: ``interleave``), or one side in a process of its own whose runs another process
asks for (``--llmperf-against``: ``SideRuns``, the side's end of its channel, token by token where
its engine can pause). Every clock read of these runs is an engine's, inside its ``run``; the
statistics on the pairs are ``judge.paired``'s, the controller that asks for a side's runs is
``session/against.py``. No pytest.

Each pair is one run of A and one of B, in an order drawn per pair (AB or BA, seeded), so
neither side always runs first (a warm cache or a thermal ramp would otherwise favour one).
Both sides get their warm-up runs, interleaved the same way, before the first pair.

A side of ``--llmperf-against`` does nothing between its ``measure`` event and the controller's
"done" but the runs it is asked for (and, after the pairs, its token probabilities for the output
agreement, ``measuring.agreement``, and its attribution pass); its clock is read here, so the
pipe and the controller's work lie outside every timed region. Work that cannot be paired (an A/B
``compare()``, a load test) waits for an exclusive turn, so it never runs while the other side
works."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..core.errors import LLMPerfError, NotSteppable, one_line
from ..core.measurement import Agreement, Measurement, RunMetrics
from ..core.progress import task, timed
from ..core.settings import usable_cpus
from ..core.workload import EngineInfo, RunTrace, Workload
from ..engines import TokenStream
from ..engines.capabilities import (
    DrivenLlama,
    Engine,
    FreshEngine,
    FreshInstances,
    NeedsPromptIds,
    SteppedRuns,
    TokenProbabilities,
    times_layers,
)
from .attribution import ATTRIBUTION_RUNS
from .metrics import run_metrics, summarize
from .runner import as_engine, measure, pass_of, traces_figures
from .worker import WorkerEngine, idlest_cpus, logits_json, pin

if TYPE_CHECKING:
    from .attribution import Stepping


def block_orders(n_pairs: int, seed: int) -> tuple[str, ...]:
    """AB or BA for each pair, drawn from a seeded generator."""
    rng = np.random.default_rng([seed, 0xAB])
    return tuple("AB" if bit else "BA" for bit in rng.integers(0, 2, size=n_pairs))


def pass_orders(seed: int) -> tuple[str, tuple[str, ...]]:
    """The order of two attribution passes' warm-ups and of each of their runs
    (``measuring.attribution.interleaved``): seeded AB/BA, as the pairs."""

    return block_orders(1, seed + 2)[0], block_orders(ATTRIBUTION_RUNS, seed + 3)


class Interleaved(enum.Enum):
    """How the two runs of a pair take turns (docs/against.md, "Token by token"; docs/ab.md)."""

    TOKEN = "token"  # each side's step in turn: prompt, prompt, token, token, ...
    RUN = "run"  # one side's whole run, then the other's


def turns(interleaved: Interleaved, unstepped: str | None) -> str:
    """How a pair's runs took turns, for a report line: ``token by token``, or ``run by run``
    with why not token by token (``unstepped``)."""
    if interleaved is Interleaved.TOKEN:
        return "token by token"
    return "run by run" + (f" (not token by token: {unstepped})" if unstepped else "")


@dataclass(frozen=True)
class Pairs:
    """An in-process A/B's runs (``interleave``): each side's timed and warm-up traces, the
    AB/BA order of each pair, how the pairs' runs took turns and, run by run, why not token by
    token (None: token by token). The second level: each pair's instance pair (``groups``: 0 for
    the given engines, k for the k-th fresh pair), the fresh pairs' build seconds (their load,
    warm-ups and the old pair's close: outside every timed region), the pairs' own seconds, and
    why every pair ran on one instance pair where a side cannot be built again (``single``)."""

    a: list[RunTrace]
    b: list[RunTrace]
    a_warm: list[RunTrace]
    b_warm: list[RunTrace]
    orders: tuple[str, ...]
    interleaved: Interleaved
    unstepped: str | None
    groups: tuple[int, ...] = ()
    build_s: float = 0.0
    pairs_s: float = 0.0
    single: str | None = None

    @property
    def instance_pairs(self) -> int:
        """The engine instance pairs the pairs ran on (1: the given engines only)."""
        return len(set(self.groups)) or 1


@dataclass(frozen=True)
class SoFar:
    """An A/B's pairs so far, where the next block's size is chosen (``interleave``'s
    ``sizes``): each side's timed runs (``RunMetrics``), each pair's instance pair, the fresh
    instance pairs built and their seconds (warm-ups included), the pairs' own seconds, the
    pairs planned."""

    a: tuple[RunMetrics, ...]
    b: tuple[RunMetrics, ...]
    groups: tuple[int, ...]
    fresh: int
    build_s: float
    pairs_s: float
    runs: int


#: The next block's pairs from what has run (``judge.ab.block_size``).
BlockSizes = Callable[[SoFar], int]


def interleave(
    a: Engine,
    b: Engine,
    workload: Workload,
    seed: int,
    names: tuple[str, str] = ("A", "B"),
    sizes: BlockSizes | None = None,
) -> Pairs:
    """``workload.runs`` pairs of A and B (after ``workload.warmup`` warm-up pairs), each in its
    seeded order: token by token where both engines can pause between tokens (``stepped_sides``),
    else, and from the first run that could not pause (``NotSteppable``: that pair taken again
    whole), run by run. ``names``: the sides' names, for the line that says why not token by token.
    ``sizes`` (None: every pair on ``a`` and ``b``): the pairs in blocks of the sizes it gives, the
    first block on ``a`` and ``b``, each later one on a fresh instance pair (``FreshInstances``),
    built, warmed up and the previous fresh pair closed between blocks, outside every timed
    region; where a side cannot be built again, every pair on ``a`` and ``b`` (``Pairs.single``)."""
    named = dict(zip("AB", names, strict=True))
    pairing = _Pairing({"A": a, "B": b}, named, workload)
    single = None if sizes is None else one_instance(pairing.engines, named)
    orders = block_orders(workload.runs, seed)
    groups: list[int] = []
    build_s = pairs_s = 0.0
    with (
        task("interleaved pairs") as progress,
        contextlib.closing(_Instances(a, b)) as instances,
        same_cpus(pairing.engines.values()),
    ):
        progress.step("warm-up pairs", 0, workload.warmup)
        pairing.warm_up(seed, keep=True)
        while len(groups) < workload.runs:
            n = len(groups)
            so_far = SoFar(*pairing.timed(), tuple(groups), instances.built, build_s, pairs_s, workload.runs)
            size = workload.runs if sizes is None or single is not None else sizes(so_far)
            if n:  # a later block: a fresh instance pair, warmed up, outside every timed region
                progress.step(f"building instance pair {instances.built + 2}")
                began = time.perf_counter()
                pairing.engines = instances.fresh()
                pairing.warm_up(seed, keep=False)
                build_s += time.perf_counter() - began
            progress.step("pairs", n, workload.runs)
            began = time.perf_counter()
            for i in range(n, min(n + max(size, 1), workload.runs)):
                pairing.pair(i, orders[i])
                groups.append(instances.built)
                progress.advance(i + 1)
            pairs_s += time.perf_counter() - began
    how = Interleaved.RUN if pairing.unstepped is not None else Interleaved.TOKEN
    return Pairs(
        *(pairing.runs["A"], pairing.runs["B"], *pairing.warm, orders, how, pairing.unstepped),
        groups=tuple(groups),
        build_s=build_s,
        pairs_s=pairs_s,
        single=single,
    )


@contextlib.contextmanager
def same_cpus(engines: Iterable[Engine]) -> Iterator[tuple[int, ...] | None]:
    """This process's threads (both engines' runs, their stepped threads, llama.cpp's pool) on
    the idlest CPUs their threads need, as ``--llmperf-against`` puts both sides' processes
    (``worker.idlest_cpus``), for an in-process A/B's pairs; the affinity this process had is
    given back after. Left to the scheduler, the two engines' threads of a token-by-token pair
    took turns on whichever core was free, each step on a core whose caches held the other
    engine's work. No pinning where the threads need every CPU or the kernel does not say (the
    CPUs pinned, or None)."""
    threads = max((e.info().threads or usable_cpus() for e in engines), default=usable_cpus())
    cpus = idlest_cpus(threads)
    if cpus is None:
        yield None
        return
    before = tuple(sorted(os.sched_getaffinity(0)))
    pin(cpus)
    try:
        yield cpus
    finally:
        pin(before)


class _Pairing:
    """The pairs of an A/B on its current engines (``engines``, by letter): the traces by side
    (and their ``RunMetrics`` for the block sizes, each read once, between blocks: outside the
    pairs' clock), how their runs take turns (``unstepped``: why not token by token, once a run
    or a side showed it)."""

    def __init__(self, engines: dict[str, Engine], names: Mapping[str, str], workload: Workload) -> None:
        self.engines, self.names, self.workload = engines, names, workload
        self.unstepped = stepped_sides(engines, names)
        self.runs: dict[str, list[RunTrace]] = {"A": [], "B": []}
        self.metrics: dict[str, list[RunMetrics]] = {"A": [], "B": []}
        self.warm: tuple[list[RunTrace], list[RunTrace]] = ([], [])

    def timed(self) -> tuple[tuple[RunMetrics, ...], tuple[RunMetrics, ...]]:
        """Each side's timed runs so far as ``RunMetrics`` (the runs since the last call read now)."""
        for side, done in self.metrics.items():
            done.extend(run_metrics(t) for t in self.runs[side][len(done) :])
        return tuple(self.metrics["A"]), tuple(self.metrics["B"])

    def warm_up(self, seed: int, *, keep: bool) -> None:
        """The workload's warm-up pairs on the current engines (``keep``: their traces kept, the
        given engines'; a fresh pair's are dropped, its warm-up is part of its build)."""
        for i, order in enumerate(block_orders(self.workload.warmup, seed + 1)):
            pair = self._pair(-1 - i, order)
            if keep:
                self.warm[0].append(pair["A"])
                self.warm[1].append(pair["B"])

    def pair(self, index: int, order: str) -> None:
        for side, trace in self._pair(index, order).items():
            self.runs[side].append(trace)

    def _pair(self, index: int, order: str) -> dict[str, RunTrace]:
        with timed():  # the heartbeat says nothing inside a run
            pair = None
            if self.unstepped is None:
                pair = _stepped_pair(self.engines, self.names, self.workload, index, order)
            if isinstance(pair, str):
                self.unstepped, pair = pair, None
            if pair is None:
                pair = {side: self.engines[side].run(self.workload, index) for side in order}
        return pair


def one_instance(engines: Mapping[str, Engine], names: Mapping[str, str]) -> str | None:
    """Why an A/B's pairs run on one instance pair (no second level): a side that cannot give a
    fresh instance of itself (``FreshInstances``); None when both can."""
    for letter, engine in engines.items():
        if isinstance(engine, FreshInstances):
            continue
        side = f"side {letter} [{names[letter]}]"
        if isinstance(engine, DrivenLlama):
            return f"{side} is a callable, which llmperf cannot build again"
        return f"{side} ({type(engine).__name__}) cannot give a fresh instance of itself (FreshInstances)"
    return None


class _Instances:
    """An A/B's fresh instance pairs (``interleave``): each built when its block starts, the
    previous one closed first, the last at ``close``; the given engines are never closed (the
    session's pool, or the user's). One engine on both sides gets one fresh engine on both."""

    def __init__(self, a: Engine, b: Engine) -> None:
        self.given = {"A": a, "B": b}
        self.live: list[FreshEngine] = []
        self.built = 0  # fresh pairs so far

    def fresh(self) -> dict[str, Engine]:
        self.close()
        a, b = self.given["A"], self.given["B"]
        # ``one_instance`` let only these through
        assert isinstance(a, FreshInstances) and isinstance(b, FreshInstances)
        fa = a.fresh_instance()
        self.live.append(fa)
        fb = fa if b is a else b.fresh_instance()
        if fb is not fa:
            self.live.append(fb)
        self.built += 1
        return {"A": fa, "B": fb}

    def close(self) -> None:
        while self.live:
            self.live.pop().close()


def stepped_sides(engines: Mapping[str, Engine], names: Mapping[str, str]) -> str | None:
    """Why two engines of this process cannot take turns token by token, or None when they can:
    both pause between tokens (``SteppedRuns``, its ``run_stepped`` no further from the engine's
    class than its ``run``: a subclass that makes ``run`` its own would be left out), each holds
    its own run (not one engine on both sides), and neither is a callable on the process's Llamas
    (a callable's run watches every ``llama_cpp.Llama`` of the process, one run at a time)."""
    a, b = engines["A"], engines["B"]
    if a is b:
        return "both sides are one engine, which holds one run at a time"
    for letter, engine in engines.items():
        side = f"side {letter} [{names[letter]}]"
        if isinstance(engine, WorkerEngine):
            return f"{side} runs in an engine worker, which cannot pause between tokens (--llmperf-in-process can)"
        if not isinstance(engine, SteppedRuns):
            return f"{side} cannot pause between tokens"
        if _defined_in(engine, "run") < _defined_in(engine, "run_stepped"):
            return f"{side} has a run of its own ({type(engine).__name__}.run) that its steps would leave out"
        if isinstance(engine, DrivenLlama):
            return f"{side} is a callable: its runs watch the process's llama_cpp.Llama objects one run at a time"
    return None


def _defined_in(engine: Engine, name: str) -> int:
    """How far down ``engine``'s class hierarchy ``name`` is defined (0: its own class)."""
    return next(i for i, cls in enumerate(type(engine).__mro__) if name in vars(cls))


def _stepped_pair(
    engines: Mapping[str, Engine], names: Mapping[str, str], workload: Workload, index: int, order: str
) -> dict[str, RunTrace] | str:
    """One pair token by token, each side's run in a thread of its own that runs only between a
    "go" and its next pause: both runs start paused (one after the other); then each side takes
    one step (the prompt, then one token) in turn, the first side of the pair's order first, the
    order turning at every step; a side whose run has ended is passed over. Each side's trace by
    its letter, or the line of a side that could not pause (``NotSteppable``: the other side's
    run is let end and both traces dropped)."""
    runs = {letter: _SteppedRun(engines[letter], workload, index) for letter in order}
    answers = {letter: runs[letter].start() for letter in order}
    step = 0
    while True:
        failed = [(letter, got) for letter, got in answers.items() if isinstance(got, Exception)]
        if failed:
            for letter, run in runs.items():
                run.finish(answers[letter])
            letter, exc = failed[0]
            if isinstance(exc, NotSteppable):
                return f"side {letter} [{names[letter]}]: {exc}"
            raise exc
        open_ = [letter for letter in (order if step % 2 == 0 else order[::-1]) if answers[letter] is _PAUSED]
        if not open_:
            return {letter: got for letter, got in answers.items() if isinstance(got, RunTrace)}
        for letter in open_:
            answers[letter] = runs[letter].go()
            if isinstance(answers[letter], Exception):
                break
        step += 1


_PAUSED = object()  # a stepped run's answer while it waits for its next step


class _SteppedRun:
    """One side's stepped run (``SteppedRuns.run_stepped``) in a thread of its own: each answer
    (paused, its trace, its error) is read by the scheduler, which alone lets it on ("go")."""

    def __init__(self, engine: Engine, workload: Workload, index: int) -> None:
        self.answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.going = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._main, args=(engine, workload, index), daemon=True)

    def start(self) -> object:
        """The run up to its first pause (before its first clock read): that answer."""
        self.thread.start()
        return self.answers.get()

    def go(self) -> object:
        """One step: the answer at its next pause or its end."""
        self.going.release()
        return self.answers.get()

    def finish(self, answer: object) -> None:
        """Steps until the run ends (its trace dropped), from its last ``answer``."""
        while answer is _PAUSED:
            answer = self.go()
        self.thread.join()

    def _pause(self) -> None:
        self.answers.put(_PAUSED)
        self.going.acquire()

    def _main(self, engine: Engine, workload: Workload, index: int) -> None:
        assert isinstance(engine, SteppedRuns)  # ``stepped_sides`` let only these through
        try:
            self.answers.put(engine.run_stepped(workload, index, self._pause))
        except Exception as exc:  # noqa: BLE001 - handed to the scheduler, which raises it
            self.answers.put(exc)


def measured(
    traces: list[RunTrace], warm: list[RunTrace], workload: Workload, info: EngineInfo, label: str
) -> Measurement:
    """One side's measurement of its interleaved runs, its warm-up runs with it."""
    m = summarize(traces, workload, info, label=label)
    return dataclasses.replace(m, warmup_runs=tuple(run_metrics(t) for t in warm))


class SideRuns:
    """A side's end of its channel (``--llmperf-against``): the runs its controller asks for."""

    def __init__(self, requests: IO[bytes], replies: IO[bytes]) -> None:
        self.requests, self.replies = requests, replies
        self.attribution: Stepping | None = None  # this side's attribution pass between its steps
        # This process's CPUs before any pinning (none known off Linux: nothing is pinned there).
        self.all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def send(self, message: Mapping[str, object]) -> None:
        self.replies.write((json.dumps(message) + "\n").encode())
        self.replies.flush()

    def receive(self) -> dict[str, Any]:
        line = self.requests.readline()
        if not line:  # the controller is gone: nothing more to do
            os._exit(3)
        message: dict[str, Any] = json.loads(line)
        if message.get("op") == "close":
            os._exit(0)
        return message

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Work no other side may overlap (an A/B ``compare()``, a load test)."""
        self.send({"ev": "turn"})
        self.receive()  # {"op": "go"}
        try:
            yield
        finally:
            self.send({"ev": "released"})

    def _pause(self) -> None:
        """A stepped run's pause (``SteppedRuns``): "paused" to the controller, on at its "go"."""
        self.send({"ev": "paused"})
        op = self.receive()
        if op.get("op") != "go":
            raise Called(op)

    def measure(
        self,
        subject: Engine | TokenStream,
        workload: Workload,
        label: str,
        *,
        settings: Mapping[str, float],
        max_runs: object,
        threads: object,
        max_processes: object = None,
        slo: Mapping[str, float],
        attribution: bool = False,
    ) -> tuple[Measurement, Mapping[str, Any] | None]:
        """The measurement the controller drives: the runs it asks for, then its verdict's JSON
        (``settings``, ``max_runs``, ``max_processes``: the marker's, which the controller reads; ``threads``: the
        llama.cpp threads of a callable, whose own are unknown; ``slo``: a load test's budgets;
        ``attribution``: the test asks for the attribution pass after the pairs)."""
        engine = as_engine(subject)
        if workload.is_load:
            with self.turn():
                return measure(engine, workload, label=label, slo=slo), None
        info = engine.info()
        self.send(
            {  # what it measures: the workload, the settings, the engine, its threads, its abilities
                "ev": "measure",
                "label": label,
                "workload": workload.to_json(),
                "settings": dict(settings),
                "max_runs": max_runs,
                "max_processes": max_processes,
                "engine": info.describe(),
                # A callable's own threads are unknown: the session's (its llmperf_llm's) stand in.
                "threads": info.threads or threads,
                # Output agreement (after the pairs): this side's token probabilities, asked by "logits".
                "logits": isinstance(engine, TokenProbabilities),
                # The attribution pass (after the pairs, asked by "attribute"): llama.cpp in process.
                "attributable": times_layers(engine),
                "needs_ids": isinstance(engine, NeedsPromptIds),
                # Pairs token by token (each side's step in turn) when both sides' engines can pause.
                "stepped": isinstance(engine, SteppedRuns),
                "attribution": attribution,
            }
        )
        op, warm, traces = self._runs(engine, workload)
        if op.get("fail"):
            raise LLMPerfError(op["fail"])
        m = measured(traces, warm, dataclasses.replace(workload, runs=len(traces)), info, label)
        verdict = op.get("verdict")
        agreement = (verdict or {}).get("agreement")
        return dataclasses.replace(m, agreement=None if agreement is None else Agreement.from_json(agreement)), verdict

    def _runs(self, engine: Engine, workload: Workload) -> tuple[dict[str, Any], list[RunTrace], list[RunTrace]]:
        """The runs the controller asks for (each answered with its trace or its error line) and
        the token probabilities it asks for after them, until its "done": (that op, the warm-up
        traces, the timed ones)."""
        warm: list[RunTrace] = []
        traces: list[RunTrace] = []
        while True:
            op = self.receive()
            if op["op"] == "logits":  # after every run of both sides: never inside a timed region
                self.send(_token_logits(engine, op))
                continue
            if op["op"] == "attribute":  # after the pairs, as "logits": the attribution pass, run by run
                self.send(self._attribute(engine, workload, traces, op))
                continue
            if op["op"] != "run":
                return op, warm, traces
            # Before the run's first clock read. No CPUs given: all of them again (an earlier
            # test's pinning must not hold a later test with more threads to fewer CPUs).
            pin(op.get("cpus") or self.all_cpus)
            try:
                trace = self._run(engine, workload, int(op["index"]), stepped=bool(op.get("stepped")))
            except Called as called:  # the controller ended the run during a pause
                return called.op, warm, traces
            if trace is not None:
                (warm if op["index"] < 0 else traces).append(trace)
                self.send({"ev": "trace", "trace": trace.to_json()})

    def _attribute(
        self, engine: Engine, workload: Workload, traces: list[RunTrace], op: Mapping[str, Any]
    ) -> dict[str, object]:
        """One step of this side's attribution pass (open, warm, run, result, close), its result
        with this side's roofline and memory figures, or one line why it has none."""
        step, one = op.get("step"), self.attribution
        try:
            if step == "open":
                if one is not None:  # a pass the controller left open (it lost the other side)
                    one.close()
                self.attribution = None
                self.attribution = pass_of(engine, workload)
            elif one is None:
                return {"ev": "attribution", "line": f"attribution step {step!r} without an open pass"}
            elif step == "warm":
                one.warm_up()
            elif step == "run":
                one.run(int(op["index"]))
            else:
                self.attribution = None
                if step == "result":
                    return {
                        "ev": "attribution",
                        "got": one.result().to_json(),
                        "figures": traces_figures(engine, workload, traces),
                    }
                one.close()
        except Exception as exc:  # noqa: BLE001 - one line to the controller, its verdict says it
            if self.attribution is not None:
                self.attribution.close()
                self.attribution = None
            return {"ev": "attribution", "line": one_line(exc)}
        return {"ev": "attribution"}

    def _run(self, engine: Engine, workload: Workload, index: int, *, stepped: bool = False) -> RunTrace | None:
        """One run (``stepped``: token by token, each step when the controller says "go"); a
        failed one is one line to the controller (None)."""
        try:  # the run's clock reads are all inside engine.run: no pipe, no controller work between them
            if stepped and isinstance(engine, SteppedRuns):
                return engine.run_stepped(workload, index, self._pause)
            return engine.run(workload, index)
        except Called:
            raise
        except NotSteppable as exc:
            self.send({"ev": "unstepped", "line": str(exc)})
            return None
        except Exception as exc:  # noqa: BLE001 - the user's callable too: one line to the controller
            self.send({"ev": "error", "line": one_line(exc)})
            return None


class Called(Exception):
    """The controller answered a pause with another op than "go" (``op``): the run ends there."""

    def __init__(self, op: dict[str, Any]) -> None:
        super().__init__(op.get("op"))
        self.op = op


def _token_logits(engine: Any, op: Mapping[str, Any]) -> dict[str, object]:
    """The reply to a "logits" op: the engine's ``TokenLogits`` (``worker.logits_json``), or one line."""
    try:
        got = engine.token_logits(
            Workload.from_json(op["workload"]),
            op.get("forced"),
            **({"prompt_ids": op["prompt_ids"]} if op.get("prompt_ids") is not None else {}),
        )
    except Exception as exc:  # noqa: BLE001 - one line to the controller, the agreement says it
        return {"ev": "logits", "line": one_line(exc)}
    if isinstance(got, str):  # an endpoint that cannot say (``engines.http``)
        return {"ev": "logits", "line": got}
    return {"ev": "logits", "got": logits_json(got)}
