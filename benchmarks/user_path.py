"""Your code, measured as truly as ours (issue 46 points 8 and 9), as separate pytest sessions.

Three things, each printed as figures:

1. **Known causes named** (``--sessions N``): each session is one ``python -m pytest`` process
   (a temporary project outside the checkout, the ``small`` preset: 134 M parameters, F16) with
   one test per case; each test compares the user's code before (A) and after (B) a change with
   ``llmperf.compare`` (an interleaved A/B of two callables), and the ``--llmperf-against
   git:HEAD~1`` cases run the same change as a commit in a temporary git repository. A case is
   *named* in a session when the part the change touches moved (in a phase whose headline
   moved) and is the largest part that moved in its phase; the prompt case also needs
   ``prompt tokens A -> B`` in its why line. In the A/A cases (the same code on both sides) any
   part that moved counts. Cases, each a kind of change users make in their own code:

   - ``prompt``: the wrapper prepends a ~150-token system prompt to a ~140-token one -> llama.cpp
     prompt eval;
   - ``sampling``: the wrapper passes a grammar -> sampling (llama.cpp: grammar);
   - ``python``: the wrapper does ~0.6 ms of Python work per token -> outside llama.cpp;
   - ``processor``: a Python logits processor of ~0.6 ms -> logits processors (Python);
   - ``own-llama``: the test's own Llama, threads 2 -> 1 -> llama.cpp eval;
   - ``chat``: a chat helper (``create_chat_completion``) that sends the conversation's earlier
     turns -> llama.cpp prompt eval;
   - ``engine``: the own Llama's n_batch 512 -> 16 under a ~400-token prompt -> llama.cpp prompt eval;
   - ``aa``: the same wrapper on both sides; ``against-prompt``, ``against-python``,
     ``against-aa``: through ``--llmperf-against git:HEAD~1``.

2. **Cold TTFT** (``--ttft-sessions N``): in one session per sample, with ``--llmperf-in-process``
   (so the marker's engine and ``llmperf_llm`` are one Llama), the marker-only TTFT of a
   ~140-token prompt and a streaming wrapper's TTFT of the same prompt on that Llama; printed:
   each ratio and their median (goal: within 10%).

3. **Cost** (``--cost-runs N``): without pytest, a streaming wrapper on one Llama measured with
   the plugin's watch (``LlamaWatch``: cleared, instrumented) and without it, run by run
   alternating; printed: the median TPOT of each and their ratio, with the run count.

    PYTHONPATH=$PWD nice -n 5 .venv/bin/python benchmarks/user_path.py --sessions 10 --ttft-sessions 10
    PYTHONPATH=$PWD .venv/bin/python benchmarks/user_path.py --quick     # one session of each
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
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent

#: What each case must name: the part (catalog name) that moved, its phase.
EXPECTED = {
    "prompt": ("native_prefill_ms", "prefill"),
    "sampling": ("sampling_ms_per_token", "decode"),
    "python": ("decode_outside_ms_per_token", "decode"),
    "processor": ("python_sampling_ms_per_token", "decode"),
    "own-llama": ("native_decode_ms_per_token", "decode"),
    "chat": ("native_prefill_ms", "prefill"),
    "engine": ("native_prefill_ms", "prefill"),
    "aa": (None, None),
    "against-prompt": ("native_prefill_ms", "prefill"),
    "against-python": ("decode_outside_ms_per_token", "decode"),
    "against-aa": (None, None),
}

COMMON = """
import os, time
import llama_cpp
import pytest
from pytest_llmperf import ensure_model

PROMPT = "Summarize the following note for a colleague. " + "The build failed twice on the runner. " * 8
SYSTEM = "You are a careful assistant who answers in short plain sentences. " * 6
W = dict(prompt=PROMPT, max_tokens=32, runs=20, warmup=2)


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def wrapper(llm, system="", grammar=None, per_token_ms=0.0, processor_ms=0.0):
    processors = llama_cpp.LogitsProcessorList([lambda ids, s: (spin(processor_ms), s)[1]]) if processor_ms else None

    def fn(prompt, max_tokens):
        for chunk in llm.create_completion(system + prompt, max_tokens=max_tokens, stream=True, temperature=0.0,
                                           grammar=grammar, logits_processor=processors):
            spin(per_token_ms)
            yield chunk
    return fn


def chat(llm, turns):
    history = [{"role": "user", "content": "What failed?"}, {"role": "assistant", "content": "The build, twice."}]
    def fn(prompt, max_tokens):
        messages = history * turns + [{"role": "user", "content": prompt}]
        yield from llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True, temperature=0.0)
    return fn


def own(**settings):
    return llama_cpp.Llama(model_path=str(ensure_model("small")), verbose=False, **settings)
"""

AB_TESTS = (
    COMMON
    + """

def test_prompt(llmperf, llmperf_llm):
    llmperf.compare(a=wrapper(llmperf_llm), b=wrapper(llmperf_llm, system=SYSTEM), label="prompt", **W)


def test_sampling(llmperf, llmperf_llm):
    grammar = llama_cpp.LlamaGrammar.from_string("root ::= [a-z ,.]+", verbose=False)
    llmperf.compare(a=wrapper(llmperf_llm), b=wrapper(llmperf_llm, grammar=grammar), label="sampling", **W)


def test_python(llmperf, llmperf_llm):
    llmperf.compare(a=wrapper(llmperf_llm), b=wrapper(llmperf_llm, per_token_ms=0.6), label="python", **W)


def test_processor(llmperf, llmperf_llm):
    llmperf.compare(a=wrapper(llmperf_llm), b=wrapper(llmperf_llm, processor_ms=0.6), label="processor", **W)


def test_own_llama(llmperf):
    a, b = own(n_ctx=512, n_threads=2), own(n_ctx=512, n_threads=1)
    llmperf.compare(a=wrapper(a), b=wrapper(b), label="own-llama", **W)


def test_chat(llmperf, llmperf_llm):
    llmperf.compare(a=chat(llmperf_llm, 0), b=chat(llmperf_llm, 6), label="chat", **W)


def test_engine(llmperf):
    a, b = own(n_ctx=1024, n_batch=512, n_threads=2), own(n_ctx=1024, n_batch=16, n_threads=2)
    long = dict(W, prompt=PROMPT * 2)
    llmperf.compare(a=wrapper(a), b=wrapper(b), label="engine", **long)


def test_aa(llmperf, llmperf_llm):
    llmperf.compare(a=wrapper(llmperf_llm), b=wrapper(llmperf_llm), label="aa", **W)
"""
)

AGAINST_TEST = (
    COMMON
    + """
from wrap import SYSTEM_HERE, PER_TOKEN_MS


@pytest.mark.llmperf(**W)
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(wrapper(llmperf_llm, system=SYSTEM if SYSTEM_HERE else "", per_token_ms=PER_TOKEN_MS))
"""
)

TTFT_TEST = (
    COMMON
    + """

@pytest.mark.llmperf(prompt=PROMPT, max_tokens=8, runs=10, warmup=2)
def test_marker_only():
    pass


@pytest.mark.llmperf(prompt=PROMPT, max_tokens=8, runs=10, warmup=2)
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(wrapper(llmperf_llm))
"""
)


def _env() -> dict[str, str]:
    env = dict(os.environ, LLMPERF_MODEL="small", PYTHONPATH=str(CHECKOUT))
    env.pop("LLMPERF_AGAINST", None)
    return env


def _pytest(folder: Path, *args: str) -> dict[str, Any]:
    out = folder / "session.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--llmperf-n-ctx", "1024"]
    cmd += ["--llmperf-json", str(out), *args]
    done = subprocess.run(cmd, cwd=folder, env=_env(), capture_output=True, text=True, timeout=3600, check=False)
    if not out.exists():
        raise SystemExit(f"session in {folder} wrote no JSON (rc {done.returncode}):\n{done.stdout[-3000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _named(case: str, parts: list[dict[str, Any]], why: list[str]) -> tuple[bool, bool]:
    """(named, any part moved): the case's part moved and is its phase's largest moved part."""
    moved = [p for p in parts if p.get("moved")]
    want, phase = EXPECTED[case]
    if want is None:
        named = not moved
    else:
        mine = sorted((p for p in moved if p["phase"] == phase), key=lambda p: -abs(p["delta"]))
        named = bool(mine) and mine[0]["metric"] == want
        if case.endswith("prompt"):
            named = named and any("prompt tokens" in line for line in why)
    said = "" if named else f"; why: {' | '.join(why) or '(no phase moved)'}"  # what it said instead
    print(
        f"    {case}: {'named' if named else 'NOT named'}, {'a part' if moved else 'no part'} moved{said}", flush=True
    )
    return named, bool(moved)


def ab_sessions(n: int, cases: set[str]) -> dict[str, list[tuple[bool, bool]]]:
    seen: dict[str, list[tuple[bool, bool]]] = {}
    with tempfile.TemporaryDirectory(prefix="llmperf-user-ab-") as tmp:
        folder = Path(tmp)
        (folder / "test_user_ab.py").write_text(AB_TESTS)
        wanted = [c for c in EXPECTED if c in cases and not c.startswith("against")]
        select = " or ".join(f"test_{c.replace('-', '_')}" for c in wanted)
        for i in range(n):
            started = time.monotonic()
            data = _pytest(folder, "-k", select)
            for entry in data.get("ab") or []:
                case = entry.get("label")
                if case in wanted:
                    seen.setdefault(case, []).append(_named(case, entry.get("parts") or [], entry.get("why") or []))
            print(f"  A/B session {i + 1}/{n}: {time.monotonic() - started:.0f} s", flush=True)
    return seen


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)


def against_sessions(n: int, cases: set[str]) -> dict[str, list[tuple[bool, bool]]]:
    changes = {"against-prompt": (True, 0.0), "against-python": (False, 0.6), "against-aa": (False, 0.0)}
    seen: dict[str, list[tuple[bool, bool]]] = {}
    for case, (system, per_token_ms) in changes.items():
        if case not in cases:
            continue
        with tempfile.TemporaryDirectory(prefix="llmperf-user-against-") as tmp:
            repo = Path(tmp)
            (repo / "test_wrapper.py").write_text(AGAINST_TEST)
            (repo / "wrap.py").write_text("SYSTEM_HERE = False\nPER_TOKEN_MS = 0.0\n")
            _git(repo, "init", "-q")
            _git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "add", ".")
            _git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "before")
            (repo / "wrap.py").write_text(f"SYSTEM_HERE = {system}\nPER_TOKEN_MS = {per_token_ms}\n")
            _git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qam", "after", "--allow-empty")
            for i in range(n):
                started = time.monotonic()
                data = _pytest(repo, "--llmperf-against", "git:HEAD~1")
                for r in data.get("results") or []:
                    v = r.get("verdict") or {}
                    why = [f"{c}" for c in v.get("changes") or []]
                    seen.setdefault(case, []).append(_named(case, v.get("parts") or [], why))
                print(f"  {case} session {i + 1}/{n}: {time.monotonic() - started:.0f} s", flush=True)
    return seen


def ttft_sessions(n: int) -> list[tuple[float, float]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="llmperf-user-ttft-") as tmp:
        folder = Path(tmp)
        (folder / "test_ttft.py").write_text(TTFT_TEST)
        for _ in range(n):
            data = _pytest(folder, "--llmperf-in-process")
            ttft = {r["test"].split("::")[1]: r["figures"]["ttft_ms"] for r in data["results"]}
            out.append((ttft["test_marker_only"], ttft["test_wrapper"]))
            print(
                f"  TTFT session {len(out)}/{n}: marker-only {out[-1][0]:.1f} ms, wrapper {out[-1][1]:.1f} ms",
                flush=True,
            )
    return out


def cost(runs: int) -> tuple[float, float, int]:
    """Median TPOT (ms) of a streaming wrapper measured with the watch and without, alternating."""
    import llama_cpp

    from pytest_llmperf import Workload, ensure_model
    from pytest_llmperf.engines import CallableEngine
    from pytest_llmperf.engines.user_llama import LlamaWatch
    from pytest_llmperf.measuring.metrics import run_metrics

    llm = llama_cpp.Llama(model_path=str(ensure_model("small")), n_ctx=512, n_threads=2, verbose=False)

    def fn(prompt: str, max_tokens: int):
        for i, token in enumerate(llm.generate(llm.tokenize(prompt.encode()), temp=0.0)):
            yield token
            if i + 1 >= max_tokens:
                return

    w = Workload(prompt="The build failed twice on the runner. " * 4, max_tokens=64)
    watched, plain = CallableEngine(fn, watch=LlamaWatch()), CallableEngine(fn)
    tpot: dict[str, list[float]] = {"watched": [], "plain": []}
    for i in range(runs + 2):
        for name, engine in (
            (("watched", watched), ("plain", plain)) if i % 2 else (("plain", plain), ("watched", watched))
        ):
            m = run_metrics(engine.run(w, i))
            if i >= 2:
                tpot[name].append(m.tpot_ms)
    return statistics.median(tpot["watched"]), statistics.median(tpot["plain"]), runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--against-sessions", type=int, default=None, help="default: --sessions")
    ap.add_argument("--ttft-sessions", type=int, default=10)
    ap.add_argument("--cost-runs", type=int, default=40)
    ap.add_argument("--cases", default=",".join(EXPECTED))
    ap.add_argument("--quick", action="store_true", help="one session of each, 10 cost runs")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.ttft_sessions, args.cost_runs = 1, 1, 10
    cases = set(args.cases.split(","))
    print(f"llama-cpp-python {__import__('llama_cpp').__version__}, small preset, {os.cpu_count()} CPUs")
    seen = ab_sessions(args.sessions, cases)
    seen.update(against_sessions(args.against_sessions or args.sessions, cases))
    print("\ncase              expected part                     named  any part moved  sessions")
    for case, rows in seen.items():
        want = EXPECTED[case][0] or "(A/A: none)"
        named = sum(1 for n, _ in rows if n)
        moved = sum(1 for _, m in rows if m)
        print(f"{case:<17} {want:<33} {named:>5}  {moved:>14}  {len(rows):>8}")
    if args.ttft_sessions:
        pairs = ttft_sessions(args.ttft_sessions)
        ratios = [w / m for m, w in pairs]
        print(
            f"\ncold wrapper TTFT / marker-only TTFT, same prompt, same Llama: median {statistics.median(ratios):.3f} "
            f"over {len(ratios)} sessions ({', '.join(f'{r:.3f}' for r in ratios)}); marker-only median "
            f"{statistics.median(m for m, _ in pairs):.1f} ms"
        )
    if args.cost_runs:
        watched, plain, runs = cost(args.cost_runs)
        print(
            f"\nthe watch's cost: median TPOT {watched:.3f} ms watched vs {plain:.3f} ms plain, ratio "
            f"{watched / plain:.4f} ({runs} runs each, alternating)"
        )


if __name__ == "__main__":
    main()
