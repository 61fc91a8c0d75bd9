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
import json
import os
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..core.errors import LLMPerfError, NotSteppable
from ..core.measurement import Agreement, Measurement
from ..core.progress import task, timed
from ..core.workload import EngineInfo, RunTrace, Workload
from ..engines import Engine, NeedsPromptIds, SteppedRuns, TokenProbabilities, TokenStream, times_layers
from .attribution import ATTRIBUTION_RUNS
from .metrics import run_metrics, summarize
from .runner import as_engine, measure, pass_of, traces_figures
from .worker import logits_json, pin

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


def interleave(
    a: Engine, b: Engine, workload: Workload, seed: int
) -> tuple[list[RunTrace], list[RunTrace], list[RunTrace], list[RunTrace], tuple[str, ...]]:
    """(A traces, B traces, A warm-up traces, B warm-up traces, orders)."""
    runs: dict[str, tuple[Engine, list[RunTrace], list[RunTrace]]] = {"A": (a, [], []), "B": (b, [], [])}
    orders = block_orders(workload.runs, seed)
    with task("interleaved pairs") as progress:
        progress.step("warm-up pairs", 0, workload.warmup)
        for i, order in enumerate(block_orders(workload.warmup, seed + 1)):
            for side in order:
                engine, warm, _ = runs[side]
                with timed():  # the heartbeat says nothing inside a run
                    warm.append(engine.run(workload, -1 - i))
        progress.step("pairs", 0, workload.runs)
        for i, order in enumerate(orders):
            for side in order:
                engine, _, traces = runs[side]
                with timed():
                    traces.append(engine.run(workload, i))
            progress.advance(i + 1)
    return runs["A"][2], runs["B"][2], runs["A"][1], runs["B"][1], orders


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
        return dataclasses.replace(m, agreement=None if agreement is None else Agreement.from_dict(agreement)), verdict

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
            return {
                "ev": "attribution",
                "line": str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}",
            }
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
            line = str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}"
            self.send({"ev": "error", "line": line})
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
        return {"ev": "logits", "line": str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}"}
    if isinstance(got, str):  # an endpoint that cannot say (``engines.http``)
        return {"ev": "logits", "line": got}
    return {"ev": "logits", "got": logits_json(got)}
