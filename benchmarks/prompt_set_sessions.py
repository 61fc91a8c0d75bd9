"""A prompt set on the embedded default model, proven (issue 49 point 8): TTFT p95 moves with the
mix as the per-token prefill predicts, and ``--llmperf-against`` over a prompt set flags nothing
under A/A while it flags +8% per-token work.

``--part mix`` (in this process, the plugin's engine on the ``--preset`` model, 1 thread, one
context that holds the longest request): a set of literal prompts of ``--lengths`` tokens; the
fixed part and the per-token prefill (at the prompt's start, and its growth with the context:
attention reads every earlier token) are fitted from the median TTFT of the set's shortest, middle
and longest prompt sent alone (TTFT = fixed + n x per-token + n^2 x growth); each mix (the same requests, other weights) is the set drawn
``--runs`` times. The six cases (three fitting prompts, three mixes) run in turn, run by run, so a
change of the machine's load falls on all of them alike. Printed per mix: the predicted TTFT p95
(the p95 over the mix's drawn requests of the fit at their lengths) beside the
measured p95 (as ``Measurement.ttft_p95_ms``) and their ratio; the p95 predicted with the noise
one prompt carries (every drawn request's fitted TTFT times every
fitting run's TTFT over its prompt's median) and its ratio; the same for p50 (lengths only);
each mix's p95 relative to the first mix's, predicted and measured; then each fitting prompt's
p95/median alone.

``--part gate`` (separate pytest sessions, as a user runs the gate): a test repository
(two commits) whose test measures the user's wrapper around ``llmperf_llm`` over a prompt set
file with ``llmperf.measure(make_stream(llmperf_llm))``; the second commit is an empty commit
(A/A) or makes every ``llama_decode`` call of the wrapper's Llama spend ``--change`` of its own
time again (a spin after it: the prompt's batches and every generated token alike, so TTFT over
the set's varying lengths and decode both move by that share). Each session is one
``pytest --llmperf-against git:HEAD~1`` at the default threshold and processes, read back from
its ``--llmperf-json`` file (``benchmarks/gate_sessions.py``'s session, row and summary); the
cases alternate session by session. Printed per session: the TTFT and decode (TPOT) verdicts
and CIs, pairs, seconds; then per case the counts (REGRESSION k/n; flagged: a REGRESSION on
either) and seconds per decision.
``--mode baseline`` instead: per session, one session at the first commit with
``--llmperf-update-baselines`` (a fresh ``baselines/`` folder), then one at the second that
compares with it, as a gate on a stored baseline runs (unpaired: each side's runs over the whole
mix); "pairs" are then the compared session's runs, and the seconds per decision the compared
session's wall time plus the baseline session's ("start").

    .venv/bin/python benchmarks/prompt_set_sessions.py --part mix
    .venv/bin/python benchmarks/prompt_set_sessions.py --part gate --sessions 10 --max-tokens 16
    .venv/bin/python benchmarks/prompt_set_sessions.py --part gate --sessions 10 --max-tokens 16 --mode baseline
    .venv/bin/python benchmarks/prompt_set_sessions.py --part gate --sessions 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from against_sessions import git, load, pytest_command  # scripts beside this one
from gate_sessions import keep, row_of, summary
from gate_sessions import session as gate_session

from pytest_llmperf import Workload, ensure_model
from pytest_llmperf.core.settings import DEFAULT_MAX_PROCESSES, DEFAULT_MODEL, DEFAULT_THRESHOLD
from pytest_llmperf.core.workload import AUTO_CTX_STEP
from pytest_llmperf.engines import synthetic_text
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.measuring.metrics import run_metrics

#: The mixes of ``--part mix``: a weight per request, shortest first.
MIXES = {
    "short-heavy": (60.0, 30.0, 8.0, 1.5, 0.5),
    "middle": (5.0, 15.0, 30.0, 48.0, 2.0),
    "long-heavy": (1.0, 1.0, 2.0, 6.0, 90.0),
}

WRAPPER = """import time

import llama_cpp.llama_cpp as lib

#: Extra work per token: this share of each llama_decode call's own time (the prompt's batches
#: and every generated token's step), spent right after it.
EXTRA = {extra!r}
_decode = lib.llama_decode


def _slower(ctx, batch):
    began = time.perf_counter()
    rc = _decode(ctx, batch)
    lib.llama_synchronize(ctx)
    end = time.perf_counter() + EXTRA * (time.perf_counter() - began)
    while time.perf_counter() < end:
        pass
    return rc


def make_stream(llm):
    if EXTRA:
        lib.llama_decode = _slower  # what llama-cpp-python's Llama calls
    def stream(prompt, max_tokens):
        tokens = llm.tokenize(prompt.encode())
        llm.reset()
        for n, token in enumerate(llm.generate(tokens, temp=0.0), 1):
            yield token
            if n >= max_tokens:
                break
    return stream
"""
TEST = """import pytest
from wrapper import make_stream


@pytest.mark.llmperf(prompt_set="prompts.jsonl", max_tokens={max_tokens})
def test_my_traffic(llmperf, llmperf_llm):
    llmperf.measure(make_stream(llmperf_llm))
"""


def prompt_of(engine: LlamaCppEngine, n_tokens: int, seed: int) -> str:
    """Literal text that the model's tokenizer reads as about ``n_tokens`` tokens (BOS included)."""
    assert engine.llm is not None
    ids = engine.llm.tokenize(synthetic_text(n_tokens * 2, seed).encode(), add_bos=False)[: n_tokens - 1]
    return engine.llm.detokenize(ids).decode("utf-8", errors="ignore").strip()


def texts(engine: LlamaCppEngine, lengths: list[int]) -> list[str]:
    return [prompt_of(engine, n, seed) for seed, n in enumerate(lengths)]


def part_mix(args: argparse.Namespace) -> None:
    """The fit's two prompts and the mixes, run by run in turn (so the machine's load falls on
    all alike), on one context that holds the longest request (no context resized between them)."""
    probe = LlamaCppEngine(ensure_model(args.preset), threads=args.threads)
    try:
        prompts = texts(probe, args.lengths)
        sizes = [len(probe.prompt_ids(Workload(prompt=p, max_tokens=args.max_tokens))) for p in prompts]
    finally:
        probe.close()
    n_ctx = -(-(max(sizes) + args.max_tokens) // AUTO_CTX_STEP) * AUTO_CTX_STEP
    engine = LlamaCppEngine(ensure_model(args.preset), threads=args.threads, n_ctx=n_ctx)
    fitting = sorted({0, len(sizes) // 2, len(sizes) - 1})  # the shortest, a middle and the longest prompt
    cases = {f"fit {sizes[k]}": Workload(prompt=prompts[k], max_tokens=args.max_tokens) for k in fitting}
    for name, weights in MIXES.items():
        requests = [{"prompt": p, "weight": w} for p, w in zip(prompts, weights)]
        cases[name] = Workload(prompt_set=requests, max_tokens=args.max_tokens, runs=args.runs)
    print(
        f"{args.preset} preset, threads {args.threads}, n_ctx {n_ctx}, max_tokens {args.max_tokens}; set of {len(sizes)} "
        f"prompts of {', '.join(map(str, sizes))} tokens; {args.runs} runs of each case, in turn; load {load()}",
        flush=True,
    )
    ttft: dict[str, list[float]] = {name: [] for name in cases}
    tokens: dict[str, list[int | None]] = {name: [] for name in cases}
    try:
        for name, w in cases.items():  # warm-ups: each case's first request
            engine.run(w, -1)
        for i in range(args.runs):
            names = list(cases)
            for name in names[i % len(names) :] + names[: i % len(names)]:  # each case first in turn
                r = run_metrics(engine.run(cases[name], i))
                ttft[name].append(r.ttft_ms)
                tokens[name].append(r.prompt_tokens)
    finally:
        engine.close()
    lengths = [sizes[k] for k in fitting]
    medians = [statistics.median(ttft[f"fit {n}"]) for n in lengths]
    # The prefill per token grows with the position (attention reads every earlier token): TTFT =
    # fixed + n x (per-token prefill at the start) + n^2 x (its growth), through the fitting medians.
    growth_ms, per_token_ms, fixed_ms = (float(c) for c in np.polyfit(lengths, medians, 2))
    print(
        "fit: TTFT median "
        + ", ".join(f"{t:.2f} ms at {n} tokens" for n, t in zip(lengths, medians))
        + f" ({args.runs} runs each): per-token prefill {per_token_ms * 1000:.1f} us at the start, growing "
        f"{growth_ms * 2e3:.4f} us per token of context; fixed part {fixed_ms:.2f} ms; load {load()}",
        flush=True,
    )
    # The noise one prompt carries: each fitting run's TTFT over its prompt's median, every fitting prompt.
    noise = np.array([t / statistics.median(ttft[f"fit {n}"]) for n in lengths for t in ttft[f"fit {n}"]])
    first: tuple[float, float] | None = None
    for name, weights in MIXES.items():
        drawn = [sizes[prompts.index(cases[name].request(i).prompt or "")] for i in range(args.runs)]
        assert drawn == tokens[name]  # the engine ran the drawn requests
        model = np.array([fixed_ms + per_token_ms * n + growth_ms * n * n for n in drawn])
        predicted = {q: float(np.percentile(model, q)) for q in (50, 95)}
        noisy = float(np.percentile(np.outer(model, noise), 95))  # each drawn request under each run's noise
        got = {q: float(np.percentile(ttft[name], q)) for q in (50, 95)}  # as Measurement.ttft_p95_ms
        first = first or (predicted[95], got[95])
        print(
            f"  {name:<12} (weights {', '.join(f'{w:g}' for w in weights)}; {args.runs} runs, mean prompt "
            f"{statistics.mean(drawn):.0f} tokens): TTFT p95 predicted {predicted[95]:.2f} ms, measured {got[95]:.2f} "
            f"ms, measured/predicted {got[95] / predicted[95]:.3f}; with one prompt's noise predicted {noisy:.2f} ms, "
            f"measured/predicted {got[95] / noisy:.3f}; p50 {predicted[50]:.2f} vs {got[50]:.2f} ms "
            f"({got[50] / predicted[50]:.3f}); p95 vs {next(iter(MIXES))}'s: predicted x{predicted[95] / first[0]:.2f}, "
            f"measured x{got[95] / first[1]:.2f}",
            flush=True,
        )
    for n in lengths:
        spread = float(np.percentile(ttft[f"fit {n}"], 95)) / statistics.median(ttft[f"fit {n}"])
        print(f"  the {n}-token prompt alone: TTFT p95/median {spread:.3f} (the noise a p95 carries)")


def make_repo(root: Path, change: float, lengths: list[int], max_tokens: int, preset: str) -> None:
    """The test repository: the prompt set (even weights), the wrapper and its test; commit 2
    is empty (``change`` 0: A/A) or gives the wrapper ``change`` extra work per token."""
    (root / "wrapper").mkdir(parents=True)
    (root / "tests").mkdir()
    engine = LlamaCppEngine(ensure_model(preset), threads=1)
    try:
        lines = [json.dumps({"prompt": p}) for p in texts(engine, lengths)]
    finally:
        engine.close()
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (root / "wrapper" / "__init__.py").write_text(WRAPPER.format(extra=0.0))
    (root / "tests" / "test_traffic.py").write_text(TEST.format(max_tokens=max_tokens))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    if change:
        (root / "wrapper" / "__init__.py").write_text(WRAPPER.format(extra=change))
        git(root, "commit", "-qam", f"+{change:.0%} work per token")
    else:
        git(root, "commit", "-q", "--allow-empty", "-m", "nothing changed")


def baseline_session(root: Path, args: argparse.Namespace, out: Path, change: float, index: int) -> dict | None:
    """A stored baseline of the first commit, then a session of the second compared with it:
    the compared session's row (``gate_sessions.row_of``'s fields)."""
    shutil.rmtree(root / "baselines", ignore_errors=True)
    walls = []
    for ref, more in (("HEAD~1", ["--llmperf-update-baselines"]), ("main", [])):
        git(root, "checkout", "-q", ref)
        cmd = pytest_command(args.preset, out, "--llmperf-threads", str(args.threads), *more)
        cmd.append(f"--llmperf-threshold={args.threshold}")
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=3600, check=False)
        walls.append(time.monotonic() - started)
        if not out.exists():
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            raise SystemExit(f"session wrote no JSON (exit {proc.returncode})")
    doc = json.loads(out.read_text())
    doc["_exit"], doc["_wall_s"] = proc.returncode, sum(walls)
    row = row_of(doc, change, index)
    if row is not None:
        row.update(pairs=row["tpot"]["n_candidate"], pairs_s=walls[1], start_s=walls[0])
    return row


def part_gate(args: argparse.Namespace) -> None:
    changes = [0.0, args.change]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="llmperf-set-bench-") as tmp:
        roots = {c: Path(tmp) / f"repo-{c:g}" for c in changes}
        for c, root in roots.items():
            make_repo(root, c, args.gate_lengths, args.max_tokens, args.preset)
        gate = "--llmperf-against git:HEAD~1" if args.mode == "against" else "a stored baseline of HEAD~1"
        print(
            f"{gate} over a prompt set of {len(args.gate_lengths)} prompts (about "
            f"{', '.join(map(str, args.gate_lengths))} tokens, even weights), max_tokens {args.max_tokens}; threshold "
            f"{args.threshold:.0%}, max_processes {args.max_processes}, {args.preset} preset, threads {args.threads}; "
            f"cases A/A and {args.change:+.0%} per token; load {load()}; pid {os.getpid()}",
            flush=True,
        )
        for s in range(args.sessions):
            for change in changes:
                out = Path(tmp) / f"s-{change:g}-{s}.json"
                if args.mode == "baseline":
                    row = baseline_session(roots[change], args, out, change, s + 1)
                else:
                    row = row_of(gate_session(roots[change], args, out), change, s + 1)
                if row is None:
                    print(f"  {change:+.0%} session {s + 1}: nothing compared", flush=True)
                    continue
                keep(row, rows, args.jsonl)
    summary(rows, args.threshold)
    flagged(rows)


def flagged(rows: list[dict]) -> None:
    """Per case, the sessions the gate failed: a REGRESSION on TTFT or decode (the gate stops at
    its first decided REGRESSION, so the other metric may stay INCONCLUSIVE)."""
    for change in sorted({r["change"] for r in rows}):
        mine = [r for r in rows if r["change"] == change]
        k = sum("REGRESSION" in (r["tpot"]["verdict"], (r["ttft"] or {}).get("verdict")) for r in mine)
        print(f"{'A/A' if change == 0 else f'{change:+.0%} per token'}: flagged (a REGRESSION) {k}/{len(mine)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("mix", "gate"), required=True)
    p.add_argument("--preset", default=DEFAULT_MODEL)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 128, 256, 512])
    p.add_argument("--runs", type=int, default=200, help="runs of each fitting prompt and each mix (--part mix)")
    p.add_argument("--sessions", type=int, default=10, help="sessions per case (--part gate)")
    p.add_argument("--change", type=float, default=0.08)
    p.add_argument("--mode", choices=("against", "baseline"), default="against", help="the gate (--part gate)")
    p.add_argument(
        "--gate-lengths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[16, 48, 96, 160, 224],
        help="the gate's prompts' tokens (with --max-tokens within llmperf_llm's context)",
    )
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    p.add_argument("--max-processes", type=int, default=DEFAULT_MAX_PROCESSES)
    p.add_argument("--jsonl", type=Path, help="append each gate session's row to this file")
    p.add_argument("--summary-of", type=Path, help="print the summary of a --jsonl file and run nothing")
    args = p.parse_args()
    if args.summary_of:
        rows = [json.loads(x) for x in args.summary_of.read_text().splitlines() if x.strip()]
        summary(rows, args.threshold)
        flagged(rows)
        return 0
    if args.part == "mix":
        part_mix(args)
    else:
        part_gate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
