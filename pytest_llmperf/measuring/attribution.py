"""Where llama.cpp's own time goes: each graph node timed, by layer and by ggml op type.

An instrumented pass after the timed runs (never inside them), on a second context made for it
(``measuring.layers.LayerTimer``, driving the engine's own timed loop). llama.cpp's scheduler
asks the eval callback (``cb_eval``) about each graph node; this one answers yes to every node
that computes something, so the scheduler computes each such node apart, synchronizes and
calls back after it. A node's time runs from the scheduler's first question after the previous
node (the callback's clock read then) to the call after the node was computed: its compute
and its synchronization, not the callback's own work in between.

Nodes whose op computes nothing (``NO_OPS``: VIEW, RESHAPE, PERMUTE, TRANSPOSE, NONE, as
``ggml_op_desc`` names them in this build) are answered no: ggml skips them, and computing them
apart would only add a scheduler round trip each; they run with the next node that computes.

Each node's op is ``ggml_op_desc(tensor)`` (``MUL_MAT``, ``ADD``, ``RMS_NORM``, ``ROPE``,
``FLASH_ATTN_EXT``, ``SET_ROWS``, ``GET_ROWS``; a GLU or unary op by its kind: ``SWIGLU``,
``SILU``), its layer the suffix of its name as llama.cpp's graph names it (``attn_out-3``: layer
3; the KV cache views ``cache_k_l3``: layer 3; ``layer_of``). The time is kept per layer, per
raw op type and per group (``GROUPS``, ``group_of``), prefill and decode apart, per run (the
unit of comparisons, ``judge.attribution``) and as medians over all steps. Plain runs of the
engine are interleaved with the instrumented ones, so the instrumentation's cost (instrumented
/ plain step time) is measured, not assumed; ``coverage`` says how much of the instrumented step
the node times hold (the rest: the graph's build and input upload, the scheduler's round trips).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..core.formats import sig6
from ..core.measurement import KINDS, Attribution, PhaseAttribution, RunMetrics, Slice
from ..core.progress import task
from ..core.workload import Workload
from .layers import LayerTimer, ggml_function, steps_of, tpot_of
from .metrics import run_metrics
from .roofline import roofline

if TYPE_CHECKING:
    from ..core.measurement import Measurement, Peak
    from ..engines.capabilities import LayerTiming

#: Ops that compute nothing (ggml skips them): never computed apart (module docstring).
NO_OPS = frozenset({b"NONE", b"VIEW", b"RESHAPE", b"PERMUTE", b"TRANSPOSE"})

#: The groups, in the order every report shows them.
GROUPS = ("matrix multiplication", "attention", "normalisation", "rope", "copies", "elementwise", "other")
MATMUL, ATTENTION, NORMALISATION, ROPE, COPIES, ELEMENTWISE, OTHER = GROUPS
#: Attention by op; and by name: llama.cpp names the attention nodes it builds kq-N (K x Q),
#: kq_soft_max-N, kqv-N (x V), kqv_merged-N, kqv_out-N, so K x Q and x V, matrix
#: multiplications by op, count as attention (the projections Qcur/Kcur/Vcur/attn_out do not).
ATTENTION_OPS = frozenset({"SOFT_MAX", "FLASH_ATTN_EXT"})
NORM_OPS = frozenset({"RMS_NORM", "NORM", "GROUP_NORM", "L2_NORM"})
COPY_OPS = frozenset({"CPY", "CONT", "DUP", "SET_ROWS", "GET_ROWS", "CONCAT"})
ELEMENTWISE_OPS = frozenset(
    {"ADD", "ADD1", "ADD_ID", "SUB", "MUL", "DIV", "SCALE", "SQR", "SQRT", "LOG", "CLAMP", "GLU", "UNARY"}
    | {"SWIGLU", "GEGLU", "REGLU", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_OAI"}  # ggml_op_desc of a GLU
    | {"SILU", "GELU", "GELU_QUICK", "GELU_ERF", "RELU", "TANH", "SIGMOID", "EXP", "ABS", "NEG", "STEP"}  # unary
)

_SUFFIX = re.compile(rb"(?:-|_l)(\d+)$")
_GENERIC = re.compile(rb"node_\d+$")
INPUT, OUTPUT = "input", "output"


def base_name(name: bytes) -> bytes:
    """A node's name without ggml's `` (view)``, `` (permuted)``... additions."""
    return name.split(b" (", 1)[0]


def layer_of(name: bytes, before: str | None) -> str:
    """The layer a node counts to (``LAYER_RULE``); ``before``: its graph predecessor's."""
    base = base_name(name)
    m = _SUFFIX.search(base)
    if m:
        return f"layer {int(m.group(1))}"
    if _GENERIC.match(base):
        return before or OTHER
    if base.startswith(b"result") or base == b"norm":
        return OUTPUT
    return INPUT


def group_of(op: str, name: bytes) -> str:
    """The group of a node (``GROUP_RULE``)."""
    base = base_name(name)
    if op in ATTENTION_OPS or base.startswith(b"kq"):
        return ATTENTION
    if op.startswith("MUL_MAT") or op == "OUT_PROD":
        return MATMUL
    if op in NORM_OPS or _SUFFIX.sub(b"", base).endswith(b"norm"):
        return NORMALISATION
    if op.startswith("ROPE"):
        return ROPE
    if op in COPY_OPS:
        return COPIES
    if op in ELEMENTWISE_OPS:
        return ELEMENTWISE
    return OTHER


#: One computed node as the callback records it: (name, op, ns of the scheduler's first question
#: about it), and the ns after it was computed.
NodeEvent = tuple[tuple[bytes, bytes, int], int]


def step_times(events: Sequence[NodeEvent]) -> dict[str, dict[str, float]]:
    """One step's node times (ms) summed by layer, op and group; ``nodes``: their total;
    ``blocks``: the transformer blocks' total."""
    out: dict[str, dict[str, float]] = {"layers": {}, "ops": {}, "groups": {}}
    before: str | None = None
    total = 0.0
    for (name, op_bytes, start), end in events:
        op = op_bytes.decode("ascii", "replace")
        ms = (end - start) / 1e6
        before = layer_of(name, before)
        for kind, key in (("layers", before), ("ops", op), ("groups", group_of(op, name))):
            out[kind][key] = out[kind].get(key, 0.0) + ms
        total += ms
    out["nodes"] = {"ms": total, "count": float(len(events))}
    out["blocks"] = {"blocks": sum(ms for key, ms in out["layers"].items() if key.startswith("layer "))}
    return out


class NodeTimer(LayerTimer):
    """``LayerTimer`` asking for every node that computes (module docstring)."""

    def _make_callback(self) -> Callable[[int, bool, int], bool]:
        get_name = ggml_function(self._lib, "ggml_get_name")
        op_desc = ggml_function(self._lib, "ggml_op_desc")
        events_append = self._events.append
        clock = time.perf_counter_ns
        asked = [0]  # ns of the scheduler's first question since the last node computed (0: none)

        def callback(tensor: int, ask: bool, _user: int) -> bool:
            if ask:
                if not asked[0]:
                    asked[0] = clock()
                return op_desc(tensor) not in NO_OPS
            done = clock()
            events_append(((get_name(tensor), op_desc(tensor), asked[0]), done))
            asked[0] = 0
            return True

        return callback

    def run_nodes(self) -> tuple[list[tuple[int, list[NodeEvent], int]], list[tuple[int, list[NodeEvent], int]], float]:
        """One run: the prefill step and the decode steps, each (start, node events, end), and
        the run's TPOT (ms)."""
        timed = self.timed()
        return (*steps_of(timed.start_ns, timed.prefill_done_ns, timed.token_ns, list(self._events)), tpot_of(timed))

    def prefill_nodes(self) -> list[tuple[int, list[NodeEvent], int]]:
        """The prompt's step alone (the same timed loop, one token): a further prefill sample."""
        timed = self.timed(1)
        return steps_of(timed.start_ns, timed.prefill_done_ns, timed.token_ns, list(self._events))[0]


#: Instrumented runs (each with an interleaved plain run) unless the caller gives another count.
#: Five a side are the fewest that give the runs' rank CI (``judge.attribution``) its 95% at all,
#: and it excludes "no change" only when 23 of the 25 run differences b_j - a_i lie one way;
#: with eight, 51 of the 64. With five, threads 2 -> 1 on the small preset (TPOT +18..+33%) left the blocks'
#: CI spanning 1 in 2 of 7 sessions (``benchmarks/why_cases.py``, case c).
ATTRIBUTION_RUNS = 8
#: Each instrumented run times the prompt's step this many more times (the step alone): a run's
#: prefill figure is the median of its steps, so one preempted step does not make the run's.
PREFILL_REPEATS = 2

Steps = list[tuple[int, list[NodeEvent], int]]


class Stepping(Protocol):
    """A pass run by run: ``AttributionPass`` here, or one run where the engine's model is
    (``measuring.worker``'s ``RemotePass``)."""

    def warm_up(self) -> None: ...

    def run(self, index: int) -> None: ...

    def result(self) -> Attribution: ...

    def close(self) -> None: ...


class AttributionPass:
    """One engine's pass, run by run (``warm_up``, ``run(i)``..., ``result``), so the passes of
    two sides can interleave run by run as their timed runs did (``judge.attribution``,
    ``--llmperf-against``'s sides); ``wall_s`` counts this side's own work only."""

    def __init__(self, engine: LayerTiming, workload: Workload) -> None:
        self._engine, self._workload = engine, workload
        started = time.monotonic()
        self._timer: NodeTimer | None = NodeTimer(engine, workload)
        self.wall_s = time.monotonic() - started
        self._steps: dict[str, list[Steps]] = {"prefill": [], "decode": []}
        self._tpots: list[float] = []
        self._plain: list[RunMetrics] = []

    def _live(self) -> NodeTimer:
        if self._timer is None:
            raise RuntimeError("the attribution pass is closed")
        return self._timer

    def warm_up(self) -> None:
        """One instrumented and one plain run, discarded."""
        started = time.monotonic()
        self._live().run_nodes()
        self._engine.run(self._workload, -1)  # type: ignore[attr-defined]  # LayerTiming engines are Engines
        self.wall_s += time.monotonic() - started

    def run(self, index: int) -> None:
        """One instrumented run (and ``PREFILL_REPEATS`` prompt steps), then one plain run."""
        started = time.monotonic()
        timer = self._live()
        prefill, decode, tpot_ms = timer.run_nodes()
        for _ in range(PREFILL_REPEATS):
            prefill += timer.prefill_nodes()
        self._steps["prefill"].append(prefill)
        self._steps["decode"].append(decode)
        self._tpots.append(tpot_ms)
        self._plain.append(run_metrics(self._engine.run(self._workload, index)))  # type: ignore[attr-defined]
        self.wall_s += time.monotonic() - started

    def close(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    def result(self) -> Attribution:
        """The runs so far (at least one), and the instrumented context freed."""
        self.close()
        plain = self._plain
        prefills = [r.prefill_ms for r in plain if r.prefill_ms is not None]
        return Attribution(
            prefill=phase_of("prefill", self._steps["prefill"]),
            decode=phase_of("decode", self._steps["decode"]),
            tpot_ms=float(np.median(self._tpots)),
            plain_prefill_ms=float(np.median(prefills)) if prefills else None,
            plain_tpot_ms=float(np.median([r.tpot_ms for r in plain])),
            wall_s=self.wall_s,
        )


def attribute(engine: LayerTiming, workload: Workload, runs: int = ATTRIBUTION_RUNS) -> Attribution:
    """Time every node over ``runs`` instrumented runs, each paired with a plain run on the
    engine's own context (interleaved, as ``layers.profile_layers``), after one warm-up of each."""
    return run_pass(AttributionPass(engine, workload), runs)


def interleaved(passes: Mapping[str, Stepping], warm: Sequence[str], orders: Sequence[str]) -> dict[str, Attribution]:
    """Two sides' passes run by run as their timed runs were (``warm``: the warm-ups' order,
    ``orders``: each run's, e.g. "AB", "BA"; the keys of ``passes`` are the letters): drift of
    the machine over the passes falls on both sides alike. Closed either way."""
    try:
        with task("attribution pass") as progress:
            progress.step("warm-up")
            for letter in warm:
                passes[letter].warm_up()
            progress.step("instrumented runs", 0, len(orders))
            for i, order in enumerate(orders):
                for letter in order:
                    passes[letter].run(i)
                progress.advance(i + 1)
            progress.step("result")
            return {letter: one.result() for letter, one in passes.items()}
    finally:
        for one in passes.values():
            one.close()


def run_pass(one: Stepping, runs: int = ATTRIBUTION_RUNS) -> Attribution:
    """A pass's warm-up and runs, then its result (closed either way): ``interleaved`` with one side."""
    return interleaved({"A": one}, "A", ["A"] * runs)["A"]


def phase_of(phase: str, runs: Sequence[Sequence[tuple[int, Sequence[NodeEvent], int]]]) -> PhaseAttribution:
    """A phase's slices from each run's steps (start, node events, end)."""
    per_run = [[step_times(ev) for _, ev, _ in run] for run in runs]
    spans = [[(end - start) / 1e6 for start, _, end in run] for run in runs]
    every = [s for run in per_run for s in run]
    step_ms = [t for run in spans for t in run]
    nodes_ms = [s["nodes"]["ms"] for s in every]
    kinds = {kind: _slices(kind, per_run) for kind in KINDS}
    return PhaseAttribution(
        phase,
        kinds["layers"],
        kinds["ops"],
        kinds["groups"],
        step_ms=float(np.median(step_ms)),
        nodes_ms=float(np.median(nodes_ms)),
        coverage=float(np.median(np.asarray(nodes_ms) / np.asarray(step_ms))),
        nodes=int(np.median([s["nodes"]["count"] for s in every])),
        n_runs=len(runs),
        n_steps=len(every),
        blocks=next(iter(_slices("blocks", per_run)), None),
    )


def _slices(kind: str, per_run: Sequence[Sequence[Mapping[str, Mapping[str, float]]]]) -> tuple[Slice, ...]:
    """Each key of ``kind`` over every step (a step without it: 0 ms), in ``_order``."""
    names = _order(kind, (k for run in per_run for s in run for k in s[kind]))
    out = []
    for name in names:
        runs = [np.array([s[kind].get(name, 0.0) for s in run]) for run in per_run]
        every = np.concatenate(runs)
        out.append(Slice(name, float(np.median(every)), tuple(float(np.median(r)) for r in runs)))
    if kind == "ops":  # the costliest first
        out.sort(key=lambda s: -s.median_ms)
    return tuple(out)


def _order(kind: str, keys: Iterable[str]) -> list[str]:
    """Groups in ``GROUPS``' order, layers as input, layer 0.., output, other; ops by name
    (sorted by time once measured)."""
    seen = set(keys)
    if kind == "groups":
        return [g for g in GROUPS if g in seen]
    if kind == "layers":
        blocks = sorted((k for k in seen if k.startswith("layer ")), key=lambda k: int(k.split()[1]))
        return [k for k in (INPUT, *blocks, OUTPUT, OTHER) if k in seen]
    return sorted(seen)


def side_figures(m: Measurement, peaks: tuple[Peak, Peak] | None = None) -> dict[str, float]:
    """One side's achieved decode bandwidth and MBU (its roofline: the measurement's own, or
    computed with ``peaks``) and memory figures, where known."""
    r = m.roofline
    if r is None and peaks is not None:
        r = roofline(m, *peaks)
    out: dict[str, float | None] = {}
    if r is not None:
        out["decode_bw_gbs"] = sig6(r.decode.achieved_bw_gbs)
        out["decode_mbu"] = None if r.decode.note else sig6(r.decode.mbu)
    if m.peak_rss is not None:
        out["peak_rss_mib"] = sig6(m.peak_rss.bytes / 2**20)
    for key in ("kv_mib", "compute_mib"):
        value = getattr(m.engine, key)
        if value is not None:
            out[key] = sig6(value)
    return {k: v for k, v in out.items() if v is not None}
