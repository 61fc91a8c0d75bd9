"""When ``--llmperf-against``'s pairs stop, on synthetic pairs (issue 37.3; docs/against.md, "When
the pairs stop"): the pairs each rule takes and what it decides, for an unchanged subject, +4%
and +8% in decode, at a given spread of the per-pair log ratios. No llama.cpp: the same
``judge.paired.judged_pairs`` as a session, on pairs drawn here, so a rule can be measured over
hundreds of sessions in seconds (``benchmarks/against_sessions.py`` measures real ones).

Rules:
- ``before``: the rule until issue 37.3: a look every ``runs`` pairs (3 looks up to 60), more
  pairs while a comparison is INCONCLUSIVE and more pairs could decide it, or UNCHANGED with a
  95% CI that holds 1 and reaches past half the threshold;
- ``after``: ``session.against.looks_for`` (a look every 10 pairs, 6 looks) and
  ``judge.paired.pairs_settled``.

Pairs: per pair a shared machine factor (moves both sides alike) and per run a normal noise
(sd ``spread`` / sqrt 2 on the log scale), one run in 10 hit by a burst (exponential, mean 2 x
spread); decode TPOT and the ITL p95 (1.5x the noise) carry the change, TTFT none.

    .venv/bin/python benchmarks/against_stopping.py --spread 0.03 0.06 0.10 --sessions 200
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from types import SimpleNamespace

import numpy as np

from pytest_llmperf.judge.paired import judged_pairs, pairs_settled
from pytest_llmperf.judge.verdict import Verdict
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
    if rule == "before":
        cap, looks, step = SEQUENTIAL * runs, SEQUENTIAL, runs
    else:
        cap, looks, step = looks_for(runs, None)
    a, b = pairs(rng, cap, change, spread)
    n = 0
    while True:
        n = min(n + step, cap)
        comps = judged_pairs(a[:n], b[:n], alpha=0.01, threshold=0.05, tail_threshold=0.10, family=3, looks=looks)
        judged = [c for c in comps if c.mirror_of is None]
        stop = not any(_before_open(c) for c in judged) if rule == "before" else pairs_settled(comps) is not None
        if stop or n >= cap:
            return n, {c.metric: c for c in judged}


SEQUENTIAL = 3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spread", type=float, nargs="+", default=[0.03, 0.06, 0.10])
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print("rule, spread, change: median pairs (range); any REGRESSION; decode CI above 1")
    for spread in args.spread:
        for change in (0.0, 0.04, 0.08):
            for rule in ("before", "after"):
                rng = np.random.default_rng(args.seed)  # the same pairs for both rules
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
