"""``--llmperf-against`` on real llama.cpp, many separate pytest sessions: what it catches, and
what it does not flag (issue 22, docs/against.md "Measured").

A small test repository is made in a temporary folder (two commits that differ only in the
user's wrapper code, ``wrapper.make_stream(llm)``: it streams tokens from llama.cpp's
``Llama.generate`` and, from the second commit on, spends ``--change`` (0.08 = +8%) of the time
llama.cpp took for each token after the first on extra work per token, a spin on the clock). Each session is
one ``pytest --llmperf-against REF`` process on the small preset, default runs (20 pairs, up to
60 while undecided), read back from its ``--llmperf-json`` file.

Cases:
- ``change``: commit 2 has the extra work; ``--llmperf-against git:HEAD~1``: decode REGRESSION
  (beyond the 5% threshold) and "found" (the decode CI above 1) per session.
- ``aa``: commit 2 is identical to commit 1 (an empty commit); the same count must be 0.
- ``head``: ``--llmperf-against git:HEAD`` on the unchanged tree, a marker-only test (the
  plugin's own llama.cpp loop): the median paired ratios of TTFT and TPOT, and REGRESSIONs.
- ``python``: ``--llmperf-against python:PATH``: a second virtualenv with an older
  llama-cpp-python (built once into ``$LLMPERF_CACHE_DIR/venvs``), marker-only test: both
  sides' llama-cpp-python versions, the paired ratios and their CIs.
- ``quant``: the code under test names the model (``pick.MODEL``): the preset in F16 at commit
  1, the same weights in Q8_0 at commit 2 (a quantization change in a pull request), measured
  with ``repack=False`` (the AMX repacked Q8_0 kernel crashes on some Xeons) and bounded by
  ``min_top1_agreement=0.95``: the speed ratios and the output agreement with REF.

Every session prints the output agreement with REF where the sides expose token probabilities
(the plugin's engine, not a callable): top-1, mean KL, positions.

``--busy`` keeps one core busy with another process for the whole run.

``--record-pairs FILE`` appends, per session, every pair's runs of both sides (each run's
``RunMetrics``, its per-token latencies included) and when each look came, as one JSON line:
``benchmarks/against_stopping.py --replay FILE`` replays stopping rules and per-run statistics on
those real pairs. With ``--all-pairs`` the pairs never stop before the cap (60 by default), so a
replay sees every pair a rule could ask for. The controller's ``judge.paired.judged_pairs`` (and,
with ``--all-pairs``, ``pairs_settled``) is wrapped by a plugin this script loads with ``-p``; the
package itself records nothing.

    .venv/bin/python benchmarks/against_sessions.py --case change --change 0.08 --sessions 10
    .venv/bin/python benchmarks/against_sessions.py --case aa --sessions 20
    .venv/bin/python benchmarks/against_sessions.py --case python --old 0.3.30 --sessions 5
    .venv/bin/python benchmarks/against_sessions.py --case quant --sessions 3
    .venv/bin/python benchmarks/against_sessions.py --summary-of rows.jsonl --case aa   # rows of --jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRAPPER = """import time

#: Extra work per token, as a share of the time llama.cpp took for that token.
EXTRA = {extra!r}
#: Extra work before the prompt is evaluated, as a share of the time to the first token (the
#: previous run's): prompt work, in TTFT (work after the first token is made is decode's).
PREFILL = {prefill!r}
_FIRST = [0.0]


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def make_stream(llm):
    def stream(prompt, max_tokens):
        if PREFILL:  # before the clock's first token: in TTFT
            _spin(PREFILL * _FIRST[0])
        begun = time.perf_counter()
        tokens = llm.tokenize(prompt.encode())
        llm.reset()
        last = time.perf_counter()
        for n, token in enumerate(llm.generate(tokens, temp=0.0), 1):
            now = time.perf_counter()
            if n == 1:
                _FIRST[0] = now - begun
            elif EXTRA:  # per generated token after the first: decode work, not prefill
                _spin(EXTRA * (now - last))
            yield token
            if n >= max_tokens:
                break
            last = time.perf_counter()
    return stream
"""


def wrapper_source(extra: float, prefill: float = 0.0) -> str:
    """The wrapper's module: ``extra`` of llama.cpp's time per token after the first spent on
    extra work (decode), ``prefill`` of the time to the first token (its previous run's) before the
    prompt goes to llama.cpp (TTFT: the plugin stamps a watched Llama's tokens when it makes them,
    so work between making the first token and yielding it is the next token's, and delivery's)."""
    return WRAPPER.format(extra=extra, prefill=prefill)


TEST_WRAPPER = """import pytest
from wrapper import make_stream


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens})
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(make_stream(llmperf_llm))
"""
TEST_QUANT = """import pytest
from pick import MODEL


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}, min_top1_agreement=0.95)
def test_quant(llmperf):
    llmperf.measure(model=MODEL, repack=False)
"""
#: Loaded with ``-p`` in every session of --record-pairs (it is only called in the controller:
#: the sides do not judge). Each look appends a line with every pair so far.
RECORDER = """import dataclasses, json, os, time

import pytest_llmperf.judge.paired as paired

_judged = paired.judged_pairs
OUT = os.environ["LLMPERF_BENCH_PAIRS"]


def judged_pairs(a_runs, b_runs, **kw):
    with open(OUT, "a") as fh:
        fh.write(json.dumps({"t": time.monotonic(), "n": len(a_runs),
                             "a": [dataclasses.asdict(r) for r in a_runs],
                             "b": [dataclasses.asdict(r) for r in b_runs]}) + "\\n")
    return _judged(a_runs, b_runs, **kw)


paired.judged_pairs = judged_pairs
if os.environ.get("LLMPERF_BENCH_ALL_PAIRS") == "1":
    paired.pairs_settled = lambda comparisons, *rest: None
"""
TEST_MODEL = """import pytest


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens})
def test_model():
    pass
"""


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def make_repo(
    root: Path, case: str, change: float, prompt_tokens: int, max_tokens: int, preset: str, prefill: float = 0.0
) -> str:
    """The test repository; returns the REF to judge against (``case`` "change": ``change`` of
    llama.cpp's time per token and ``prefill`` of the time to the first token on extra work)."""
    (root / "wrapper").mkdir(parents=True)
    (root / "tests").mkdir()
    keys = {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens}
    (root / "wrapper" / "__init__.py").write_text(wrapper_source(0.0))
    models: dict[str, str] = {}
    if case == "quant":
        import dataclasses

        from pytest_llmperf import ensure_model
        from pytest_llmperf.models.gguf import PRESETS

        spec = PRESETS[preset]
        models = {q: str(ensure_model(dataclasses.replace(spec, dtype=q))) for q in ("F16", "Q8_0")}
        (root / "pick").mkdir()
        (root / "pick" / "__init__.py").write_text(f"MODEL = {models['F16']!r}\n")
        (root / "tests" / "test_quant.py").write_text(TEST_QUANT.format(**keys))
    elif case in ("change", "aa"):
        (root / "tests" / "test_wrapper.py").write_text(TEST_WRAPPER.format(**keys))
    else:  # the unchanged tree and another llama-cpp-python: the plugin's own llama.cpp loop
        (root / "tests" / "test_model.py").write_text(TEST_MODEL.format(**keys))
    if case == "python":
        return ""
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    if case == "change":
        (root / "wrapper" / "__init__.py").write_text(wrapper_source(change, prefill))
        git(root, "commit", "-qam", f"+{change:.0%} work per token, +{prefill:.0%} before the first")
    elif case == "aa":
        git(root, "commit", "-q", "--allow-empty", "-m", "nothing changed")
    elif case == "quant":
        (root / "pick" / "__init__.py").write_text(f"MODEL = {models['Q8_0']!r}\n")
        git(root, "commit", "-qam", "Q8_0")
    return "git:HEAD" if case == "head" else "git:HEAD~1"


def old_venv(version: str) -> Path:
    """A virtualenv with llama-cpp-python ``version`` and what the plugin needs (built once)."""
    cache = Path(os.environ.get("LLMPERF_CACHE_DIR") or Path.home() / ".cache" / "llmperf")
    venv = cache / "venvs" / f"llama-cpp-python-{version}"
    python = venv / "bin" / "python"
    done = venv / ".llmperf-complete"
    if not done.exists():
        print(f"building {venv} (llama-cpp-python {version} compiles llama.cpp: minutes)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                f"llama-cpp-python=={version}",
                "pytest",
                "numpy",
                "scipy",
                "gguf",
                "platformdirs",
                "httpx",
            ],
            check=True,
        )
        done.write_text(version)
    return python


def pytest_command(model: str, out: Path, *more: str) -> list[str]:
    """One session of a test project's ``tests``: ``python -m pytest`` (this interpreter) on
    ``model``, its session file written to ``out``, then ``more`` options."""
    cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "--llmperf-model", model]
    return [*cmd, f"--llmperf-json={out}", *more]


def session(root: Path, ref: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = pytest_command(args.preset, out, "--llmperf-threads", str(args.threads), "--llmperf-against", ref)
    env = dict(os.environ)
    looks = out.with_suffix(".looks.jsonl")
    if args.record_pairs:
        (root.parent / "llmperf_bench_pairs.py").write_text(RECORDER)
        env["PYTHONPATH"] = os.pathsep.join([str(root.parent), *filter(None, [env.get("PYTHONPATH")])])
        env["LLMPERF_BENCH_PAIRS"] = str(looks)
        env["LLMPERF_BENCH_ALL_PAIRS"] = "1" if args.all_pairs else "0"
        cmd[5:5] = ["-p", "llmperf_bench_pairs"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=3600, check=False, env=env)
    if not out.exists():
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"session wrote no JSON (exit {proc.returncode})")
    doc = json.loads(out.read_text())
    doc["_exit"], doc["_wall_s"] = proc.returncode, time.monotonic() - started
    if args.record_pairs and looks.exists():
        record(args, looks, doc)
    if not doc["results"]:  # nothing measured: say why (the session's last lines)
        print(f"  session measured nothing (exit {proc.returncode}, {doc['_wall_s']:.0f} s):")
        print("    " + "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-25:]), flush=True)
    return doc


def record(args: argparse.Namespace, looks: Path, doc: dict) -> None:
    """Append the session's pairs to --record-pairs: its last look holds every pair (one test
    per session), with when each look came and the seconds the pairs took."""
    lines = [json.loads(line) for line in looks.read_text().splitlines()]
    if not lines:
        return
    row = {
        "case": args.case,
        "change": args.change,
        "preset": args.preset,
        "tokens": [args.prompt_tokens, args.max_tokens],
        "load": load(),
        "looks": [[x["n"], x["t"] - lines[0]["t"]] for x in lines],
        "pairs_s": [d["seconds"] for d in (doc.get("against") or {}).get("decisions") or []],
        "a": lines[-1]["a"],
        "b": lines[-1]["b"],
    }
    with args.record_pairs.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("change", "aa", "head", "python", "quant"), required=True)
    p.add_argument("--change", type=float, default=0.08)
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--preset", default="small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--old", default="0.3.30", help="llama-cpp-python of the python case's REF")
    p.add_argument("--jsonl", type=Path, help="append each session's row to this file (JSON lines)")
    p.add_argument("--record-pairs", type=Path, help="append each session's pairs, every run, to this file")
    p.add_argument("--all-pairs", action="store_true", help="with --record-pairs: take every pair up to the cap")
    p.add_argument(
        "--summary-of",
        type=Path,
        help="print the summary of a --jsonl file's sessions per case and change (sessions run one at a "
        "time, the cases alternating), and run nothing",
    )
    args = p.parse_args()
    if args.summary_of:
        summaries(args, args.summary_of)
        return 0
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    rows: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="llmperf-against-bench-") as tmp:
            root = Path(tmp) / "repo"
            ref = make_repo(root, args.case, args.change, args.prompt_tokens, args.max_tokens, args.preset)
            if args.case == "python":
                ref = f"python:{old_venv(args.old)}"
            change = f" (change {args.change:+.0%})" if args.case == "change" else ""
            print(
                f"case {args.case}{change}, REF {ref}, {args.preset} preset, threads "
                f"{args.threads}, pp{args.prompt_tokens} tg{args.max_tokens}, {'one core busy' if args.busy else 'no extra load'}; "
                f"load {load()}",
                flush=True,
            )
            for s in range(args.sessions):
                doc = session(root, ref, args, Path(tmp) / f"s{s}.json")
                for r in doc["results"]:
                    comps = {c["metric"]: c for c in (r.get("verdict") or {}).get("comparisons", [])}
                    if not comps:
                        print(f"  session {s + 1} {r['test']}: not compared: {(r.get('verdict') or {}).get('note')}")
                        continue
                    row = {"test": r["test"].split("::")[-1], "session": s + 1, **comps}
                    rows.append(row)
                    t, d = comps["ttft_ms"], comps["tpot_ms"]
                    tail = comps.get("itl_p95_ms")
                    shown = f", ITL p95 {tail['ratio']:.3f} {tail['verdict']}" if tail else ""
                    f = r.get("figures") or {}
                    if f.get("top1_agreement") is not None:
                        shown += (
                            f"; agreement top-1 {f['top1_agreement']:.4f}, KL mean {f['kl_mean']:.3g}, "
                            f"p99 {f['kl_p99']:.3g} ({f['agreement_positions']} positions), budget {r['budget']}"
                        )
                    # the pairs' seconds: the session file's against.decisions (absent before issue 37.3)
                    decisions = (doc.get("against") or {}).get("decisions") or []
                    spent = [d for d in decisions if d["test"] == r["test"]] or decisions[-1:]
                    row["pairs_s"] = spent[0]["seconds"] if spent else None
                    row["wall_s"], row["load"] = doc["_wall_s"], load()
                    if args.jsonl:
                        with args.jsonl.open("a") as fh:
                            fh.write(json.dumps({"case": args.case, "change": args.change, **row}) + "\n")
                    spent = "" if row["pairs_s"] is None else f" in {row['pairs_s']:.1f} s"
                    print(
                        f"  session {s + 1} {row['test']}: TTFT {t['ratio']:.3f} ({t['ci_low']:.3f}..{t['ci_high']:.3f}) "
                        f"{t['verdict']}, TPOT {d['ratio']:.3f} ({d['ci_low']:.3f}..{d['ci_high']:.3f}) {d['verdict']}{shown}, "
                        f"{d['n_candidate']} pairs{spent}; exit {doc['_exit']}, {doc['_wall_s']:.0f} s; load {row['load']}",
                        flush=True,
                    )
                against = doc.get("against") or {}
                if s == 0:
                    notes = {(r.get("verdict") or {}).get("note") for r in doc["results"]} - {None, ""}
                    print("\n".join(f"  {note}" for note in sorted(notes)), flush=True)
                    for name, side in (against.get("sides") or {}).items():
                        print(
                            f"  side {name}: Python {side.get('python')}, llama-cpp-python {side.get('llama_cpp')}, "
                            f"interpreter {side.get('interpreter') or side.get('executable') or '?'}",
                            flush=True,
                        )
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait()
    summary(args, rows)
    return 0


def summaries(args: argparse.Namespace, jsonl: Path) -> None:
    """``summary`` of each case (and change) of a ``--jsonl`` file's rows."""
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    for case, change in sorted({(r["case"], r["change"]) for r in rows}):
        mine = [r for r in rows if (r["case"], r["change"]) == (case, change)]
        label = f"change {change:+.0%}" if case == "change" else case
        summary(argparse.Namespace(**{**vars(args), "case": label}), mine)


def summary(args: argparse.Namespace, rows: list[dict]) -> None:
    for test in sorted({r["test"] for r in rows}):
        mine = [r for r in rows if r["test"] == test]
        n = len(mine)
        reg = {m: sum(r[m]["verdict"] == "REGRESSION" for r in mine) for m in ("ttft_ms", "tpot_ms")}
        found = sum(r["tpot_ms"]["ci_low"] > 1 for r in mine)
        below = sum(r["tpot_ms"]["ci_high"] < 1 for r in mine)
        med = {m: statistics.median(r[m]["ratio"] for r in mine) for m in ("ttft_ms", "tpot_ms")}
        sd = statistics.stdev(math.log(r["tpot_ms"]["ratio"]) for r in mine) if n > 1 else float("nan")
        counts = [r["tpot_ms"]["n_candidate"] for r in mine]
        walls = [r["wall_s"] for r in mine]
        spent = [r["pairs_s"] for r in mine if r.get("pairs_s") is not None]
        seconds = (
            f"; pairs' seconds per decision median {statistics.median(spent):.1f} ({min(spent):.1f}-{max(spent):.1f})"
            if spent
            else ""
        )
        loads = [float(r["load"].split()[0]) for r in mine]
        print(
            f"{args.case} {test} [{'one core busy' if args.busy else 'no extra load'}], {n} sessions: "
            f"decode REGRESSION {reg['tpot_ms']}/{n}, prefill REGRESSION {reg['ttft_ms']}/{n}, decode CI above 1 "
            f"{found}/{n}, below 1 {below}/{n}; median ratio TTFT {med['ttft_ms']:.3f}, TPOT {med['tpot_ms']:.3f} "
            f"(sd of log TPOT {sd:.3f}); pairs median {statistics.median(counts):g} ({min(counts)}-{max(counts)})"
            f"{seconds}; session wall median {statistics.median(walls):.0f} s ({min(walls):.0f}-{max(walls):.0f}); "
            f"1-min load {min(loads):.1f}-{max(loads):.1f}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
