"""A candidate record against its baseline record: statistics per metric family, per phase.

Core, no pytest: the plugin and ``llmperf compare`` both call ``compare_records``.

Session-wide steps over the typed results (``judge.result``), once every result is in:
Holm over all the session's comparisons, and the suite-relative check. Each returns new
results (they are frozen), never edits them in place."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..baselines import records as reference
from ..core import catalog
from ..core.catalog import Metric
from ..core.fingerprint import closest_hardware, other_hardware_note, subject_changes
from ..core.measurement import OTHERS_PRESENT, Measurement, workload_changes
from ..core.settings import DEFAULT_ALPHA, DEFAULT_TAIL_THRESHOLD, DEFAULT_THRESHOLD
from . import attribution as attributions
from .parts import PartChange, beyond_the_machine, explained_phases, gated, is_headline, prompt_changes, unpaired_parts
from .result import BaselineVerdict, LayerChange, Outcome, compare_layers
from .rule import JUDGED, METRICS, MIN_PEERS, SUITE_ALPHA_SHARE, compare_levels, decide, mirrored, suite_relative
from .verdict import (
    BaselineStatus,
    Comparison,
    Level,
    NoiseModel,
    Shown,
    Verdict,
    holm,
    level,
    log_level,
    regression_cell,
)

if TYPE_CHECKING:
    from .attribution import AttributionChange

#: Recorded sessions a baseline keeps per test and hardware (the newest K, rolling).
HISTORY_SESSIONS = 10


@dataclass(frozen=True)
class CompareSettings:
    alpha: float = DEFAULT_ALPHA
    threshold: float = DEFAULT_THRESHOLD
    tail_threshold: float = DEFAULT_TAIL_THRESHOLD
    #: Judged comparisons in the whole session (Holm's m); unseen ones count as p = 1, which
    #: bounds the session-wide Holm adjustment from above, so a test can fail before the
    #: session ends.
    family_size: int | None = None
    noise: NoiseModel = NoiseModel()
    #: Looks of a sequential (adaptive run count) measurement: each look tests at alpha / looks
    #: (Bonferroni over looks), so stopping at the first decided look keeps the error rate.
    looks: int = 1
    #: Measurements the session will compare: with ``rule.MIN_PEERS`` or more, a share of
    #: alpha goes to the suite-relative check at the end of the session.
    peers: int = 0

    @property
    def suite_check(self) -> bool:
        return self.peers >= MIN_PEERS

    @property
    def alpha_suite(self) -> float:
        """Family-wise level of the session-end suite-relative check."""
        return self.alpha * SUITE_ALPHA_SHARE if self.suite_check else 0.0

    @property
    def alpha_per_look(self) -> float:
        """Level of each look of the per-test comparisons against the baseline."""
        return (self.alpha - self.alpha_suite) / max(self.looks, 1)


#: Memory against the baseline: (relative, absolute MiB) growth a figure may show before it
#: counts as grown (both must be exceeded). llama.cpp's buffers are the same bytes for the same
#: model and settings in every session (no spread over 5 sessions each of tiny and small,
#: docs/measurement.md), so any growth beyond the log's rounding (0.01 MiB) counts; the engine
#: worker's peak RSS moved by 0.16 MiB (tiny) and 1.14 MiB (small), 0.2%, across those sessions,
#: so it counts from +10% and +16 MiB up (other tests' allocations in an in-process engine move
#: it more), and only when both peaks cover the runs alone.
MEMORY_RULE: dict[str, tuple[float, float]] = {
    "kv_mib": (0.0, 0.015),
    "compute_mib": (0.0, 0.015),
    "model_buffer_mib": (0.0, 0.015),
    "rss_mib": (0.10, 16.0),
}


def compare_memory(baseline: Measurement, candidate: Measurement) -> tuple[str, ...]:
    """A line for each memory figure of ``MEMORY_RULE`` that both records carry and that grew
    beyond its rule: "KV buffer 2 -> 4 MiB (+100%; llama.cpp log) since the baseline"."""
    lines = []
    for name, (rel, slack) in MEMORY_RULE.items():
        if name == "rss_mib" and not all(_rss_over_runs(r) for r in (baseline, candidate)):
            continue
        b, c = (r.memory.figure(name) if r.memory is not None else None for r in (baseline, candidate))
        if b is not None and c is not None and c - b > slack and c > b * (1 + rel):  # beyond both
            lines.append(_memory_growth(catalog.METRICS[name], b, c))
    return tuple(lines)


def _rss_over_runs(rec: Measurement) -> bool:
    """The record's peak RSS covers its runs alone (the engine's process, over the measurement).
    A measured callable's is the pytest process's, which holds whatever the session imported and
    made: not that test's figure (its Llamas' own memory is: llama.cpp's buffers)."""
    if rec.subject.get("engine") == "callable":
        return False
    return rec.memory is not None and rec.memory.peak_rss_scope == "measurement"


def _memory_growth(metric: Metric, b: float, c: float) -> str:
    """The line for a memory figure grown from ``b`` to ``c`` MiB since the baseline."""
    change = f"+{(c - b) / b:.0%}" if b > 0 else f"+{c - b:.3g} MiB"
    source = "engine process, over the runs" if metric.name == "rss_mib" else catalog.BUFFER_SOURCE
    return f"{metric.label} {b:.6g} -> {c:.6g} MiB ({change}; {source}) since the baseline"


def carry_history(old: Measurement | None, new: Measurement, keep: int = HISTORY_SESSIONS) -> Measurement:
    """The record to store when ``new`` replaces ``old``: ``new`` with the levels of the last
    ``keep - 1`` sessions before it, when ``old`` measured the same subject and workload (a
    baseline re-recorded after a change starts its history anew)."""
    if (
        old is None
        or workload_changes(old.identity or {}, new.identity or {})
        or subject_changes(old.subject, new.subject)
    ):
        return new
    stored, columns = old.sessions or {}, old.run_columns
    try:  # per judged metric, its older recorded sessions' levels (oldest first), and its own session's
        older = {s.name: [Level.from_json(d) for d in stored.get(s.name, [])] for s in JUDGED}
        own = {s.name: level(columns[s.name], f"{s.name} of a record") for s in JUDGED if columns.get(s.name)}
    except (KeyError, TypeError, ValueError):
        return new  # an unreadable history is dropped, never guessed
    chains = {name: levels + ([own[name]] if name in own else []) for name, levels in older.items()}
    sessions = {
        name: [lv.to_json() for lv in chain[-(keep - 1) :]] for name, chain in chains.items() if chain and keep > 1
    }
    return dataclasses.replace(new, sessions=sessions) if sessions else new


def compare_records(
    baseline: Measurement,
    candidate: Measurement,
    settings: CompareSettings,
    window: Mapping[str, Sequence[Level]] | None = None,
) -> list[Comparison]:
    """Every judged metric both records carry (plus the rate mirrors), decided with Holm over
    ``family_size``. ``window``: per judged metric, the history's sessions of this test since
    the baseline was recorded (``history.series.Windows``; ``rule.compare_levels``). A metric
    whose stored or measured values cannot be judged is left out (``judged_records`` says why)."""
    return judged_records(baseline, candidate, settings, window)[0]


def _sound(rec: Measurement, name: str, side: str) -> tuple[Level | None, list[Level], list[str]]:
    """One record's session level of ``name`` and its older recorded levels, each only if it is
    one (finite, positive values; a stored level that is a level), and a note per part left out."""
    notes: list[str] = []
    own = None
    if name in rec.run_columns:  # measured: its runs are judged, or named
        try:
            own = level(rec.run_columns[name], f"{name} of the {side}")
        except (TypeError, ValueError) as exc:
            notes.append(f"{exc}")
    older: list[Level] = []
    stored = (rec.sessions or {}).get(name, [])
    for i, d in enumerate(stored if isinstance(stored, list) else []):
        try:
            older.append(Level.from_json(d))
        except ValueError:
            notes.append(f"recorded session {i + 1} of {name} in the {side} is not a session level; left out")
    return own, older, notes


def judged_records(
    baseline: Measurement,
    candidate: Measurement,
    settings: CompareSettings,
    window: Mapping[str, Sequence[Level]] | None = None,
) -> tuple[list[Comparison], list[str]]:
    """``compare_records``'s comparisons, and one line per metric (or stored session) left out
    because its values are not finite positive numbers: "cannot judge ...: why; what to do"."""
    judged: dict[str, Comparison] = {}
    notes: list[str] = []
    pairs = request_pairs(baseline, candidate)
    by_request: list[str] = []
    for spec in JUDGED:
        base, older, base_notes = _sound(baseline, spec.name, "baseline")
        cand, _, cand_notes = _sound(candidate, spec.name, "measurement")
        notes += [f"cannot judge {spec.label}: {n}; re-record with --llmperf-update-baselines" for n in base_notes]
        notes += [f"cannot judge {spec.label}: {n}" for n in cand_notes]
        if base is None or cand is None:
            continue
        paired = _by_request(baseline, candidate, spec.name, pairs, base)
        if paired is not None:
            (base, cand), by_request = paired, [*by_request, spec.label]
        judged[spec.name] = compare_levels(
            spec,
            [*older, base],
            cand,
            threshold=settings.tail_threshold if spec.tail else settings.threshold,
            alpha=settings.alpha_per_look,
            noise=settings.noise,
            provisional=False,
            window=(window or {}).get(spec.name, ()),
        )
    if by_request:
        notes.append(
            f"{', '.join(by_request)} compared run by run over {len(pairs)} runs that sent the same request "
            "on both sides (a prompt set: paired by request, so the mix of prompt lengths cancels)"
        )
    comparisons = _with_rates(judged, baseline, candidate)
    family = max(settings.family_size or 0, len(judged)) or None
    return decide(comparisons, alpha=settings.alpha_per_look, m=family), notes


#: The fewest runs of the same request on both sides that a comparison pairs (fewer: unpaired).
MIN_REQUEST_PAIRS = 3


def request_pairs(baseline: Measurement, candidate: Measurement) -> tuple[int, ...]:
    """The runs i at which both records' run i sent the same request of a prompt set with the
    same prompt tokens (``requests``: run i sends ``drawn(set, seed, i)`` on every side, so all
    runs both have, unless the tokenizer changed); none when either record keeps no requests
    or fewer than ``MIN_REQUEST_PAIRS`` match."""
    b, c = (r.requests.sent if r.requests is not None else None for r in (baseline, candidate))
    if b is None or c is None:
        return ()
    same = tuple(i for i, (x, y) in enumerate(zip(b, c)) if x == y)
    return same if len(same) >= MIN_REQUEST_PAIRS else ()


def _by_request(
    baseline: Measurement, candidate: Measurement, name: str, pairs: Sequence[int], base: Level
) -> tuple[Level, Level] | None:
    """(the baseline's level, the candidate's) of ``name`` where runs ``pairs`` sent the same
    request on both sides: the candidate's is the baseline's moved by the level of the pairs'
    log ratios, with those ratios' standard error (both sessions' run-to-run error, the mix's
    differences between requests cancelled), so the baseline's own carries none; the recorded
    sessions' between-session noise still applies. None: no pairs, or values not judged."""
    b, c = _run_values(baseline, name), _run_values(candidate, name)
    if not pairs or b is None or c is None or max(pairs) >= min(len(b), len(c)):
        return None
    change = log_level([math.log(c[i]) - math.log(b[i]) for i in pairs])
    return (
        Level(base.log_level, 0.0, base.n, base.spread),
        Level(base.log_level + change.log_level, change.se, change.n, change.spread),
    )


def _with_rates(judged: dict[str, Comparison], baseline: Measurement, candidate: Measurement) -> list[Comparison]:
    """The judged comparisons in the catalog's order, each followed where it comes by the rate
    that mirrors it, shown with the rate's own figures (``_rate_figures``), when both records
    carry the rate."""
    comparisons = []
    for spec in METRICS.values():
        if spec.mirror_of is None and spec.name in judged:
            comparisons.append(judged[spec.name])
        elif spec.mirror_of in judged:
            c = judged[spec.mirror_of]
            scale = _reciprocal_scale(baseline, candidate, spec.name, c.metric)
            if scale is not None:  # the rate's levels: the judged ones turned over
                comparisons.append(mirrored(c, spec, (scale / c.baseline_value, scale / c.candidate_value)))
            elif (medians := _medians(baseline, candidate, spec.name)) is not None:
                change = (medians[1] / medians[0], None, None)
                comparisons.append(mirrored(c, spec, medians, shown=Shown.MEDIAN, change=change))
    return comparisons


def _run_values(rec: Measurement, name: str) -> list[float] | None:
    """The record's per-run values of ``name``, when they are all finite positive numbers."""
    values = rec.run_columns.get(name)
    if not isinstance(values, tuple) or not values:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in values):
        return None
    return [float(v) for v in values]


#: A rate is the reciprocal of the time it mirrors when rate x time is this close to one constant
#: over every run of both records (records keep 6 significant digits).
RECIPROCAL_TOLERANCE = 1e-4


def _reciprocal_scale(baseline: Measurement, candidate: Measurement, rate: str, time: str) -> float | None:
    """``k`` where every run of both records has ``rate = k / time`` (decode TPS = 1000 / TPOT):
    then the rate's level is ``k`` / the time's level, on either side; None where it is not so
    (prefill TPS counts the prompt's tokens over the prefill alone, not over TTFT)."""
    products = []
    for rec in (baseline, candidate):
        rates, times = _run_values(rec, rate), _run_values(rec, time)
        if rates is None or times is None or len(rates) != len(times):
            return None
        products += [r * t for r, t in zip(rates, times)]
    k = statistics.median(products)
    return k if all(abs(p / k - 1.0) <= RECIPROCAL_TOLERANCE for p in products) else None


def _medians(baseline: Measurement, candidate: Measurement, name: str) -> tuple[float, float] | None:
    """Both records' median of ``name`` (a rate shown beside the metric it mirrors), if both
    carry finite positive numbers for it."""
    b, c = _run_values(baseline, name), _run_values(candidate, name)
    return None if b is None or c is None else (float(statistics.median(b)), float(statistics.median(c)))


#: The hypervisor took this much more of the CPU time (steal) during the candidate's runs than
#: during the baseline's: the machine was not this VM's, so a slowdown is not the subject's.
#: llama.cpp's threads meet at a barrier every graph node, so one descheduled vCPU stalls all
#: of them (seen here: 15% steal, TPOT 3.8x the quiet value).
STEAL_MACHINE_SHARE = 0.05


#: Other processes preempted the engine's threads this many times as often per run as during
#: the baseline's runs: the cores were shared (seen here: 400-1600 per run in such sessions,
#: with run CVs of 1-2.5, against 40-270 in clean ones). Counted in the process that calls the
#: engine, so it sees an in-process engine's threads only.
CONTENTION_FACTOR = 4.0
#: The engine's threads spent at least this share of their runnable time waiting for a CPU
#: (the kernel's run queue, /proc/PID/task/*/schedstat) during the runs, and this much more
#: than during the baseline's: other processes held the cores the engine needed.
CPU_WAIT_SHARE = 0.05
#: Other processes used at least this share of the machine's CPU time (all CPUs) during the
#: runs, and this much more than during the baseline's: the engine's threads shared the caches,
#: the memory bus and (on SMT machines) the cores' pipelines with them, which no run queue shows.
OTHERS_CPU_SHARE = 0.25


def _machine_figure(rec: Measurement, key: str, upper: float = math.inf) -> float | None:
    value = getattr(rec.machine, key) if rec.machine is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value <= upper else None


def steal_share(rec: Measurement) -> float | None:
    return _machine_figure(rec, "steal_share", 1.0)


def machine_signals(baseline: Measurement, candidate: Measurement) -> list[str]:
    """Each sign that the machine, not the subject, was busier during the candidate's runs than
    during the baseline's, as a phrase naming its figure on both sides (none: the machine was
    no busier by anything it reports)."""
    others = _others_present(baseline, candidate)
    preempted = _preempted(baseline, candidate) if others else None
    signs = [preempted] if preempted is not None else []
    for key, rise, phrase, prefix in SHARE_SIGNS:
        base, now = (_machine_figure(r, key, 1.0) or 0.0 for r in (baseline, candidate))
        if now - base >= rise and (others or key != "cpu_wait_share"):
            signs.append(f"{phrase.format(now)} ({prefix}{base:.0%} at baseline)")
    return signs


def _others_present(baseline: Measurement, candidate: Measurement) -> bool:
    """Other processes used the CPUs during the candidate's runs (``OTHERS_PRESENT``), or their
    share is unknown: the engine's threads waiting or preempted may then be the machine's."""
    now = _machine_figure(candidate, "others_cpu_share", 1.0)
    return now is None or now - (_machine_figure(baseline, "others_cpu_share", 1.0) or 0.0) >= OTHERS_PRESENT


def self_contention(baseline: Measurement, candidate: Measurement) -> str | None:
    """The line that says the engine's threads waited for each other (the run queue rose as for
    a busy machine, but no other process used the CPUs), else None."""
    base, now = (_machine_figure(r, "cpu_wait_share", 1.0) or 0.0 for r in (baseline, candidate))
    if now - base < CPU_WAIT_SHARE or _others_present(baseline, candidate):
        return None
    return (
        f"the engine's threads waited for a CPU {now:.0%} of their runnable time ({base:.0%} at baseline) while "
        "no other process used the CPUs: its own threads outnumber the cores (llama.cpp's threads setting, "
        "and a measured callable's own threads): the subject's, not a busy machine"
    )


def _preempted(baseline: Measurement, candidate: Measurement) -> str | None:
    base_sw, cand_sw = (_machine_figure(r, "involuntary_switches_per_run") for r in (baseline, candidate))
    if cand_sw is None or base_sw is None or cand_sw < CONTENTION_FACTOR * max(base_sw, 1.0):
        return None
    return (
        f"other processes preempted the engine's threads {cand_sw / max(base_sw, 1.0):.0f}x as often as at "
        f"baseline ({cand_sw:.0f} involuntary context switches per run)"
    )


#: The machine's shares (0..1, ``machine``) whose rise from the baseline's (none there: 0) to
#: the candidate's by at least its threshold is a sign: (key, threshold, the phrase, the
#: baseline's figure's prefix).
SHARE_SIGNS = (
    (
        "cpu_wait_share",
        CPU_WAIT_SHARE,
        "the engine's threads waited for a CPU {:.0%} of their runnable time",
        "run queue; ",
    ),
    ("others_cpu_share", OTHERS_CPU_SHARE, "other processes used {:.0%} of the machine's CPU time during the runs", ""),
    (
        "steal_share",
        STEAL_MACHINE_SHARE,
        "the hypervisor gave {:.0%} of this VM's CPU time to other guests during the runs",
        "steal; ",
    ),
)


def machine_blame(baseline: Measurement, candidate: Measurement) -> str | None:
    """Why a slowdown is the machine's, not the subject's (None: nothing says so): the signals of
    ``machine_signals``. The reference probe is recorded beside them but decides nothing: on
    this project's VM its drift did not follow llama.cpp's (correlation about 0 over 20 A/A
    sessions, benchmarks/regression_real.py), and when another process held a core its
    sleeping BLAS threads read 10-15x slower while llama.cpp's spinning threads lost 10-20%."""
    signals = machine_signals(baseline, candidate)
    if not signals:
        return None
    return f"busy machine: {'; '.join(signals)}: not blamed on the subject; re-run on an idle machine"


def blame_machine(comparisons: list[Comparison], why: str | None, kept: Mapping[str, str] = {}) -> list[Comparison]:
    """A slowdown the machine explains (``machine_blame``) says nothing about the subject:
    REGRESSION becomes MACHINE_SLOWER, but in the phases of ``kept`` (``beyond_machine``)."""
    if why is None:
        return comparisons
    return [
        dataclasses.replace(c, verdict=Verdict.MACHINE_SLOWER, reason=why)
        if c.verdict is Verdict.REGRESSION and c.phase not in kept
        else c
        for c in comparisons
    ]


def beyond_machine(comparisons: Sequence[Comparison], parts: Sequence[PartChange]) -> dict[str, str]:
    """Each phase whose REGRESSION a busy machine does not explain, with the line that says why:
    a part of it outside llama.cpp's evaluation rose beyond what the machine's slowing of that
    evaluation explains (``parts.beyond_the_machine``), by the headline's threshold of its time."""
    regressed = {c.phase for c in comparisons if c.verdict is Verdict.REGRESSION}
    return {
        c.phase: f"{c.phase} {c.label} REGRESSION on a busy machine: {why}"
        for c in comparisons
        if is_headline(c)
        and c.phase in regressed
        and (why := beyond_the_machine(parts, c.phase, c.baseline_value, c.threshold)) is not None
    }


def judge(
    entries: Mapping[str, Measurement] | None,
    hardware_key: str,
    candidate: Measurement,
    settings: CompareSettings,
    window: Callable[[Measurement], Mapping[str, Sequence[Level]]] | None = None,
) -> BaselineVerdict:
    """Find this hardware's entry among a test's baselines and compare, or say why not.
    ``window(entry)``: the history's sessions of this test since ``entry`` was recorded, per
    judged metric (``compare_records``). Never raises: stored data that cannot be judged is
    left out with a line saying so, or (as a last resort) the verdict is an "error" naming it.
    Decided: its cell and failure lines written (``BaselineVerdict.decided``)."""
    try:
        verdict = _judge(entries, hardware_key, candidate, settings, window)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
        verdict = BaselineVerdict(
            BaselineStatus.ERROR,
            f"cannot judge against the stored baseline: {type(exc).__name__}: {exc}; "
            "re-record it with --llmperf-update-baselines",
        )
    return verdict.decided()


def _judge(
    entries: Mapping[str, Measurement] | None,
    hardware_key: str,
    candidate: Measurement,
    settings: CompareSettings,
    window: Callable[[Measurement], Mapping[str, Sequence[Level]]] | None,
) -> BaselineVerdict:
    if not entries:
        return BaselineVerdict(BaselineStatus.NO_BASELINE, "no baseline: run with --llmperf-update-baselines")
    baseline = entries.get(hardware_key)
    if baseline is None:
        recorded = {k: e.hardware for k, e in entries.items()}
        closest = closest_hardware(recorded, candidate.hardware) if candidate.hardware else None
        return BaselineVerdict(
            BaselineStatus.OTHER_HARDWARE,
            other_hardware_note(recorded, hardware_key, candidate.hardware),
            changes=tuple(closest[1]) if closest else (),
        )
    changed = workload_changes(baseline.identity or {}, candidate.identity or {})
    if changed:
        return BaselineVerdict(
            BaselineStatus.WORKLOAD_CHANGED,
            f"not comparable: the workload changed since the baseline ({', '.join(changed)}); "
            "re-record with --llmperf-update-baselines",
        )
    changes = tuple(subject_changes(baseline.subject, candidate.subject))
    changes += prompt_changes(*(r.prompt.prompt_tokens if r.prompt else None for r in (baseline, candidate)))
    machine = reference.slowdown(baseline.reference, candidate.reference)
    steal = steal_share(baseline)
    notes = []
    if steal is not None and steal >= STEAL_MACHINE_SHARE:
        notes.append(
            f"the baseline was recorded while the hypervisor took {steal:.0%} of the CPU time (steal): "
            "it may be too slow to catch a regression; re-record it with --llmperf-update-baselines"
        )
    attribution, unreadable = _attribution(baseline, candidate, settings)
    notes += [unreadable] if unreadable else []
    notes += [line] if (line := self_contention(baseline, candidate)) else []
    why = machine_blame(baseline, candidate)
    judged, left_out = judged_records(baseline, candidate, settings, window(baseline) if window else None)
    parts = _parts(baseline, candidate, judged, settings)  # the phases that moved are the same after the blame
    kept = beyond_machine(judged, parts) if why else {}
    comparisons = tuple(blame_machine(judged, why, kept))
    return BaselineVerdict(
        BaselineStatus.COMPARED,
        note="; ".join([*kept.values(), *notes, *left_out]),
        machine=why or "",
        comparisons=comparisons,
        changes=changes,
        layer_changes=_layers(baseline, candidate, settings),
        attribution=attribution,
        machine_ratio=machine,
        memory_changes=compare_memory(baseline, candidate),
        parts=parts,
    )


def _parts(
    baseline: Measurement, candidate: Measurement, comparisons: Sequence[Comparison], settings: CompareSettings
) -> tuple[PartChange, ...]:
    """The parts of each phase against the baseline's runs (``parts.unpaired_parts``; where both
    records keep their requests, on the runs that sent the same request: ``request_pairs``), with
    the between-session sd each phase's headline comparison used, tested only in the phases whose
    verdict moved (``parts.gated``); none when either record lacks them."""
    headline = {c.phase: c for c in comparisons if is_headline(c)}
    phase_ms = {c.metric: c.baseline_value for c in headline.values()}
    between = {phase: c.between_sd for phase, c in headline.items()}
    try:
        parts = unpaired_parts(
            baseline.part_columns,
            candidate.part_columns,
            phase_ms,
            alpha=settings.alpha,
            between_sd=between,
            sampler=next((s for r in (candidate, baseline) if r.prompt and (s := r.prompt.sampler)), ""),
            pairs=request_pairs(baseline, candidate),  # a prompt set's: each part on the same requests
        )
        return gated(parts, explained_phases(comparisons))
    except (ArithmeticError, TypeError, ValueError):
        return ()


def _layers(baseline: Measurement, candidate: Measurement, settings: CompareSettings) -> tuple[LayerChange, ...]:
    """The per-layer diagnosis (``compare_layers``); none when either record's layer data is not
    numbers that diagnose anything (a diagnosis, not a gate)."""
    try:
        return compare_layers(baseline, candidate, alpha=settings.alpha, threshold=settings.threshold)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, IndexError):
        return ()


def _attribution(
    baseline: Measurement, candidate: Measurement, settings: CompareSettings
) -> tuple[AttributionChange | None, str | None]:
    """The attribution diagnosis (``judge.attribution.compare_records``), None when either
    record keeps none (a diagnosis, not a gate); and the line that says the baseline's pass
    cannot be read, else None."""
    try:
        got = attributions.compare_records(baseline, candidate, threshold=settings.threshold)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        return None, f"the attribution passes could not be compared ({type(exc).__name__}: {exc})"
    return (None, got) if isinstance(got, str) else (got, None)


def _with_comparisons(
    r: Outcome, comparisons: Sequence[Comparison], *, failures: tuple[str, ...] | None = None, short: str | None = None
) -> Outcome:
    v = r.verdict
    assert v is not None
    return dataclasses.replace(
        r,
        verdict=dataclasses.replace(
            v,
            comparisons=tuple(comparisons),
            failures=v.failures if failures is None else failures,
            short=v.short if short is None else short,
        ),
    )


def session_holm(results: Sequence[Outcome]) -> list[Outcome]:
    """The results with Holm over every judged comparison of the finished session, so the
    "p (Holm)" reported equals Holm over all the session's p-values. Verdicts stay as decided
    during the session: each was decided against an upper bound of this adjustment (unseen
    comparisons counted as p = 1). A mirror (a rate of the same runs) takes its metric's."""
    adjusted = _session_adjusted(results)
    if not adjusted:
        return list(results)
    out = []
    for i, r in enumerate(results):
        if r.verdict is None or not r.verdict.comparisons:
            out.append(r)
            continue
        comps = [
            dataclasses.replace(c, p_adjusted=adjusted[i, j][0], p_adjusted_better=adjusted[i, j][1])
            if (i, j) in adjusted
            else c
            for j, c in enumerate(r.verdict.comparisons)
        ]
        out.append(_with_comparisons(r, _mirrors_adjusted(comps)))
    return out


def _session_adjusted(results: Sequence[Outcome]) -> dict[tuple[int, int], tuple[float, float]]:
    """Holm over every judged comparison of the session (mirrors do not count): (worse, better)
    adjusted p-values by (result, comparison) index."""
    judged = [
        (i, j, c)
        for i, r in enumerate(results)
        if r.verdict is not None
        for j, c in enumerate(r.verdict.comparisons)
        if c.mirror_of is None and c.p_value is not None
    ]
    if not judged:
        return {}
    worse = holm([c.p_value for _, _, c in judged if c.p_value is not None])
    better = holm([c.p_value_better if c.p_value_better is not None else 1.0 for _, _, c in judged])
    return {(i, j): (pw, pb) for (i, j, _), pw, pb in zip(judged, worse, better)}


def _mirrors_adjusted(comps: Sequence[Comparison]) -> list[Comparison]:
    """A mirror (a rate of the same runs) takes its metric's adjusted p-values."""
    by_metric = {c.metric: c for c in comps if c.mirror_of is None}
    return [
        dataclasses.replace(
            c, p_adjusted=by_metric[c.mirror_of].p_adjusted, p_adjusted_better=by_metric[c.mirror_of].p_adjusted_better
        )
        if c.mirror_of in by_metric
        else c
        for c in comps
    ]


def suite_check(results: Sequence[Outcome], settings: CompareSettings) -> tuple[list[Outcome], list[str]]:
    """The session-end suite-relative check (``rule.suite_relative``): the results with
    their new verdicts, and the failure line of each new REGRESSION."""
    results = list(results)
    if not settings.suite_check:
        return results, []
    compared = [
        i for i, r in enumerate(results) if r.verdict is not None and r.verdict.status is BaselineStatus.COMPARED
    ]
    before = [list(v.comparisons) for v in (results[i].verdict for i in compared) if v is not None]
    after = suite_relative(before, alpha=settings.alpha_suite)
    lines = []
    for i, old, new in zip(compared, before, after):
        if old == new:
            continue
        r = results[i]
        results[i], fresh = _suite_verdicts(r, old, new)
        lines += [f"{r.test or '?'}: {line}" for line in fresh]
    return results, lines


def _suite_verdicts(r: Outcome, old: Sequence[Comparison], new: Sequence[Comparison]) -> tuple[Outcome, list[str]]:
    """``r`` with the comparisons the suite-relative check changed (``old`` -> ``new``), and the
    failure line of each new REGRESSION."""
    v = r.verdict
    assert v is not None
    kept = beyond_machine(new, v.parts) if v.machine else {}
    new = blame_machine(list(new), v.machine or None, kept)  # a busy machine during this test's runs
    suffix = f"; {', '.join(v.changes)}" if v.changes else ""
    fresh = [
        c.line() + suffix
        for o, c in zip(old, new)
        if c.verdict is Verdict.REGRESSION and o.verdict is not Verdict.REGRESSION and c.mirror_of is None
    ]
    phases = {c.phase for c in new if c.verdict is Verdict.REGRESSION}
    short = regression_cell(phases) if phases else Verdict.MACHINE_SLOWER.value
    return _with_comparisons(r, new, failures=v.failures + tuple(fresh), short=short), fresh
