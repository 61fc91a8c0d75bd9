"""A/A sessions on a busy machine against a baseline recorded on a quieter one (issue 33 point 2):
what the gate says when other processes hold the cores, and whether a real change still shows.

A small project is made in a temporary folder: one test that streams tokens from the
plugin's ``llmperf_llm`` through a user's wrapper (``wrapper.make_stream``) which, when
``LLMPERF_BENCH_EXTRA`` is set (0.25 = +25%), spends that share of llama.cpp's time per token on
extra work after each token (a spin on the clock): a real +25% change of the code around
llama.cpp. The baseline is recorded once with no spinner; then, with a history kept
(``--llmperf-history``), the script runs separate pytest sessions:

- ``busy1``: A/A with one busy process (a spinner on one core),
- ``busy2``: A/A with one busy process per core,
- ``change``: the +25% change with one busy process per core,
- ``spin``: a fixed change of the wrapper's own code (``--spin-ms`` of spinning per token,
  ``LLMPERF_BENCH_SPIN_MS``) with one busy process: a slowdown outside llama.cpp beyond what the
  machine explains, which keeps its REGRESSION (``judge.parts.beyond_the_machine``; the line
  "REGRESSION on a busy machine" is counted).

Spinners are started and stopped by the script. Per case it prints the verdicts (per test:
REGRESSION / MACHINE_SLOWER / INCONCLUSIVE / UNCHANGED / IMPROVED), how often each machine
signal named in the verdict fired, the median TPOT ratio, and where the noise estimate came
from (prior, baseline or the history window, with its sessions).

    .venv/bin/python benchmarks/busy_sessions.py --sessions 20
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

WRAPPER = """import os
import time

#: Extra work per token, as a share of the time llama.cpp took for that token.
EXTRA = float(os.environ.get("LLMPERF_BENCH_EXTRA", "0") or 0)
#: Extra work per token, fixed (ms).
SPIN_S = float(os.environ.get("LLMPERF_BENCH_SPIN_MS", "0") or 0) / 1000


def make_stream(llm):
    def stream(prompt, max_tokens):
        tokens = llm.tokenize(prompt.encode())
        llm.reset()
        last = time.perf_counter()
        for n, token in enumerate(llm.generate(tokens, temp=0.0), 1):
            now = time.perf_counter()
            if (EXTRA or SPIN_S) and n > 1:
                end = now + EXTRA * (now - last) + SPIN_S
                while time.perf_counter() < end:
                    pass
            yield token
            if n >= max_tokens:
                break
            last = time.perf_counter()
    return stream
"""

TEST = """import pytest
from wrapper import make_stream


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}, runs={runs})
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(make_stream(llmperf_llm))
"""

SIGNALS = {
    "run queue": "waited for a CPU",
    "others' CPU": "other processes used",
    "context switches": "involuntary context switches",
    "steal": "steal;",
}


def spin() -> None:  # pragma: no cover - a busy neighbour
    while True:
        pass


def session(root: Path, history: Path, extra: float, out: Path, *args: str, spin_ms: float = 0.0) -> dict:
    env = dict(os.environ, LLMPERF_BENCH_EXTRA=str(extra), LLMPERF_BENCH_SPIN_MS=str(spin_ms), PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={root}", str(root / "tests")]
    cmd += ["--llmperf-history", str(history), "--llmperf-json", str(out), *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if not out.is_file():
        raise SystemExit(f"session failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    data["_seconds"] = time.monotonic() - started
    return data


def summary(name: str, sessions: list[dict]) -> None:
    shorts: Counter[str] = Counter()
    signals: Counter[str] = Counter()
    kept = 0  # REGRESSIONs a busy machine did not explain (their note's line)
    sources: Counter[str] = Counter()
    ratios, runs = [], []
    for s in sessions:
        for r in s["results"]:
            v = r.get("verdict") or {}
            shorts[v.get("short") or v.get("status", "?")] += 1
            machine = v.get("machine") or ""
            kept += "REGRESSION on a busy machine" in (v.get("note") or "")
            for label, phrase in SIGNALS.items():
                signals[label] += phrase in machine
            for c in v.get("comparisons", []):
                if c["metric"] == "tpot_ms":
                    ratios.append(c["ratio"])
                    sources[f"{c['noise_source']} ({c['noise_sessions']})"] += 1
            runs.append(len((r.get("record") or {}).get("runs", {}).get("tpot_ms", [])))
    n = len(sessions)
    print(f"\n{name}: {n} sessions, median {statistics.median(s['_seconds'] for s in sessions):.0f} s each")
    print("  verdicts:", ", ".join(f"{k} {v}" for k, v in shorts.most_common()))
    print("  signals in the verdict:", ", ".join(f"{k} {v}/{n}" for k, v in signals.items()))
    print(f"  REGRESSION kept on a busy machine (beyond what it explains): {kept}/{n}")
    if ratios:
        print(f"  TPOT ratio: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}..{max(ratios):.3f}")
    print("  noise source:", ", ".join(f"{k} x{v}" for k, v in sources.items()))
    print(f"  runs per measurement: median {statistics.median(runs) if runs else 0}, max {max(runs, default=0)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--change", type=float, default=0.25)
    ap.add_argument("--spin-ms", type=float, default=0.2)
    ap.add_argument("--cases", default="busy1,busy2,change")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmperf-busy-") as tmp:
        root = Path(tmp)
        (root / "wrapper").mkdir()
        (root / "wrapper" / "__init__.py").write_text(WRAPPER)
        (root / "tests").mkdir()
        (root / "tests" / "test_wrapper.py").write_text(
            TEST.format(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.runs)
        )
        history = root / "history.sqlite"
        print(f"load before the baseline: {os.getloadavg()[0]:.1f}")
        session(root, history, 0.0, root / "base.json", "--llmperf-update-baselines")
        cpus = os.cpu_count() or 2
        cases = {
            "busy1": (1, 0.0, 0.0),
            "busy2": (cpus, 0.0, 0.0),
            "change": (cpus, args.change, 0.0),
            "spin": (1, 0.0, args.spin_ms),
        }
        for name in args.cases.split(","):
            spinners, extra, spin_ms = cases[name]
            procs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(spinners)]
            for p in procs:
                p.start()
            try:
                done = []
                for i in range(args.sessions):
                    done.append(session(root, history, extra, root / f"{name}-{i}.json", spin_ms=spin_ms))
                    print(f"  {name} {i + 1}/{args.sessions}: load {os.getloadavg()[0]:.1f}", flush=True)
            finally:
                for p in procs:
                    p.terminate()
                    p.join()
            change = f"+{spin_ms:g} ms/token" if spin_ms else f"{extra:+.0%}"
            summary(f"{name} ({spinners} busy process(es), change {change})", done)


if __name__ == "__main__":
    main()
