"""Calibrate the regression statistics (pytest_llmperf.compare) on this machine.

    LLMPERF_CACHE_DIR=.llmperf-cache .venv/bin/python benchmarks/calibration.py

About 5 minutes on 2 cores (the engine part ~25 s; A/A sessions with tail permutation tests
are most of the rest); --run-counts, --sessions and --models shorten it.

(a) Measures the real engine's run-to-run noise: CV across runs of TPOT, TTFT, decode and
    prefill TPS and per-run mean ITL, with llama.cpp on the synthetic "tiny" and "small"
    models, 20 runs + 1 warm-up each ("small" stops early past a time budget). It also
    compares each model's first 10 runs with its last 10 (a real A/A: drift shows up here).
(b) Simulates sessions with lognormal noise at the measured CV and at 5% and 10%, for several
    run counts: the A/A false-alarm rate per session of 20 tests x 5 metrics (Holm over
    m = 100 at alpha 0.01), the power to flag true 5% and 10% decode slowdowns, and the minimum
    detectable effect; then compares effect-size guards and recommends a default run count.

How the simulation stays exact yet fast: Holm rejects nothing unless the smallest p-value is
below alpha / m, so each A/A session is first screened with its p-values (the U tests
vectorized, the tail permutation tests as compare.py runs them, stopped as soon as p >= alpha/m
is certain) and only sessions that could
reject are run through compare_runs / compare_tail / decide in full. Power is measured as the
plugin fails a test early: decide() over the regressed test's TPOT and decode TPS with the
other 98 comparisons unseen (p = 1), an upper bound of the session-wide adjustment, so the
power shown is a lower bound. The tail is left out of the power runs (a permutation test at a
true regression runs ~1e5 permutations); it could only add power.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.compare import (  # noqa: E402
    METRICS,
    UNSTABLE_CV,
    Verdict,
    _permutation_pvalues,  # the tail test itself, stopped once p >= alpha/m is certain: a screen
    _Pooled,
    compare_runs,
    compare_tail,
    decide,
    lognormal_sigma,
    min_detectable_effect,
    mwu_method,
)

ALPHA = 0.01
THRESHOLD = 0.05
TAIL_THRESHOLD = 0.10
TESTS_PER_SESSION = 20
M = TESTS_PER_SESSION * len(METRICS)  # 100 comparisons per session
ITL_PER_RUN = 63  # 64 generated tokens
TARGETS = {"aa": 0.01, "power10": 0.95, "power5": 0.80}


# ---------------------------------------------------------------------------------------------
# (a) the real engine


@dataclass
class Noise:
    model: str
    n_runs: int
    seconds: float
    cv: dict[str, float]
    robust_cv: dict[str, float]
    token_cv: float
    load: str


def cv(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / values.mean())


def robust_cv(values: np.ndarray) -> float:
    """1.4826 * MAD / median: the CV a normal sample without its outliers would show."""
    med = float(np.median(values))
    return float(1.4826 * np.median(np.abs(values - med)) / med)


def measure_model(model: str, n_runs: int, budget_s: float):
    from pytest_llmperf import LlamaCppEngine, Workload, ensure_model, measure

    engine = LlamaCppEngine(ensure_model(model))
    runs, started, chunk = [], time.perf_counter(), 5
    while len(runs) < n_runs:
        workload = Workload(prompt_tokens=64, max_tokens=64, runs=min(chunk, n_runs - len(runs)), warmup=0 if runs else 1)
        runs += list(measure(engine, workload).runs)
        if time.perf_counter() - started > budget_s:
            break
    return runs, time.perf_counter() - started


def engine_noise(models: list[str], n_runs: int, budget_s: float) -> list[Noise]:
    out = []
    for model in models:
        load_before = os.getloadavg()[0]
        runs, seconds = measure_model(model, n_runs, budget_s)
        per_run = {
            "tpot_ms": np.array([r.tpot_ms for r in runs]),
            "ttft_ms": np.array([r.ttft_ms for r in runs]),
            "decode_tps": np.array([r.decode_tps for r in runs]),
            "prefill_tps": np.array([r.prefill_tps for r in runs], dtype=float),
            "itl_mean_ms": np.array([np.mean(r.itl_ms) for r in runs]),
        }
        token_cv = float(np.median([cv(np.array(r.itl_ms)) for r in runs]))
        out.append(
            Noise(
                model=model,
                n_runs=len(runs),
                seconds=seconds,
                cv={k: cv(v) for k, v in per_run.items()},
                robust_cv={k: robust_cv(v) for k, v in per_run.items()},
                token_cv=token_cv,
                load=f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}",
            )
        )
        print(f"  {model}: {len(runs)} runs in {seconds:.1f} s, load average {out[-1].load}; "
              f"median TPOT {np.median(per_run['tpot_ms']):.2f} ms, TTFT {np.median(per_run['ttft_ms']):.2f} ms")
        if len(runs) >= 20:
            print_split_aa(runs)
    return out


def print_split_aa(runs) -> None:
    """First half against second half of the same measurement: no change was made."""
    half = len(runs) // 2
    first, second = runs[:half], runs[half : 2 * half]
    comps = []
    for name, spec in METRICS.items():
        if spec.tail:
            comps.append(compare_tail(spec, [r.itl_ms for r in first], [r.itl_ms for r in second],
                                      threshold=TAIL_THRESHOLD, alpha=ALPHA))
        else:
            comps.append(compare_runs(spec, [getattr(r, name) for r in first], [getattr(r, name) for r in second],
                                      threshold=THRESHOLD, alpha=ALPHA))
    for c in decide(comps, alpha=ALPHA):
        print(f"    real A/A, runs 1-{half} vs {half + 1}-{2 * half}: {c.verdict.value:<12} {c.line()}")


# ---------------------------------------------------------------------------------------------
# (b) simulation


def lognormal(rng: np.random.Generator, cv_: float, shape) -> np.ndarray:
    return np.exp(rng.normal(0.0, lognormal_sigma(cv_), shape))


def itl_runs(rng: np.random.Generator, n: int, cv_: float, token_cv: float, factor: float = 1.0) -> list[np.ndarray]:
    level = 12.0 * factor * lognormal(rng, cv_, n)
    return [lv * lognormal(rng, token_cv, ITL_PER_RUN) for lv in level]


def mwu_greater(cand: np.ndarray, base: np.ndarray) -> np.ndarray:
    method = mwu_method(base.shape[-1], cand.shape[-1], ties=False)
    return scipy.stats.mannwhitneyu(cand, base, alternative="greater", method=method, axis=-1).pvalue


def aa_rate(n: int, cv_: float, token_cv: float, sessions: int, seed: int) -> tuple[float, int]:
    """(share of A/A sessions with a false REGRESSION, sessions that had to run in full)."""
    rng = np.random.default_rng(seed)
    shape = (sessions, TESTS_PER_SESSION, n)
    tpot_b, tpot_c = 6.5 * lognormal(rng, cv_, shape), 6.5 * lognormal(rng, cv_, shape)
    ttft_b, ttft_c = 80.0 * lognormal(rng, cv_, shape), 80.0 * lognormal(rng, cv_, shape)
    tails = [[(itl_runs(rng, n, cv_, token_cv), itl_runs(rng, n, cv_, token_cv)) for _ in range(TESTS_PER_SESSION)]
             for _ in range(sessions)]
    # Worse direction of TPOT and TTFT; decode and prefill TPS (1000/TPOT, 64000/TTFT) share these p-values.
    p = np.concatenate([mwu_greater(tpot_c, tpot_b), mwu_greater(ttft_c, ttft_b)], axis=1)
    alarms = full = 0
    for s in range(sessions):
        tail_p = [
            _permutation_pvalues(_Pooled(list(b) + list(c)), n, n, 0.95, True, 0, certify_at=ALPHA / M)[0]
            for b, c in tails[s]
        ]
        if min(p[s].min(), min(tail_p)) >= ALPHA / M:
            continue  # Holm's first step rejects nothing
        full += 1
        comps = []
        for t in range(TESTS_PER_SESSION):
            for spec, b, c in (
                (METRICS["tpot_ms"], tpot_b[s, t], tpot_c[s, t]),
                (METRICS["decode_tps"], 1000 / tpot_b[s, t], 1000 / tpot_c[s, t]),
                (METRICS["ttft_ms"], ttft_b[s, t], ttft_c[s, t]),
                (METRICS["prefill_tps"], 64000 / ttft_b[s, t], 64000 / ttft_c[s, t]),
            ):
                comps.append(compare_runs(spec, b, c, threshold=THRESHOLD, alpha=ALPHA))
            comps.append(compare_tail(METRICS["itl_p95_ms"], *tails[s][t], threshold=TAIL_THRESHOLD, alpha=ALPHA))
        alarms += any(c.verdict is Verdict.REGRESSION for c in decide(comps, alpha=ALPHA, m=M))
    return alarms / sessions, full


def regressed_test(rng, n: int, cv_: float, effect: float):
    base = 6.5 * lognormal(rng, cv_, n)
    cand = 6.5 * (1 + effect) * lognormal(rng, cv_, n)
    return base, cand


def power(n: int, cv_: float, effect: float, reps: int, seed: int) -> tuple[float, float]:
    """(P(flagged), P(flagged with fail_unstable)) for a true decode slowdown of ``effect``."""
    rng = np.random.default_rng(seed)
    samples = [regressed_test(rng, n, cv_, effect) for _ in range(reps)]
    p = mwu_greater(np.array([c for _, c in samples]), np.array([b for b, _ in samples]))
    flagged = flagged_unstable = 0
    for (base, cand), p_i in zip(samples, p):
        if p_i >= ALPHA / M:
            continue  # TPOT and decode TPS share this p; Holm's bound is M * p
        comps = [
            compare_runs(METRICS["tpot_ms"], base, cand, threshold=THRESHOLD, alpha=ALPHA),
            compare_runs(METRICS["decode_tps"], 1000 / base, 1000 / cand, threshold=THRESHOLD, alpha=ALPHA),
        ]
        flagged += any(c.verdict is Verdict.REGRESSION for c in decide(comps, alpha=ALPHA, m=M))
        flagged_unstable += any(
            c.verdict is Verdict.REGRESSION for c in decide(comps, alpha=ALPHA, m=M, fail_unstable=True)
        )
    return flagged / reps, flagged_unstable / reps


def rule_table(n: int, cv_: float, reps: int, seed: int) -> None:
    """Flag rates of candidate effect-size guards, all on the same significant comparisons."""
    rules = {
        "no guard": lambda c: True,
        "point > 1+d": lambda c: c.ratio > 1 + THRESHOLD,
        "point > 1+d/2": lambda c: c.ratio > 1 + THRESHOLD / 2,
        "CI high > 1+d (chosen)": lambda c: c.ci_high is not None and c.ci_high > 1 + THRESHOLD,
    }
    effects = (0.0, 0.01, 0.02, 0.03, 0.05, 0.10)
    rates = {r: [] for r in rules}
    for k, effect in enumerate(effects):
        rng = np.random.default_rng(seed + k)
        hits = dict.fromkeys(rules, 0)
        for _ in range(reps):
            base, cand = regressed_test(rng, n, cv_, effect)
            c = decide([compare_runs(METRICS["tpot_ms"], base, cand, threshold=THRESHOLD, alpha=ALPHA)],
                       alpha=ALPHA, m=M)[0]
            if c.p_adjusted < ALPHA:
                for r, rule in rules.items():
                    hits[r] += rule(c)
        for r in rules:
            rates[r].append(hits[r] / reps)
    print(f"\nEffect-size guards: share of TPOT comparisons flagged, {n} vs {n} runs, CV {cv_:.0%}, "
          f"Holm-adjusted p < {ALPHA} over m={M}, threshold d={THRESHOLD:.0%}, {reps} samples per column")
    print(f"  {'rule':<24}" + "".join(f"{f'+{e:.0%}':>8}" for e in effects))
    for r in rules:
        print(f"  {r:<24}" + "".join(f"{v:>8.1%}" for v in rates[r]))


def runs_needed(cv_: float, seed: int, n_max: int = 200) -> int | None:
    """Fewest runs a side whose MDE meets both power targets (significance part), by bisection."""

    def enough(n: int) -> bool:
        kw = dict(alpha=ALPHA, m=M, seed=seed, n_sim=1000)
        return (min_detectable_effect(n, cv_, power=TARGETS["power5"], **kw) <= 0.05
                and min_detectable_effect(n, cv_, power=TARGETS["power10"], **kw) <= 0.10)

    lo, hi = 7, n_max
    if not enough(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,small", help="synthetic presets to measure (empty: skip)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=90.0, help="time budget per model for measuring")
    ap.add_argument("--cv", type=float, default=None, help="use this CV instead of the measured one")
    ap.add_argument("--run-counts", default="10,15,20,30")
    ap.add_argument("--sessions", type=int, default=200, help="A/A sessions per configuration")
    ap.add_argument("--reps", type=int, default=200, help="samples per power estimate")
    ap.add_argument("--seed", type=int, default=12345)
    args = ap.parse_args()
    t0 = time.perf_counter()

    print(f"pytest-llmperf calibration: alpha {ALPHA} family-wise over m={M} comparisons "
          f"({TESTS_PER_SESSION} tests x {len(METRICS)} metrics), threshold {THRESHOLD:.0%} "
          f"(tails {TAIL_THRESHOLD:.0%}), UNSTABLE at CV >= {UNSTABLE_CV:.0%}; {os.cpu_count()} CPUs")
    models = [m for m in args.models.split(",") if m]
    noise: list[Noise] = []
    if models:
        print("\n(a) Engine noise (llama.cpp, 64 prompt + 64 generated tokens, 1 warm-up run)")
        noise = engine_noise(models, args.runs, args.budget_s)
        keys = ["tpot_ms", "ttft_ms", "decode_tps", "prefill_tps", "itl_mean_ms"]
        print(f"\n  {'model':<7}{'runs':>5}" + "".join(f"{k:>13}" for k in keys) + f"{'ITL in-run':>12}")
        for nz in noise:
            print(f"  {nz.model:<7}{nz.n_runs:>5}" + "".join(f"{nz.cv[k]:>13.1%}" for k in keys) + f"{nz.token_cv:>12.1%}")
            print(f"  {'robust':<7}{'':>5}" + "".join(f"{nz.robust_cv[k]:>13.1%}" for k in keys))
        print("  (CV = stdev/mean over runs; robust = 1.4826*MAD/median; ITL in-run = median CV of a run's ITLs)")

    ref = noise[-1] if noise else None
    measured_cv = args.cv if args.cv is not None else (ref.cv["tpot_ms"] if ref else 0.03)
    token_cv = ref.token_cv if ref else 0.15
    source = "--cv" if args.cv is not None else f"TPOT of '{ref.model}'" if ref else "default"
    cvs = [measured_cv] + [c for c in (0.03, 0.05, 0.10) if abs(c - measured_cv) > 0.005]
    ns = [int(x) for x in args.run_counts.split(",")]

    print(f"\n(b) Simulation: lognormal noise, run-level CV as below ({source}: {measured_cv:.1%}), "
          f"tail tokens with in-run CV {token_cv:.0%}, {args.sessions} A/A sessions and {args.reps} "
          f"samples per power figure per row")
    header = (f"  {'CV':>5} {'runs':>5} {'A/A false alarms':>17} {'power +5%':>10} "
              f"{'power +10%':>11} {'(+5%/+10% if fail_unstable)':>28} {'MDE 80%':>8} {'MDE 95%':>8}  targets")
    print(header)
    results = {}
    for cv_ in cvs:
        for n in ns:
            fa, _ = aa_rate(n, cv_, token_cv, args.sessions, args.seed + n)
            p5, p5u = power(n, cv_, 0.05, args.reps, args.seed + 1000 + n)
            p10, p10u = power(n, cv_, 0.10, args.reps, args.seed + 2000 + n)
            mde80 = min_detectable_effect(n, cv_, alpha=ALPHA, m=M, power=0.80)
            mde95 = min_detectable_effect(n, cv_, alpha=ALPHA, m=M, power=0.95)
            ok = fa <= TARGETS["aa"] and p10 >= TARGETS["power10"] and p5 >= TARGETS["power5"]
            results[(cv_, n)] = ok
            print(f"  {cv_:>5.1%} {n:>5} {fa:>17.1%} {p5:>10.1%} {p10:>11.1%} "
                  f"{f'{p5u:.1%} / {p10u:.1%}':>28} {mde80:>8.1%} {mde95:>8.1%}  {'met' if ok else 'not met'}",
                  flush=True)

    print(f"\nRuns a side needed for both power targets (significance at alpha/m = {ALPHA / M:g}; "
          f"MDE by simulation), by CV:")
    needed = {}
    for cv_ in sorted({0.01, 0.02, 0.03, 0.05, round(measured_cv, 3)}):
        needed[cv_] = runs_needed(cv_, args.seed) if cv_ < UNSTABLE_CV else None
        shown = needed[cv_] if needed[cv_] is not None else ("n/a: UNSTABLE" if cv_ >= UNSTABLE_CV else "> 200")
        print(f"  CV {cv_:>5.1%}: {shown}")

    met = [n for n in ns if results.get((measured_cv, n))]
    quiet_cv = min(cvs, key=lambda c: abs(c - 0.03))
    quiet = [n for n in ns if results.get((quiet_cv, n))]
    rule_n = min(met or quiet or [20])
    rule_table(rule_n, 0.03, args.reps, args.seed + 3000)
    rule_table(rule_n, 0.01, args.reps, args.seed + 4000)  # narrow CIs: where the guard matters

    print("\nRecommendation:")
    if met:
        print(f"  default runs = {min(met)}: the smallest run count in {ns} meeting all targets at the "
              f"measured CV {measured_cv:.1%}.")
    else:
        print(f"  No run count in {ns} meets the targets at the measured CV {measured_cv:.1%} "
              f"(needs {needed.get(round(measured_cv, 3)) or 'more than 200 / UNSTABLE'} runs a side).")
        if quiet:
            print(f"  At CV 3% (a quiet machine, pinned threads) {min(quiet)} runs a side meet every target in "
                  f"the table ({needed.get(0.03)} by the MDE search): recommended default runs = {min(quiet)}. "
                  f"Where CV >= {UNSTABLE_CV:.0%} the verdicts say UNSTABLE instead of failing.")
    print(f"\nTotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
