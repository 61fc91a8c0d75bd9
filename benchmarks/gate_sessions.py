"""The 1% gate of ``--llmperf-against`` (issue 50): separate pytest sessions of A/A, +2% and +1%
per-token work, each side's runs over process pairs (``--llmperf-max-processes``), judged at
``--llmperf-threshold`` (1% by default). Prints, per case: how often the decode and TTFT CIs
cover 1 (A/A: the calibration; a change: how often the CI missed it), the REGRESSION counts,
how often the decode CI lies above 1, how many TTFT and decode comparisons were decided (not
INCONCLUSIVE), the median pairs and process pairs, and the seconds per decision (the pairs'
seconds, and with the extra processes' start-up, which lies outside every timed region).

The test repository and the user's streaming wrapper are ``benchmarks/against_sessions.py``'s
(a ``git:HEAD~1`` REF one commit back: an empty commit for A/A, the wrapper's extra work per
token for a change). The cases alternate session by session so that a drift of the machine
falls on all of them alike.

    .venv/bin/python benchmarks/gate_sessions.py --sessions 10 --aa-factor 4   # the issue's figures: 40 A/A, 10 each change
    .venv/bin/python benchmarks/gate_sessions.py --sessions 2 --changes 0,0.02   # a quick look
    .venv/bin/python benchmarks/gate_sessions.py --sessions 10 --changes p0.05,p0.02   # prefill changes: TTFT

A change ``pN`` spends N of the time to the first token (the previous run's) on extra work before
the wrapper hands llama.cpp the prompt: a TTFT change, decode untouched; its row says ``phase:
prefill``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from against_sessions import load, make_repo  # a script beside this one

from pytest_llmperf.core.settings import DEFAULT_MAX_PROCESSES


def session(root: Path, args: argparse.Namespace, out: Path) -> dict:
    """One ``pytest --llmperf-against git:HEAD~1`` session of ``root``; its session file."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-q",
        "-p",
        "no:cacheprovider",
        "--llmperf-model",
        args.preset,
        "--llmperf-threads",
        str(args.threads),
        f"--llmperf-threshold={args.threshold}",
        f"--llmperf-max-processes={args.max_processes}",
        f"--llmperf-json={out}",
        "--llmperf-against",
        "git:HEAD~1",
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=3600, check=False)
    if not out.exists():  # said, and the next session goes on (a crashed session is not a row)
        print(proc.stdout[-3000:], proc.stderr[-3000:], f"session wrote no JSON (exit {proc.returncode})")
        return {"results": [], "_exit": proc.returncode, "_wall_s": time.monotonic() - started}
    doc = json.loads(out.read_text())
    doc["_exit"], doc["_wall_s"] = proc.returncode, time.monotonic() - started
    return doc


def row_of(doc: dict, change: float, index: int, phase: str = "decode") -> dict | None:
    """The session's one measurement as a row: TTFT and TPOT comparisons, pairs, seconds (``phase``:
    where the change's extra work goes; a prefill change's row says so)."""
    for r in doc["results"]:
        comps = {c["metric"]: c for c in (r.get("verdict") or {}).get("comparisons", [])}
        if "tpot_ms" not in comps:
            continue
        decisions = (doc.get("against") or {}).get("decisions") or []
        d = next((x for x in decisions if x["test"] == r["test"]), decisions[-1] if decisions else {})
        return {
            "change": change,
            **({"phase": phase} if phase != "decode" else {}),
            "session": index,
            "ttft": comps.get("ttft_ms"),
            "tpot": comps["tpot_ms"],
            "pairs": d.get("pairs"),
            "pairs_s": d.get("seconds") or 0.0,
            "start_s": d.get("start_s") or 0.0,
            "processes": d.get("processes") or 1,
            "levels": d.get("levels") or [],
            "stopped": d.get("stopped"),
            "wall_s": doc["_wall_s"],
            "load": load(),
        }
    return None


def _ci(c: dict | None) -> str:
    if c is None:
        return "-"
    return f"{c['ratio']:.3f} ({c['ci_low']:.3f}..{c['ci_high']:.3f}) {c['verdict']}"


def show(row: dict) -> None:
    """One session's row; an in-process A/B's (``way`` in the row) over engine instance pairs."""
    unit = "instance" if "way" in row else "process"
    shares = ", ".join(f"{lv['metric']} {lv['between_share']:.0%}" for lv in row["levels"])
    print(
        f"  {case_label(row)} session {row['session']}: TTFT {_ci(row['ttft'])}, TPOT {_ci(row['tpot'])}; "
        f"{row['pairs']} pairs over {row['processes']} {unit} pair(s) in {row['pairs_s']:.1f} s "
        f"(+{row['start_s']:.1f} s start; {row['stopped']}); {unit} level {shares or '-'}; "
        f"{row['wall_s']:.0f} s; load {row['load']}",
        flush=True,
    )


def _covers(c: dict | None) -> bool:
    return c is not None and c["ci_low"] <= 1.0 <= c["ci_high"]


def case_label(row: dict) -> str:
    """``+2%`` (per token, decode) or ``+5% prefill`` (before the first token)."""
    return f"{row['change']:+.0%}" + (" prefill" if row.get("phase") == "prefill" else "")


def summary(rows: list[dict], threshold: float) -> None:
    for label in sorted({case_label(r) for r in rows}, key=lambda x: (x.endswith("prefill"), x)):
        mine = [r for r in rows if case_label(r) == label]
        change = mine[0]["change"]
        n = len(mine)
        count = {
            "decode covers 1": sum(_covers(r["tpot"]) for r in mine),
            "TTFT covers 1": sum(_covers(r["ttft"]) for r in mine),
            "decode REGRESSION": sum(r["tpot"]["verdict"] == "REGRESSION" for r in mine),
            "TTFT REGRESSION": sum((r["ttft"] or {}).get("verdict") == "REGRESSION" for r in mine),
            "decode CI above 1": sum(r["tpot"]["ci_low"] > 1.0 for r in mine),
            "decode decided": sum(r["tpot"]["verdict"] != "INCONCLUSIVE" for r in mine),
            "TTFT CI above 1": sum((r["ttft"] or {}).get("ci_low", 0.0) > 1.0 for r in mine),
            "TTFT decided": sum((r["ttft"] or {}).get("verdict", "INCONCLUSIVE") != "INCONCLUSIVE" for r in mine),
        }
        pairs = [r["pairs"] for r in mine if r["pairs"]]
        decision_s = [r["pairs_s"] + r["start_s"] for r in mine]
        print(
            f"{'A/A' if change == 0 else label if label.endswith('prefill') else f'{label} per token'} at threshold {threshold:.0%}, {n} sessions: "
            + ", ".join(f"{k} {v}/{n}" for k, v in count.items())
            + f"; pairs median {statistics.median(pairs):g} ({min(pairs)}-{max(pairs)}); process pairs median "
            f"{statistics.median(r['processes'] for r in mine):g}; seconds per decision median "
            f"{statistics.median(decision_s):.1f} (pairs {statistics.median(r['pairs_s'] for r in mine):.1f} + "
            f"start {statistics.median(r['start_s'] for r in mine):.1f}); session wall median "
            f"{statistics.median(r['wall_s'] for r in mine):.0f} s",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=10, help="sessions per case (A/A gets --aa-factor times as many)")
    p.add_argument("--aa-factor", type=int, default=1)
    p.add_argument(
        "--changes",
        default="0,0.02,0.01",
        help="each case's extra work: per token (0.02; 0: A/A), or before the first token with a p (p0.05: TTFT)",
    )
    p.add_argument("--threshold", type=float, default=0.01)
    p.add_argument("--max-processes", type=int, default=DEFAULT_MAX_PROCESSES, help="the plugin's default unless given")
    p.add_argument("--preset", default="small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--jsonl", type=Path, help="append each session's row to this file")
    p.add_argument("--summary-of", type=Path, help="print the summary of a --jsonl file and run nothing")
    args = p.parse_args()
    if args.summary_of:
        summary([json.loads(x) for x in args.summary_of.read_text().splitlines() if x.strip()], args.threshold)
        return 0
    changes = [x.strip() for x in args.changes.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="llmperf-gate-bench-") as tmp:
        roots = {}
        for change in changes:
            root = Path(tmp) / f"repo-{change}"
            prefill = float(change[1:]) if change.startswith("p") else 0.0
            per_token = 0.0 if prefill else float(change)
            case = "aa" if per_token == prefill == 0 else "change"
            make_repo(root, case, per_token, args.prompt_tokens, args.max_tokens, args.preset, prefill=prefill)
            roots[change] = root
        print(
            f"threshold {args.threshold:.0%}, max_processes {args.max_processes}, {args.preset} preset, threads "
            f"{args.threads}, pp{args.prompt_tokens} tg{args.max_tokens}; cases {changes}; load {load()}; "
            f"pid {os.getpid()}",
            flush=True,
        )
        aa = next((c for c in changes if float(c.lstrip("p")) == 0), None)
        for change, s in session_plan(changes, args.sessions, args.aa_factor, aa=aa):
            doc = session(roots[change], args, Path(tmp) / f"s-{change}-{s}.json")
            phase = "prefill" if change.startswith("p") else "decode"
            row = row_of(doc, float(change.lstrip("p")), s + 1, phase)
            if row is None:
                print(f"  {change} session {s + 1}: nothing compared (exit {doc['_exit']})", flush=True)
                continue
            keep(row, rows, args.jsonl)
    summary(rows, args.threshold)
    return 0


def session_plan(cases: list, sessions: int, aa_factor: int, aa: object) -> list[tuple]:
    """(case, session index) in the order they run: the cases alternating session by session, the
    A/A case (``aa``) ``aa_factor`` times as many sessions as each change."""
    plan = [(c, s) for s in range(sessions * max(aa_factor, 1)) for c in cases]
    return [(c, s) for c, s in plan if c == aa or s < sessions]


def keep(row: dict, rows: list[dict], jsonl: Path | None) -> None:
    """A session's row kept: in ``rows``, printed, and appended to the ``--jsonl`` file if any."""
    rows.append(row)
    show(row)
    if jsonl:
        with jsonl.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
