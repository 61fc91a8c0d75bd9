"""Calibrate the verdict rule by simulation, through the plugin's own code path.

    .venv/bin/python benchmarks/calibration.py [--sessions 400] [--tests 20] [--seed 0]

Every simulated measurement becomes a record like the plugin's (per-run TTFT, TPOT, ITL p95
and the TPS mirrors); baselines are built by ``regression.carry_history`` exactly as
``--llmperf-update-baselines`` builds them, each candidate test is judged by
``regression.judge`` with Holm's family of the whole session (20 tests x 3 judged metrics) as
it ends, and the session by ``rule.suite_relative`` at its end, as the plugin does.

Drift model (docs/verdicts.md), on the log scale, for session s, test t, run i of n:
  shared session offset  S_s   ~ N(0, 1.5%)   (the machine's speed that session, all tests)
  per-test offset        T_st  ~ N(0, 0.5%)
  ramp within a measurement: r_st * min(i / 19, 1), r_st ~ U(-2%, +2%) (reached by run 20)
  run noise              e_i   ~ lognormal with the given CV (ITL p95: 1.5x that CV)
  outlier variant: each run, with probability 5%, x U(1.2, 2.0)
A baseline holds K recorded sessions (K = 10: the window full; K = 1: recorded once).
``--window W``: the baseline file is recorded once and the history holds W sessions of each
test since (the recording one first), drawn from the same drift model; each test is judged
against that window (``regression.judge``'s ``window``, as the plugin reads it from the
history: its sessions are the reference and their spread the between-session noise).

Scenarios per CV (2, 5, 8%), fixed 20 runs and adaptive (20 -> 40 -> 60 runs, stop when the
test's judged verdicts are all decided; alpha split over the 3 looks):
  A/A           no change: share of sessions with any REGRESSION; share of INCONCLUSIVE
                verdicts
  +10% decode   one test's TPOT x1.10: share flagged REGRESSION (decode)
  30% x1.5      one test: 30% of its runs 1.5x slower (decode): share that passes silently
                (UNCHANGED or IMPROVED) - must be 0
  others REG    sessions where the +10% test is slowed and any of the 19 others is REGRESSION
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.regression import CompareSettings, carry_history, judge
from pytest_llmperf.judge.rule import JUDGED, suite_relative
from pytest_llmperf.judge.verdict import Verdict, level, lognormal_sigma

SHARED_SD, TEST_SD, RAMP = 0.015, 0.005, 0.02
OUTLIER_P, OUTLIER_LO, OUTLIER_HI = 0.05, 1.2, 2.0
BASE_MS = {"ttft_ms": 150.0, "tpot_ms": 10.0, "itl_p95_ms": 12.0}
TAIL_NOISE = 1.5
PROMPT_TOKENS = 128
LOOK_RUNS = (20, 40, 60)
TARGETS = (
    "A/A any REGRESSION <= 1%; +10% flagged >= 95% at CV <= 5%; outliers CV 2%: +10% >= 95%, "
    "A/A inconclusive <= 5%; 30% x1.5 never silent"
)
WORKLOAD = {"prompt": None, "prompt_tokens": PROMPT_TOKENS, "max_tokens": 48, "seed": 0, "concurrency": 1, "rate": None}
SUBJECT = {"backend_version": "sim"}


class Machine:
    """Draws sessions and measurements of the drift model."""

    def __init__(self, rng: np.random.Generator, cv: float, outliers: bool) -> None:
        self.rng, self.sigma, self.outliers = rng, lognormal_sigma(cv), outliers

    def session(self, tests: int) -> np.ndarray:
        """Per-test log offset of one session (shared + per-test)."""
        return self.rng.normal(0, SHARED_SD) + self.rng.normal(0, TEST_SD, tests)

    def runs(
        self, offset: float, n: int, start: int = 0, ramp: float | None = None, slow: float = 1.0, mixture: float = 0.0
    ) -> dict[str, np.ndarray]:
        """Per-run values of each metric; ``start``/``ramp`` continue a measurement."""
        r = self.rng.uniform(-RAMP, RAMP) if ramp is None else ramp
        # The ramp reaches +-2% over the first 20 runs and stays (a machine settling).
        pos = np.minimum(np.arange(start, start + n) / (LOOK_RUNS[0] - 1), 1.0) * r
        out = {}
        for name, base in BASE_MS.items():
            sigma = self.sigma * (TAIL_NOISE if name == "itl_p95_ms" else 1.0)
            x = base * np.exp(offset + pos + self.rng.normal(0, sigma, n))
            if self.outliers:
                hit = self.rng.random(n) < OUTLIER_P
                x = np.where(hit, x * self.rng.uniform(OUTLIER_LO, OUTLIER_HI, n), x)
            if name != "ttft_ms":
                x = x * slow
                if mixture:
                    x = np.where(self.rng.random(n) < mixture, x * 1.5, x)
            out[name] = x
        out["_ramp"] = r
        return out


def as_record(values: dict[str, np.ndarray]) -> Measurement:
    runs = {k: [float(v) for v in values[k]] for k in BASE_MS}
    runs["prefill_tps"] = [PROMPT_TOKENS * 1000.0 / v for v in runs["ttft_ms"]]
    runs["decode_tps"] = [1000.0 / v for v in runs["tpot_ms"]]
    return Measurement.read({"workload": WORKLOAD, "subject": SUBJECT, "hardware": {}, "runs": runs})


def concat(a: dict, b: dict) -> dict:
    return {k: (np.concatenate([a[k], b[k]]) if k != "_ramp" else a[k]) for k in a}


def baseline(machine: Machine, tests: int, k: int) -> list[Measurement]:
    """K recorded sessions folded into one stored entry per test, as the plugin stores them."""
    stored: list[Measurement | None] = [None] * tests
    for _ in range(k):
        offsets = machine.session(tests)
        for t in range(tests):
            stored[t] = carry_history(stored[t], as_record(machine.runs(offsets[t], LOOK_RUNS[0])))
    return stored  # type: ignore[return-value]


def history_window(machine: Machine, tests: int, sessions: int) -> tuple[list[Measurement], list[dict]]:
    """A baseline recorded once and, per test, the levels of ``sessions`` sessions of the
    history since (the recording session first), as ``history.series.Windows.levels`` gives."""
    stored: list[Measurement] = [None] * tests  # type: ignore[list-item]
    windows: list[dict] = [{spec.name: [] for spec in JUDGED} for _ in range(tests)]
    for s in range(sessions):
        offsets = machine.session(tests)
        for t in range(tests):
            values = machine.runs(offsets[t], LOOK_RUNS[0])
            if s == 0:
                stored[t] = carry_history(None, as_record(values))
            for spec in JUDGED:
                windows[t][spec.name].append(level(values[spec.name]))
    return stored, windows


def judge_test(base: Measurement, cand_values: dict, settings: CompareSettings, window: dict | None = None):
    return judge({"hw": base}, "hw", as_record(cand_values), settings, (lambda entry: window) if window else None)


def run_test(
    machine: Machine,
    base: dict,
    offset: float,
    settings: CompareSettings,
    adaptive: bool,
    window: dict | None = None,
    **effect,
) -> tuple[list, int]:
    """Judge one candidate test, measuring more runs while undecided when ``adaptive``."""
    looks = LOOK_RUNS if adaptive else LOOK_RUNS[:1]
    s = CompareSettings(**{**settings.__dict__, "looks": len(looks)})
    values = machine.runs(offset, looks[0], **effect)
    for i, n in enumerate(looks):
        if i:
            values = concat(
                values, machine.runs(offset, n - looks[i - 1], start=looks[i - 1], ramp=values["_ramp"], **effect)
            )
        verdict = judge_test(base, values, s, window)
        if not any(c.worth_more_runs for c in verdict.comparisons):  # the plugin's own stopping rule
            break
    return list(verdict.comparisons), n


def simulate(
    cv: float, outliers: bool, k: int, sessions: int, tests: int, seed: int, window: int = 0
) -> dict[str, dict]:
    """Both run policies (fixed 20, adaptive 20-60) on the same baselines and sessions;
    ``window``: judged against a history window of that many sessions (the file recorded once)."""
    rng = np.random.default_rng([seed, int(cv * 1000), outliers, k, window])
    machine = Machine(rng, cv, outliers)
    settings = CompareSettings(family_size=tests * len(JUDGED), peers=tests)
    tally = {
        policy: {
            "alarm": 0,
            "inconclusive": 0,
            "verdicts": 0,
            "aa_runs": [],
            "flagged": 0,
            "silent": 0,
            "others_alarm": 0,
            "slow_runs": [],
            "decode_unchanged": 0,
            "decode": 0,
            "mde_decode": [],
        }
        for policy in ("20", "20-60")
    }
    for _ in range(sessions):
        if window:
            stored, windows = history_window(machine, tests, window)
        else:
            stored, windows = baseline(machine, tests, k), [None] * tests
        offsets = machine.session(tests)
        state = rng.bit_generator.state
        for policy, adaptive in (("20", False), ("20-60", True)):
            rng.bit_generator.state = state  # common random numbers: the same runs for both policies
            t_ = tally[policy]
            # The session's A/A tests 1..19 are measured once; test 0 three ways (A/A, +10%,
            # 30% x1.5), each a separate session with the same 19 others, judged per test
            # as it ends and then by the session-end suite-relative check, as the plugin does.
            others = []
            for t in range(1, tests):
                comps, n = run_test(machine, stored[t], offsets[t], settings, adaptive, windows[t])
                t_["aa_runs"].append(n)
                others.append(comps)
            sessions_of = {}
            for case, effect in (("aa", {}), ("slow", {"slow": 1.10}), ("mix", {"mixture": 0.30})):
                comps, n = run_test(machine, stored[0], offsets[0], settings, adaptive, windows[0], **effect)
                if case == "slow":
                    t_["slow_runs"].append(n)
                sessions_of[case] = suite_relative([comps, *others], alpha=settings.alpha_suite)
            aa = sessions_of["aa"]
            judged = [c for comps in aa for c in comps if c.mirror_of is None]
            t_["alarm"] += any(c.verdict is Verdict.REGRESSION for c in judged)
            t_["inconclusive"] += sum(c.verdict is Verdict.INCONCLUSIVE for c in judged)
            t_["verdicts"] += len(judged)
            decode = [c for c in judged if c.metric == "tpot_ms"]
            t_["decode"] += len(decode)
            t_["decode_unchanged"] += sum(c.verdict is Verdict.UNCHANGED for c in decode)
            t_["mde_decode"] += [c.detectable for c in decode if c.detectable is not None]
            t_["flagged"] += any(
                c.verdict is Verdict.REGRESSION and c.metric == "tpot_ms" for c in sessions_of["slow"][0]
            )
            tpot = next(c for c in sessions_of["mix"][0] if c.metric == "tpot_ms")
            t_["silent"] += tpot.verdict in (Verdict.UNCHANGED, Verdict.IMPROVED)
            t_["others_alarm"] += any(
                c.verdict is Verdict.REGRESSION for comps in sessions_of["slow"][1:] for c in comps
            )
    return {
        policy: {
            "aa_any": t_["alarm"] / sessions,
            "aa_inconclusive": t_["inconclusive"] / max(t_["verdicts"], 1),
            "aa_decode_unchanged": t_["decode_unchanged"] / max(t_["decode"], 1),
            "mde_decode": float(np.median(t_["mde_decode"])) if t_["mde_decode"] else float("nan"),
            "flag10": t_["flagged"] / sessions,
            "silent_mix": t_["silent"],
            "others_alarm": t_["others_alarm"] / sessions,
            "runs_aa": float(np.mean(t_["aa_runs"])),
            "runs_slow": float(np.mean(t_["slow_runs"])),
        }
        for policy, t_ in tally.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cvs", default="0.02,0.05,0.08")
    parser.add_argument("--baseline-sessions", default="10,1")
    parser.add_argument("--outliers", choices=("both", "no", "yes"), default="both")
    parser.add_argument(
        "--window",
        type=int,
        default=0,
        help="judge against a history window of this many sessions (the file recorded once)",
    )
    args = parser.parse_args()
    cvs = [float(c) for c in args.cvs.split(",")]
    print(
        f"{args.sessions} sessions of {args.tests} tests, Holm m = {args.tests * len(JUDGED)}, alpha 0.01, "
        f"threshold 5% (tail 10%); drift: shared {SHARED_SD:.1%}, per test {TEST_SD:.1%}, ramp +-{RAMP:.0%}"
    )
    print(f"targets: {TARGETS}")
    header = (
        f"{'K':>3} {'outliers':>8} {'CV':>4} {'runs':>8} | {'A/A any REG':>11} {'A/A inconcl.':>12} "
        f"{'A/A dec UNCH':>12} {'+10% flagged':>12} {'30%x1.5 silent':>14} {'others REG':>10} | "
        f"{'mean runs A/A':>13} {'+10%':>6} {'MDE dec':>7}  {'s':>4}"
    )
    print(header)
    print("-" * len(header))
    ks = [args.window] if args.window else [int(v) for v in args.baseline_sessions.split(",")]
    for k in ks:
        for outliers in {"both": (False, True), "no": (False,), "yes": (True,)}[args.outliers]:
            for cv in cvs:
                started = time.perf_counter()
                result = simulate(cv, outliers, k, args.sessions, args.tests, args.seed, window=args.window)
                for policy, r in result.items():
                    print(
                        f"{(f'w{k}' if args.window else k):>3} {'5%' if outliers else '-':>8} {cv:>4.0%} {policy:>8} | "
                        f"{r['aa_any']:>11.2%} {r['aa_inconclusive']:>12.1%} {r['aa_decode_unchanged']:>12.1%} "
                        f"{r['flag10']:>12.1%} {r['silent_mix']:>14d} {r['others_alarm']:>10.2%} | "
                        f"{r['runs_aa']:>13.1f} {r['runs_slow']:>6.1f} {r['mde_decode']:>7.1%}  "
                        f"{time.perf_counter() - started:>4.0f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
