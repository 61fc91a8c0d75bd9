"""The in-process A/B at ``--llmperf-against``'s gate, token by token and in whole runs, on real
llama.cpp (issue 50 points 4 and 6): the calibration figures of ``benchmarks/gate_sessions.py``
for ``compare_ab`` / ``llmperf.compare()``.

Each session is one ``compare_ab`` of two in-process llama.cpp engines of the same model (1
thread each, a synthetic prompt, ``--pairs`` pairs after 1 warm-up pair, seeded by the session),
its pairs in blocks over fresh engine instance pairs (docs/ab.md, "Instances: the second level":
each later block on a fresh pair of the session's engines, the case's per-token work kept), its
CIs the two-level model's. Its pairs are judged as ``--llmperf-against`` judges a measurement's, replayed by
``against_stopping.stopped``'s ``after`` rule (the plan of ``session.against.looks_for`` for
``--runs``: a look every 10 pairs up to 3 x runs, each look ``judge.paired.look`` at alpha
/ looks and ``--threshold``, stopping at the first look that settles, else at the
cap or the session's last pair; without against's time bound; a look over two or more instance
pairs judged with the two-level model, as against's over its process pairs): the verdicts
and CIs are those of the look it stopped at, the pairs and seconds per decision those pairs'
(the session's seconds per pair).

- cases (``--cases``): ``aa`` (B identical to A) and ``+N%`` (B spends N% of the time llama.cpp
  took for each generated token after the first on extra work, a spin on the clock right after
  llama.cpp's step: decode work, not prefill, as ``against_sessions.py``'s wrapper);
- ways (``--ways``): ``token`` (both engines pause between tokens: each pair's runs take turns
  step by step) and ``run`` (the same engines behind a wrapper without ``SteppedRuns``: whole
  runs). A session's ways run one after the other on the same engines, so the machine's load
  falls on both alike; the cases alternate session by session.

A/A gets ``--aa-factor`` times ``--sessions`` sessions. Each session's row is printed and, with
``--jsonl``, appended to that file in ``gate_sessions.py``'s shape (its ``processes`` and
``start_s``: the instance pairs the stopping look used and their build seconds; ``levels``: the
A/B's own over all its pairs), with its case, way, instance pairs, blocks, build seconds and the
sd of its pairs' decode log ratios, and a line of its instance pairs and levels; the summary per way is ``gate_sessions.summary``'s: decode and TTFT CI coverage of 1,
REGRESSION counts, decode CI above 1, decided counts, the median pairs and seconds per decision;
then per case the coverage of the A/B's own 95% CIs (``compare_ab``'s, over all the session's
pairs: what an A/B's report shows) and the median sd of a pair's decode log ratio.
``--summary-of FILE`` reprints the summary of a ``--jsonl`` file and runs nothing.

    .venv/bin/python benchmarks/ab_token_sessions.py --sessions 1 --aa-factor 1 --pairs 10 --ways token  # a look
    # the issue's figures (40 A/A, 10 +2%, 10 +1%, token by token; all 60 pairs of each session
    # measured over 8-14 instance pairs: 70-100 s of pairs and 45-75 s of builds a session at
    # load 4 on 2 cores, about 150 s: about 2.5 hours; both ways about twice that)
    .venv/bin/python benchmarks/ab_token_sessions.py --sessions 10 --aa-factor 4 --ways token --jsonl ab.jsonl
    .venv/bin/python benchmarks/ab_token_sessions.py --summary-of ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pytest_llmperf import Workload, ensure_model
from pytest_llmperf.core.workload import EngineInfo, RunTrace
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.judge.ab import Side, compare_ab
from pytest_llmperf.judge.result import comparison_json
from pytest_llmperf.measuring.interleave import Interleaved, turns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from against_sessions import load  # scripts beside this one
from against_stopping import stopped
from gate_sessions import keep, session_plan, summary

WAYS = ("token", "run")
#: The metrics whose CIs are counted: TTFT (prefill) and TPOT (decode).
METRICS = ("ttft_ms", "tpot_ms")


class SlowerDecode:
    """llama.cpp's module with ``extra`` x each one-token step's own time spent after it (a spin:
    the step's clock read comes after it). The prompt's batches are untouched."""

    def __init__(self, lib: ModuleType, extra: float) -> None:
        self._lib, self._extra = lib, extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def llama_decode(self, ctx: Any, batch: Any) -> int:
        began = time.perf_counter()
        rc = int(self._lib.llama_decode(ctx, batch))
        if batch.n_tokens == 1:
            self._lib.llama_synchronize(ctx)
            end = time.perf_counter() + self._extra * (time.perf_counter() - began)
            while time.perf_counter() < end:
                pass
        return rc


class CaseEngine(LlamaCppEngine):
    """llama.cpp in this process with a case's per-token work (``SlowerDecode``; none for A/A),
    which its fresh instances (the A/B's later blocks) keep."""

    def __init__(self, path: str | os.PathLike[str], extra: float, **settings: Any) -> None:
        super().__init__(path, **settings)
        self.extra = extra
        if extra:
            self._lib = SlowerDecode(self._lib, extra)  # type: ignore[assignment]

    def fresh_instance(self) -> CaseEngine:
        return CaseEngine(self.config.model, self.extra, name=self.info().model, **self.config.settings())


class WholeRuns:
    """An engine's ``run`` and ``info`` only: no ``SteppedRuns``, so an A/B takes whole runs; its
    fresh instances (``FreshInstances``) are the engine's, as whole runs too."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine

    def info(self) -> EngineInfo:
        return self.engine.info()

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        return self.engine.run(workload, run_index)

    def fresh_instance(self) -> WholeRuns:
        return WholeRuns(self.engine.fresh_instance())

    def close(self) -> None:
        self.engine.close()


def change_of(case: str) -> float:
    """A case's per-token work: ``aa`` 0, ``+2%`` 0.02."""
    if case == "aa":
        return 0.0
    if not (case.startswith("+") and case.endswith("%")):
        raise SystemExit(f"--cases: {case!r} is neither aa nor +N%")
    return float(case[1:-1]) / 100.0


def session(a: Any, b: Any, case: str, way: str, workload: Workload, args: argparse.Namespace, index: int) -> dict:
    """One A/B session of a case and way, judged as ``--llmperf-against`` would: its row."""
    started = time.monotonic()
    r = compare_ab(Side("a", a), Side(case, b), workload, agreement=False, attribution=None)
    wall_s = time.monotonic() - started
    assert r.interleaved.value == way, (r.interleaved, r.unstepped)
    groups = [k for k, size in enumerate(r.blocks) for _ in range(size)]
    n, judged, _, why = stopped("after", r.a.runs, r.b.runs, args.runs, threshold=args.threshold, groups=groups)
    by_metric = {metric: comparison_json(c) for metric, c in judged.items()}
    d = np.log([x.tpot_ms for x in r.b.runs]) - np.log([x.tpot_ms for x in r.a.runs])
    return {
        "case": case,
        "change": change_of(case),
        "way": way,
        "session": index,
        "ttft": by_metric.get("ttft_ms"),
        "tpot": by_metric["tpot_ms"],
        "pairs": n,
        # The pairs' seconds (the builds left out) and the builds of the instance pairs the look used.
        "pairs_s": n * (wall_s - r.build_s) / (workload.runs + workload.warmup),
        "start_s": r.build_s * (len(set(groups[:n])) - 1) / max(r.instance_pairs - 1, 1),
        "processes": len(set(groups[:n])),
        "levels": [one.to_json() for one in r.levels],
        "instance_pairs": r.instance_pairs,
        "blocks": list(r.blocks),
        "build_s": r.build_s,
        "stopped": why,
        "wall_s": wall_s,
        "load": load(),
        "spread": float(np.std(d, ddof=1)),
        "ab_pairs": workload.runs,
        "threshold": args.threshold,
        # compare_ab's own 95% CIs over all the session's pairs (what the A/B's report shows).
        "ab": {m: {"ratio": r.get(m).ratio, "ci_low": r.get(m).ci_low, "ci_high": r.get(m).ci_high} for m in METRICS},
    }


def instances(row: dict) -> str:
    """A session's second level: its engine instance pairs, their blocks and build seconds, and
    what each level contributed to the A/B's own CIs (``Levels.to_json``)."""
    shares = "; ".join(
        f"{lv['metric']} between sd {lv['between_sd']:.2%}, within sd {lv['within_sd']:.2%}, "
        f"instance level {lv['between_share']:.0%}"
        for lv in row.get("levels") or ()
    )
    return (
        f"{row.get('instance_pairs', 1)} instance pairs (blocks {row.get('blocks')}, built in "
        f"{row.get('build_s', 0.0):.1f} s); levels: {shares or '-'}"
    )


def summaries(rows: list[dict], threshold: float) -> None:
    """``gate_sessions.summary`` per way, and each case's median decode pair sd; ``threshold``:
    the rows' own where they keep it."""
    threshold = next((r["threshold"] for r in rows if "threshold" in r), threshold)
    for way in WAYS:
        mine = [r for r in rows if r.get("way", "token") == way]
        if not mine:
            continue
        print(f"\n{turns(Interleaved(way), None)}, --llmperf-against's looks:")
        summary(mine, threshold)
        print("the A/B's own 95% CIs over all its pairs, and the median sd of a pair's decode log ratio:")
        for case in dict.fromkeys(r["case"] for r in mine if "ab" in r):
            print("  " + own_cis([r for r in mine if r["case"] == case and "ab" in r]))


def own_cis(rows: list[dict]) -> str:
    """One case's A/B CIs (``compare_ab``'s, over every pair of a session): how many cover 1 and
    lie above 1, and the median sd of a pair's decode log ratio."""
    n = len(rows)
    covers = {m: sum(r["ab"][m]["ci_low"] <= 1.0 <= r["ab"][m]["ci_high"] for r in rows) for m in METRICS}
    above = sum(r["ab"]["tpot_ms"]["ci_low"] > 1.0 for r in rows)
    return (
        f"{rows[0]['case']}, {n} sessions of {rows[0]['ab_pairs']} pairs: decode covers 1 {covers['tpot_ms']}/{n}, "
        f"TTFT covers 1 {covers['ttft_ms']}/{n}, decode CI above 1 {above}/{n}; decode pair sd "
        f"{statistics.median(r['spread'] for r in rows):.1%}"
    )


def run_all(args: argparse.Namespace, cases: list[str], ways: list[str]) -> list[dict]:
    path = ensure_model(args.preset)
    a = CaseEngine(path, 0.0, threads=1, name="a")
    bs = {case: CaseEngine(path, change_of(case), threads=1, name=case) for case in cases}
    print(
        f"threshold {args.threshold:.0%}, {args.pairs} pairs a session (looks of --llmperf-against's plan for "
        f"runs={args.runs}), {args.preset} preset, threads 1, pp{args.prompt_tokens} tg{args.max_tokens}; cases "
        f"{cases}, ways {ways}; load {load()}; pid {os.getpid()}",
        flush=True,
    )
    rows: list[dict] = []
    for case, s in session_plan(cases, args.sessions, args.aa_factor, aa="aa"):
        for way in ways:
            w = Workload(
                prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.pairs, warmup=1, seed=s
            )
            sa, sb = (a, bs[case]) if way == "token" else (WholeRuns(a), WholeRuns(bs[case]))
            row = session(sa, sb, case, way, w, args, s + 1)
            print(f"{way:>5}", end="")
            keep(row, rows, args.jsonl)
            print(f"        {instances(row)}", flush=True)
    for engine in (a, *bs.values()):
        engine.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=2, help="sessions per case (A/A gets --aa-factor times as many)")
    p.add_argument("--aa-factor", type=int, default=1)
    p.add_argument(
        "--pairs",
        type=int,
        default=60,
        help="pairs a session (the looks stop at 3 x --runs, as --llmperf-against's cap)",
    )
    p.add_argument("--runs", type=int, default=Workload.runs, help="the marker's runs: a look every half of it")
    p.add_argument("--threshold", type=float, default=0.01)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--preset", default="small")
    p.add_argument("--cases", default="aa,+2%,+1%", help="aa and +N%% (N%% extra work per token)")
    p.add_argument("--ways", default="token,run", help="token, run or both")
    p.add_argument("--jsonl", type=Path, help="append each session's row to this file")
    p.add_argument("--summary-of", type=Path, help="print the summary of a --jsonl file and run nothing")
    args = p.parse_args()
    if args.summary_of:
        summaries([json.loads(x) for x in args.summary_of.read_text().splitlines() if x.strip()], args.threshold)
        return 0
    cases = [c.strip() for c in args.cases.split(",")]
    ways = [w.strip() for w in args.ways.split(",")]
    if not set(ways) <= set(WAYS) or args.pairs < 3:
        raise SystemExit(f"--ways: token and/or run, got {args.ways!r}; --pairs: at least 3")
    rows = run_all(args, cases, ways)
    summaries(rows, args.threshold)
    return 0 if all(math.isfinite(r["tpot"]["ratio"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
