"""When ``--llmperf-against``'s pairs stop, on synthetic pairs (issue 37.3; docs/against.md, "When
the pairs stop"): the pairs each rule takes and what it decides, for an unchanged subject, +4%
and +8% in decode, at a given spread of the per-pair log ratios. No llama.cpp: the same
``judge.paired.look`` as a session, on pairs drawn here, so a rule can be measured over
hundreds of sessions in seconds (``benchmarks/against_sessions.py`` measures real ones).

Rules:
- ``before``: the rule until issue 37.3: a look every ``runs`` pairs (3 looks up to 60), more
  pairs while a comparison is INCONCLUSIVE and more pairs could decide it, or UNCHANGED with a
  95% CI that holds 1 and reaches past half the threshold;
- ``after``: ``session.against.looks_for`` (a look every 10 pairs, 6 looks) and
  ``judge.paired.look`` (``pairs_settled`` with the look's 95% CIs for the equivalence stop);
- ``early`` (a candidate, not the plugin's): ``after``, and also stop at a REGRESSION whose CI
  lies beyond half the threshold (``after`` waits until the whole CI lies beyond the threshold).
  It never stops later than ``after``, so it can be replayed on sessions recorded without
  ``--all-pairs`` (the pairs ``after`` took are all it can ask for).

Pairs: per pair a shared machine factor (moves both sides alike) and per run a normal noise
(sd ``spread`` / sqrt 2 on the log scale), one run in 10 hit by a burst (exponential, mean 2 x
spread); decode TPOT and the ITL p95 (1.5x the noise) carry the change, TTFT none.

    .venv/bin/python benchmarks/against_stopping.py --spread 0.03 0.06 0.10 --sessions 200

``--replay FILE...`` replays the rules on real pairs instead: the sessions
``benchmarks/against_sessions.py --record-pairs FILE --all-pairs`` recorded (every pair to the
cap, each run's per-token latencies), each with every per-run decode statistic (``DECODE``):
per case the spread of the pairs' log ratios of each statistic, TTFT and ITL p95, where the
spread comes from (``_run_level``), and per rule and statistic the pairs taken, the seconds they
took (the session's seconds per pair times the pairs), what was decided, and which comparison
kept the pairs going at the looks that did not stop. ``--load-bands`` splits each case by the
session's 1-min load.

    .venv/bin/python benchmarks/against_stopping.py --replay /tmp/pairs.jsonl
    .venv/bin/python benchmarks/against_stopping.py --replay /tmp/pairs.jsonl --rules after early --statistics mean
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import sys
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np

from pytest_llmperf.judge.paired import look, needs_more_pairs
from pytest_llmperf.judge.verdict import Verdict, log_level
from pytest_llmperf.session.against import looks_for


def _run(rng: np.random.Generator, machine: float, shift: float, spread: float) -> SimpleNamespace:
    e = rng.normal(0.0, spread / math.sqrt(2), 3)
    if rng.random() < 0.1:
        e = e + rng.exponential(2 * spread, 3)
    ttft = 5.0 * math.exp(machine + e[0])
    tpot = math.exp(machine + shift + e[1])
    return SimpleNamespace(
        ttft_ms=ttft,
        prefill_tps=32_000 / ttft,
        tpot_ms=tpot,
        decode_tps=1000 / tpot,
        itl_p95_ms=1.3 * math.exp(machine + shift + 1.5 * e[2]),
    )


def pairs(rng: np.random.Generator, n: int, change: float, spread: float) -> tuple[list, list]:
    a, b = [], []
    for _ in range(n):
        machine = rng.normal(0.0, 0.05)  # the machine during this pair: both runs alike
        a.append(_run(rng, machine, 0.0, spread))
        b.append(_run(rng, machine, math.log1p(change), spread))
    return a, b


def _before_open(c) -> bool:
    if c.worth_more_runs:
        return True
    if c.verdict is not Verdict.UNCHANGED or c.ci_low > 1 or c.ci_high < 1:
        return False
    margin = 1 + 0.5 * c.threshold
    return c.ci_high > margin or c.ci_low < 1 / margin


def session(rng: np.random.Generator, rule: str, change: float, spread: float, runs: int = 20) -> tuple[int, dict]:
    cap = looks_for(runs, None)[0] if rule != "before" else SEQUENTIAL * runs
    a, b = pairs(rng, cap, change, spread)
    n, judged, *_ = stopped(rule, a, b, runs)
    return n, judged


def stopped(
    rule: str, a: list, b: list, runs: int = 20, threshold: float = 0.05, groups: Sequence[int] = ()
) -> tuple[int, dict, list[str], str]:
    """Where ``rule`` stops on the pairs (a, b) at ``threshold`` (the ITL p95's stays 10%): the
    pairs taken, the judged comparisons there, per look that did not stop the metrics that
    kept it going, and why it stopped. ``benchmarks/ab_token_sessions.py`` replays ``after`` on an A/B's pairs, with
    ``groups`` (each pair's engine instance pair): a look over two or more of them is judged with
    the two-level model, as ``--llmperf-against``'s over its process pairs."""
    if rule == "before":
        cap, looks, step = SEQUENTIAL * runs, SEQUENTIAL, runs
    else:
        cap, looks, step = looks_for(runs, None)
    cap = min(cap, len(a))
    n = 0
    open_by: list[str] = []
    while True:
        n = min(n + step, cap)
        judging = {"alpha": 0.01, "threshold": threshold, "tail_threshold": 0.10, "family": 3}
        seen = look(a[:n], b[:n], cap=cap, looks=looks, groups=groups[:n], **judging)
        judged = [c for c in seen.comparisons if c.mirror_of is None]
        if rule == "before":
            stop = not any(_before_open(c) for c in judged)
        else:
            stop = (seen.why is not None and n < cap) or (rule == "early" and _early_regression(judged))
        if stop or n >= cap:
            return (
                n,
                {c.metric: c for c in judged},
                open_by,
                seen.why or ("settled" if stop else f"the cap of {cap} pairs"),
            )
        test = _before_open if rule == "before" else needs_more_pairs
        open_by += [c.metric for c in judged if test(c)]


SEQUENTIAL = 3
RULES = ("before", "after", "early")


def _early_regression(judged: list) -> bool:
    """The ``early`` rule's extra stop: a REGRESSION whose CI lies beyond half the threshold."""
    for c in judged:
        if c.verdict is Verdict.REGRESSION and c.ci_low is not None and c.ci_high is not None:
            worse_low = 1.0 / c.ci_high if c.higher_is_better else c.ci_low
            if worse_low > 1.0 + c.threshold / 2:
                return True
    return False


def _trimmed(share: float):
    """The mean of a run's ITLs without the ``share`` lowest and the ``share`` highest."""

    def mean(itl: np.ndarray) -> float:
        s = np.sort(itl)
        k = int(share * s.size)
        return float(s[k : s.size - k].mean())

    return mean


#: A run's decode figure from its inter-token latencies (``RunMetrics.itl_ms``): the mean is the
#: run's TPOT (a preemption inside the run moves it by its whole length over the tokens).
DECODE = {
    "mean": lambda itl: float(itl.mean()),
    "median": lambda itl: float(np.median(itl)),
    "trim10": _trimmed(0.10),
    "trim25": _trimmed(0.25),
}


def replay_runs(runs: list[dict], statistic: str) -> list[SimpleNamespace]:
    """Recorded runs (``RunMetrics`` fields) with ``statistic`` as their TPOT."""
    out = []
    for r in runs:
        tpot = DECODE[statistic](np.asarray(r["itl_ms"], dtype=float))
        out.append(
            SimpleNamespace(
                ttft_ms=r["ttft_ms"],
                prefill_tps=r["prefill_tps"],
                tpot_ms=tpot,
                decode_tps=1000.0 / tpot,
                itl_p95_ms=r["itl_p95_ms"],
            )
        )
    return out


def _spread(a: list[float], b: list[float]) -> tuple[float, float]:
    """The pairs' log ratios: robust sd (``verdict.log_level``), plain sd."""
    d = np.log(np.asarray(b)) - np.log(np.asarray(a))
    return log_level(d).spread, float(d.std(ddof=1))


def _spreads(pairs: list[tuple[float, float]]) -> str:
    """Over sessions: the median (range) of the robust sd, and the median plain sd."""
    robust = [p[0] for p in pairs]
    plain = statistics.median(p[1] for p in pairs)
    return f"robust sd {statistics.median(robust):.3f} ({min(robust):.3f}-{max(robust):.3f}), sd {plain:.3f}"


def _case(s: dict, bands: bool) -> tuple:
    """A recorded session's case: preset, tokens, case, change (and, with ``bands``, its load band)."""
    change = s["change"] if s["case"] == "change" else 0.0
    load = float(s["load"].split()[0])
    band = ("load < 2" if load < 2 else "load 2-6" if load < 6 else "load >= 6") if bands else ""
    return s["preset"], tuple(s["tokens"]), s["case"], change, band


def replay(
    paths: list[str], bands: bool = False, rules: tuple[str, ...] = ("before", "after"), stats: tuple[str, ...] = ()
) -> None:
    """Per case of the recorded sessions: the pairs' spreads, then each rule and statistic."""
    import json
    from pathlib import Path

    sessions = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    for key in sorted({_case(s, bands) for s in sessions}):
        mine = [s for s in sessions if _case(s, bands) == key]
        loads = [float(s["load"].split()[0]) for s in mine]
        print(
            f"{key[0]} pp{key[1][0]} tg{key[1][1]} {key[2]} {key[3]:+.0%} {key[4]}: {len(mine)} sessions, "
            f"1-min load {min(loads):.1f}-{max(loads):.1f}"
        )
        for metric in ("ttft_ms", "itl_p95_ms"):
            spreads = [_spread([r[metric] for r in s["a"]], [r[metric] for r in s["b"]]) for s in mine]
            print(f"  pairs' spread {metric}: {_spreads(spreads)}")
        print(f"  pairs' spread decode per token position: {_spreads([_by_position(s) for s in mine])}")
        print(f"  {_run_level(mine)}")
        for stat in stats or tuple(DECODE):
            _replay_statistic(mine, stat, rules)


def _run_level(mine: list[dict]) -> str:
    """Where the spread comes from: how much a run's typical token (its median ITL) moves from
    run to run, how much of that A's and B's runs of a pair share, and how alike the tokens of
    one run are (the correlation of a token's ITL with the next one's and the 8th next, each
    position's mean over the session's runs taken out). Medians over the sessions."""
    sd, shared, lag1, lag8 = [], [], [], []
    for s in mine:
        a, b = (np.log(np.asarray([r["itl_ms"] for r in s[k]], dtype=float)) for k in ("a", "b"))
        ma, mb = np.median(a, axis=1), np.median(b, axis=1)
        sd.append(float(ma.std(ddof=1)))
        shared.append(float(np.corrcoef(ma, mb)[0, 1]))
        x = np.vstack([a, b])[:, 2:]  # past the first tokens' warm-up
        x = x - x.mean(axis=0)
        lag1.append(float(np.corrcoef(x[:, 1:].ravel(), x[:, :-1].ravel())[0, 1]))
        if x.shape[1] > 8:
            lag8.append(float(np.corrcoef(x[:, 8:].ravel(), x[:, :-8].ravel())[0, 1]))
    med = statistics.median
    return (
        f"run-level speed: sd of a run's log median ITL {med(sd):.3f}, A-B correlation in a pair "
        f"{med(shared):.2f}; within a run, ITL correlation with the next token {med(lag1):.2f}, "
        f"the 8th next {med(lag8) if lag8 else float('nan'):.2f}"
    )


def _by_position(s: dict) -> tuple[float, float]:
    """Pairs judged per token position: per pair the median over positions j of log(B's ITL j /
    A's ITL j); their robust and plain sd."""
    d = [float(np.median(np.log(np.asarray(y["itl_ms"]) / np.asarray(x["itl_ms"])))) for x, y in zip(s["a"], s["b"])]
    return log_level(d).spread, float(np.std(d, ddof=1))


def _replay_statistic(mine: list[dict], stat: str, rules: tuple[str, ...] = ("before", "after")) -> None:
    runs = [(replay_runs(s["a"], stat), replay_runs(s["b"], stat)) for s in mine]
    spreads = [_spread([r.tpot_ms for r in a], [r.tpot_ms for r in b]) for a, b in runs]
    ratio = statistics.median(
        math.exp(statistics.median(math.log(y.tpot_ms / x.tpot_ms) for x, y in zip(a, b))) for a, b in runs
    )
    print(f"  pairs' spread decode {stat} (median pair ratio {ratio:.3f}): {_spreads(spreads)}")
    per_pair = [s["pairs_s"][0] / len(s["a"]) if s.get("pairs_s") else float("nan") for s in mine]
    for rule in rules:
        got = [stopped(rule, a, b) for a, b in runs]
        n = [g[0] for g in got]
        secs = [k * t for k, t in zip(n, per_pair)]
        reg = sum(g[1]["tpot_ms"].verdict is Verdict.REGRESSION for g in got)
        other = sum(any(c.verdict is Verdict.REGRESSION for m, c in g[1].items() if m != "tpot_ms") for g in got)
        found = sum(g[1]["tpot_ms"].ci_low > 1 for g in got)
        held = collections.Counter(m for g in got for m in g[2])
        print(
            f"    {rule:6} {stat:6}: pairs {statistics.median(n):g} ({min(n)}-{max(n)}), "
            f"{statistics.median(secs):.1f} s ({min(secs):.1f}-{max(secs):.1f}); decode REGRESSION "
            f"{reg}/{len(got)}, other REGRESSION {other}; decode CI above 1 {found}/{len(got)}; "
            f"kept open by {dict(held)}",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spread", type=float, nargs="+", default=[0.03, 0.06, 0.10])
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--replay", nargs="+", help="replay on recorded real pairs (against_sessions.py --record-pairs)")
    p.add_argument("--load-bands", action="store_true", help="with --replay: each case by 1-min load (<2, 2-6, >=6)")
    p.add_argument("--rules", nargs="+", choices=RULES, default=["before", "after"])
    p.add_argument("--statistics", nargs="+", choices=tuple(DECODE), help="with --replay: these decode figures only")
    args = p.parse_args()
    rules = tuple(args.rules)
    if args.replay:
        replay(args.replay, args.load_bands, rules, tuple(args.statistics or ()))
        return 0
    print("rule, spread, change: median pairs (range); any REGRESSION; decode CI above 1")
    for spread in args.spread:
        for change in (0.0, 0.04, 0.08):
            for rule in rules:
                rng = np.random.default_rng(args.seed)  # the same pairs for every rule
                got = [session(rng, rule, change, spread) for _ in range(args.sessions)]
                n = [g[0] for g in got]
                reg = sum(any(c.verdict is Verdict.REGRESSION for c in g[1].values()) for g in got)
                found = sum(g[1]["tpot_ms"].ci_low > 1 for g in got)
                print(
                    f"{rule:6} spread {spread:.0%} change {change:+.0%}: pairs {statistics.median(n):g} "
                    f"({min(n)}-{max(n)}); REGRESSION {reg}/{len(got)}; CI above 1 {found}/{len(got)}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
