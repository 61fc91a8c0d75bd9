"""Say why, proven on real changes (issue 36 point 5): does each comparison name the known cause?

Each case is a small test project written into a temporary folder (outside the checkout) and
run as separate pytest sessions (``python -m pytest`` subprocesses, one per session) with
``--llmperf-json``; the parts of each phase (the verdict's ``parts``, an A/B entry's
``parts``) and the attribution pass (``attribution``: per layer and per op type) are read back
from that file. Cases:

- ``a``: a user's wrapper around ``llmperf_llm`` does ~8% more work per token (a spin on the
  clock, ``benchmarks/against_sessions.py``'s wrapper), ``--llmperf-against git:HEAD~1`` in a
  temp git repository: the cause is outside llama.cpp (``decode_outside_ms_per_token``);
- ``b``: F16 -> Q8_0 of the same weights (small preset), in-process A/B: llama.cpp's eval
  (``native_decode_ms_per_token``), MUL_MAT in the attribution;
- ``c``: threads 2 -> 1, in-process A/B: llama.cpp's eval, "uniform" across layers;
- ``d``: flash attention on -> off (tiny preset, a 1024-token prompt, so attention weighs),
  in-process A/B: llama.cpp's prompt eval (``native_prefill_ms``), attention ops;
- ``e``: another llama-cpp-python through ``--llmperf-against python:PATH`` (an older release in
  a second environment, ``--old-python``): no cause is known beforehand; whatever moved is
  printed beside llama-bench's pp and tg ratios of the same two builds (``--old-llama-bench``);
- ``f-client``: llama-server on both sides, side B's client spends 20 ms more on each request
  before sending it (a transport that spins): outside llama.cpp in prefill
  (``prefill_outside_ms``), the server's own prompt time unchanged;
- ``f-server``: two llama-servers, threads 2 (A) and 1 (B), one client each: the server's
  own eval (``native_decode_ms_per_token``, from llama-server's ``timings``);
- A/A (the same code or settings on both sides; ``aa`` selects them all): ``aa-against`` (an
  empty commit, case a's test), ``aa-ab`` (case c's test with 1 thread on both sides),
  ``aa-served`` (one llama-server, two plain clients), ``aa-python`` (``python:`` this
  interpreter).

Per session: the parts that moved (``moved``: Holm-corrected) in the phases whose headline moved
(REGRESSION/IMPROVED against REF; for an A/B, the headline's CI excluding 1) are "flagged". The
named cause is met when the case's part is flagged and is the largest flagged part of its phase
(by the size of its change, in the phase's unit); where the case names one, the attribution of
that phase must agree too (b: matrix multiplication, c: uniform across layers, d: an attention
op: the reading or a moved op or group names it), counted in a column of its own. The table
also counts the sessions where the cause's part moved whether or not its headline did (a part
is compared without the noise of the other parts, so it can be seen first). In A/A, any part
whose ``moved`` is true, in any phase, counts as flagged.

    PYTHONPATH=$PWD nice -n 5 .venv/bin/python benchmarks/why_cases.py --sessions 10
    PYTHONPATH=$PWD .venv/bin/python benchmarks/why_cases.py --cases a,aa-against --sessions 3
    PYTHONPATH=$PWD .venv/bin/python benchmarks/why_cases.py --quick   # one short session per case
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
#: The moved verdicts of a comparison against REF (judge/verdict.py Verdict values).
MOVED_VERDICTS = ("REGRESSION", "IMPROVED")
#: Which headline metric each phase's parts explain (core/catalog.py ``part_of``).
HEADLINE = {"prefill": "ttft_ms", "decode": "tpot_ms"}
#: The attribution's names of matrix multiplication: its group, and llama.cpp's op type.
MATMUL_OPS = ("matrix multiplication", "MUL_MAT")
#: The attribution's names of attention: its group, and llama.cpp's op types (flash attention
#: fuses K x Q, softmax and x V into one).
ATTENTION_OPS = ("attention", "FLASH_ATTN_EXT", "SOFT_MAX")
#: Case f-client: side B's client work per request, before the request is sent (ms).
CLIENT_MS = 20.0


@dataclass(frozen=True)
class Case:
    """One change (or an A/A) and what a comparison of it must name."""

    name: str
    title: str
    how: str  # "against" (--llmperf-against) or "ab" (llmperf.compare in the test)
    cause: str | None = None  # the catalog part that must be named; None: A/A or unknown (e)
    attribution: tuple[str, ...] = ()  # words of which one must be in the cause phase's attribution
    aa: bool = False
    model: str = "small"
    prompt_tokens: int = 32
    max_tokens: int = 32

    @property
    def phase(self) -> str | None:
        return None if self.cause is None else PART_PHASE[self.cause]


#: The parts of each phase (core/catalog.py PARTS), for a reader without the package.
PART_PHASE = {
    "tokenize_ms": "prefill",
    "native_prefill_ms": "prefill",
    "prefill_outside_ms": "prefill",
    "native_decode_ms_per_token": "decode",
    "sampling_ms_per_token": "decode",
    "decode_outside_ms_per_token": "decode",
}

CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case("a", "wrapper +8% work per token (git:HEAD~1)", "against", "decode_outside_ms_per_token"),
        Case("b", "F16 -> Q8_0 (A/B)", "ab", "native_decode_ms_per_token", MATMUL_OPS),
        # small: its matrix multiplications carry a token's time in every layer, so a thread
        # count moves every layer alike; on the tiny preset the attribution's per-node
        # synchronisation outweighs them, and 1 thread is faster at the small ops (no barrier).
        Case("c", "threads 2 -> 1 (A/B)", "ab", "native_decode_ms_per_token", ("uniform",)),
        Case(
            "d",
            "flash attention on -> off (A/B)",
            "ab",
            "native_prefill_ms",
            ATTENTION_OPS,
            model="tiny",
            prompt_tokens=1024,
        ),
        Case("e", "older llama-cpp-python (python:PATH)", "against"),
        # served on the small preset: the tiny one's byte tokens reach the client in one event
        # (llama-server holds back incomplete UTF-8), leaving no token gaps to measure
        # (and a random model's run of byte tokens can still leave 16 tokens with no event at all)
        Case("f-client", "served: client +20 ms per request (A/B)", "ab", "prefill_outside_ms"),
        Case("f-server", "served: server threads 2 -> 1 (A/B)", "ab", "native_decode_ms_per_token"),
        Case("aa-against", "A/A: empty commit (git:HEAD~1)", "against", aa=True),
        Case("aa-ab", "A/A: threads 1 both sides (A/B)", "ab", aa=True),
        Case("aa-served", "A/A: one llama-server, two clients", "ab", aa=True),
        Case("aa-python", "A/A: python:this interpreter", "against", aa=True),
    )
}
GROUPS = {"aa": [n for n in CASES if n.startswith("aa-")], "f": ["f-client", "f-server"]}


# --- reading a session file -----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One comparison of a session: a test's verdict against REF, or an A/B entry."""

    test: str
    moved_phases: tuple[str, ...]  # phases whose headline moved
    headline: Mapping[str, float]  # ratio B/A (this tree / REF) of ttft_ms and tpot_ms
    parts: tuple[Mapping[str, Any], ...]
    attribution: Mapping[str, Any] | None
    pairs: int
    why: tuple[str, ...] = ()  # the plugin's own lines: each moved phase's parts


def _headline_moved(c: Mapping[str, Any]) -> bool:
    if "verdict" in c:
        return c["verdict"] in MOVED_VERDICTS
    return bool(c["ci_low"] > 1.0 or c["ci_high"] < 1.0)


def _entry(test: str, comparisons: Sequence[Mapping[str, Any]], holder: Mapping[str, Any]) -> Entry:
    by = {c["metric"]: c for c in comparisons}
    moved = tuple(p for p, m in HEADLINE.items() if m in by and _headline_moved(by[m]))
    pairs = max((int(c.get("n_candidate") or c.get("n_pairs") or 0) for c in comparisons), default=0)
    return Entry(
        test=test,
        moved_phases=moved,
        headline={m: float(by[m]["ratio"]) for m in HEADLINE.values() if m in by},
        parts=tuple(holder.get("parts") or ()),
        attribution=holder.get("attribution"),
        pairs=pairs,
        why=tuple(holder.get("why") or ()),
    )


def entries(doc: Mapping[str, Any]) -> list[Entry]:
    """The comparisons of a ``--llmperf-json`` document: each result's verdict against REF (with
    its ``parts`` and ``attribution``) and each A/B entry (top-level ``ab``)."""
    out = []
    for r in doc.get("results") or ():
        verdict = r.get("verdict") or {}
        comparisons = [c for c in verdict.get("comparisons") or () if c.get("reference")]
        if comparisons:
            out.append(_entry(r["test"], comparisons, verdict))
    for e in doc.get("ab") or ():
        if e.get("comparisons"):
            out.append(_entry(e.get("test") or e.get("label") or "ab", e["comparisons"], e))
    return out


# --- classifying one comparison --------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one comparison flagged, and whether it named the case's cause."""

    flagged: tuple[str, ...]  # parts moved in a phase whose headline moved
    any_moved: tuple[str, ...]  # parts moved in any phase
    largest: Mapping[str, str]  # phase -> its flagged part with the largest change
    named: bool | None  # the cause is the largest flagged part of its phase; None: no cause named
    others: tuple[str, ...]  # flagged parts of the cause's phase other than the cause
    attribution: str  # the cause phase's attribution reading ("" when none ran)
    attribution_ok: bool | None  # None: the case asks nothing of the attribution
    pairs: int


def _size(part: Mapping[str, Any]) -> float:
    """A part's change in its phase's unit (ms or ms/token): B's median - A's."""
    delta = part.get("delta")
    if delta is None:
        delta = float(part["b_median"]) - float(part["a_median"])
    return abs(float(delta))


def _op_names(block: Mapping[str, Any]) -> list[str]:
    """The moved ops and groups of one phase's attribution (names as the graph gives them)."""
    names = []
    for key in ("ops", "groups"):
        for row in block.get(key) or ():
            if isinstance(row, Mapping) and row.get("moved"):
                names.append(str(row.get("name") or ""))
    return names


def attribution_check(attribution: Mapping[str, Any] | None, phase: str, words: Sequence[str]) -> tuple[str, bool]:
    """The phase's reading, and whether one of ``words`` is in it or names a moved op or group."""
    block = ((attribution or {}).get("phases") or {}).get(phase) or {}
    reading = str(block.get("reading") or "")
    found = [w for w in words if w.lower() in reading.lower()]
    found += [w for w in words for name in _op_names(block) if w.lower() in name.lower()]
    return reading, bool(found)


def classify(entry: Entry, case: Case) -> Outcome:
    moved = [p for p in entry.parts if p.get("moved")]
    flagged = [p for p in moved if p.get("phase") in entry.moved_phases]
    largest: dict[str, str] = {}
    for phase in entry.moved_phases:
        mine = [p for p in flagged if p.get("phase") == phase]
        if mine:
            largest[phase] = max(mine, key=_size)["metric"]
    names = tuple(p["metric"] for p in flagged)
    reading, attribution_ok = "", None
    if case.phase is not None and case.attribution:
        reading, attribution_ok = attribution_check(entry.attribution, case.phase, case.attribution)
    named = None
    if case.cause is not None:
        named = largest.get(case.phase or "") == case.cause
    return Outcome(
        flagged=names,
        any_moved=tuple(p["metric"] for p in moved),
        largest=largest,
        named=named,
        others=tuple(p["metric"] for p in flagged if p["phase"] == case.phase and p["metric"] != case.cause),
        attribution=reading,
        attribution_ok=attribution_ok,
        pairs=entry.pairs,
    )


# --- the test projects -----------------------------------------------------------------------

AB_TEST = """import pytest

A = {a!r}
B = {b!r}


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}{runs})
def test_case(llmperf):
    llmperf.compare(a=A, b=B)
"""
SERVED_TEST = """import contextlib
import time
from unittest import mock

import httpx
import pytest
from pytest_llmperf.engines.servers import serve_llama_server

MODEL = {model!r}
A_THREADS, B_THREADS = {a_threads}, {b_threads}
#: Side B's client work per request, before the request is sent (ms): counted in its TTFT.
CLIENT_MS = {client_ms!r}


class SlowTransport(httpx.HTTPTransport):
    def handle_request(self, request):
        end = time.perf_counter() + CLIENT_MS / 1e3
        while time.perf_counter() < end:
            pass
        return super().handle_request(request)


@pytest.fixture(scope="module")
def servers():
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(serve_llama_server(MODEL, parallel=1, threads=A_THREADS))
        b = a if B_THREADS == A_THREADS else stack.enter_context(
            serve_llama_server(MODEL, parallel=1, threads=B_THREADS)
        )
        yield a, b


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}{runs})
def test_case(llmperf, servers):
    a, b = servers
    engine_a = a.engine()
    with mock.patch.object(httpx, "HTTPTransport", SlowTransport) if CLIENT_MS else contextlib.nullcontext():
        engine_b = b.engine()
    llmperf.compare(a=engine_a, b=engine_b)
"""


@dataclass(frozen=True)
class Project:
    """A case's test project: where it lies and what its sessions add to the command line."""

    root: Path
    args: tuple[str, ...]
    model: str


def _q8(preset: str) -> str:
    from pytest_llmperf import PRESETS, ensure_model

    return str(ensure_model(dataclasses.replace(PRESETS[preset], dtype="Q8_0")))


def _model(preset: str) -> str:
    from pytest_llmperf import ensure_model

    return str(ensure_model(preset))


def _ab_project(root: Path, case: Case, runs: int | None) -> Project:
    runs_key = f", runs={runs}" if runs else ""  # else the plugin's default (20 pairs)
    keys = {"prompt_tokens": case.prompt_tokens, "max_tokens": case.max_tokens, "runs": runs_key}
    # the model files only where a case names them (a Q8_0 model is written once, then cached);
    # repack off on both: the AMX repacked Q8_0 kernel crashes on some Xeons (against_sessions.py)
    sides: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
        "b": lambda: ({"model": _model(case.model), "repack": False}, {"model": _q8(case.model), "repack": False}),
        "c": lambda: ({"threads": 2}, {"threads": 1}),
        "d": lambda: ({"flash_attn": True}, {"flash_attn": False}),
        "aa-ab": lambda: ({"threads": 1}, {"threads": 1}),
    }
    (root / "tests").mkdir(parents=True)
    if case.name in sides:
        a, b = sides[case.name]()
        (root / "tests" / "test_case.py").write_text(AB_TEST.format(a=a, b=b, **keys))
    else:  # served
        threads = {"f-server": (2, 1)}.get(case.name, (1, 1))
        client_ms = CLIENT_MS if case.name == "f-client" else 0.0
        (root / "tests" / "test_case.py").write_text(
            SERVED_TEST.format(
                model=_model(case.model), a_threads=threads[0], b_threads=threads[1], client_ms=client_ms, **keys
            )
        )
    return Project(root, (), case.model)


def _against_project(root: Path, case: Case, runs: int | None, old_python: str) -> Project:
    from against_sessions import make_repo

    kind = {"a": "change", "aa-against": "aa"}.get(case.name, "python")
    ref = make_repo(root, kind, 0.08, case.prompt_tokens, case.max_tokens, case.model)
    if kind == "python":
        ref = f"python:{old_python if case.name == 'e' else sys.executable}"
    for test in (root / "tests").glob("test_*.py") if runs else ():  # the tests only: both sides run them
        text = test.read_text()
        test.write_text(text.replace(f"max_tokens={case.max_tokens})", f"max_tokens={case.max_tokens}, runs={runs})"))
    return Project(root, ("--llmperf-against", ref), case.model)


def make_project(root: Path, case: Case, runs: int | None, old_python: str) -> Project:
    if case.how == "ab":
        return _ab_project(root, case, runs)
    return _against_project(root, case, runs, old_python)


# --- sessions --------------------------------------------------------------------------------


def load_average() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def session_env() -> dict[str, str]:
    """This checkout's plugin first on the path (an installed copy elsewhere must not win), no
    history between sessions."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [env.get("PYTHONPATH")])])
    env["LLMPERF_HISTORY"] = "off"
    env.setdefault("LLMPERF_THREADS", "1")
    return env


def run_session(project: Project, out: Path, extra: Sequence[str] = ()) -> tuple[dict[str, Any], float, str]:
    """One ``python -m pytest`` session of the project: its session file, seconds, and the tail
    of what it printed."""
    for leftover in ("baselines", ".llmperf"):  # every session starts without a baseline
        shutil.rmtree(project.root / leftover, ignore_errors=True)
    from against_sessions import pytest_command

    cmd = pytest_command(project.model, out, *project.args, *extra)
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=project.root, capture_output=True, text=True, timeout=1800, check=False, env=session_env()
    )
    seconds = time.monotonic() - started
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
    doc = json.loads(out.read_text()) if out.exists() else {}
    return doc, seconds, tail


# --- llama-bench of case e's two builds ------------------------------------------------------


def bench_ts(binary: Path, model: str, prompt: int, gen: int) -> tuple[float, float]:
    """llama-bench's pp and tg tokens/s (1 thread, flash attention on as the plugin's default:
    the builds' own defaults differ, 0 in older releases, auto later)."""
    cmd = [str(binary), "-m", model, "-t", "1", "-fa", "1", "-p", str(prompt), "-n", str(gen), "-r", "3", "-o", "json"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True).stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_prompt"] == 0)
    return float(pp), float(tg)


def llama_bench_ratios(old: Path, new: Path, model: str, prompt: int, gen: int, rounds: int) -> tuple[float, float]:
    """This build's time / the old build's for pp and tg (llama-bench's t/s, old over new),
    the median of ``rounds`` alternations of the two binaries."""
    pp, tg = [], []
    for _ in range(rounds):
        old_pp, old_tg = bench_ts(old, model, prompt, gen)
        new_pp, new_tg = bench_ts(new, model, prompt, gen)
        pp.append(old_pp / new_pp)
        tg.append(old_tg / new_tg)
    return statistics.median(pp), statistics.median(tg)


def old_llama_bench(old_python: str) -> Path | None:
    """The older build's llama-bench, built by this plugin's own ``llmperf server build`` run
    under the older environment's interpreter (None: not built)."""
    code = "from pytest_llmperf.engines.servers import tool_path; print(tool_path('llama-bench', build=False))"
    proc = subprocess.run(
        [old_python, "-c", code], capture_output=True, text=True, env=session_env(), check=False, timeout=120
    )
    path = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    return path if path is not None and path.exists() else None


# --- the benchmark ---------------------------------------------------------------------------


@dataclass
class Tally:
    """One case's sessions."""

    case: Case
    outcomes: list[Outcome] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)
    loads: list[str] = dataclasses.field(default_factory=list)
    ratios: list[Mapping[str, float]] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)  # sessions that compared nothing
    note: str = ""

    @property
    def sessions(self) -> int:
        return len(self.outcomes) + len(self.failed)


def _count(outcomes: Sequence[Outcome], test: Callable[[Outcome], bool], n: int) -> str:
    return f"{sum(1 for o in outcomes if test(o))}/{n}"


def row(t: Tally) -> list[str]:
    """case, sessions, named cause k/N, the cause's part moved (whether or not its phase's
    headline did) k/N, another part flagged k/N, A/A any part flagged k/N, median pairs, median
    seconds per session, load averages seen, sessions that compared nothing (counted in N)."""
    n, o = t.sessions, t.outcomes
    named = "-" if t.case.cause is None else _count(o, lambda x: bool(x.named), n)
    cause = "-" if t.case.cause is None else _count(o, lambda x: t.case.cause in x.any_moved, n)
    attributed = _count(o, lambda x: bool(x.attribution_ok), n) if t.case.attribution else "-"
    others = "-" if t.case.cause is None else _count(o, lambda x: bool(x.others), n)
    aa = _count(o, lambda x: bool(x.any_moved), n) if t.case.aa else "-"
    pairs = f"{statistics.median(x.pairs for x in o):g}" if o else "-"
    secs = f"{statistics.median(t.seconds):.0f}" if t.seconds else "-"
    loads = sorted(float(x.split()[0]) for x in t.loads)
    load = f"{loads[0]:.1f}-{loads[-1]:.1f}" if loads else "-"
    return [t.case.name, str(n), named, cause, attributed, others, aa, pairs, secs, load, str(len(t.failed))]


HEADERS = [
    "case",
    "sessions",
    "named cause",
    "cause part moved",
    "attribution agrees",
    "other part flagged",
    "A/A any part",
    "pairs",
    "s/session",
    "load 1m",
    "compared nothing",
]


def describe(o: Outcome, entry: Entry) -> str:
    ratios = ", ".join(f"{m.split('_')[0].upper()} x{r:.3f}" for m, r in entry.headline.items())
    moved = ",".join(entry.moved_phases) or "none"
    flagged = ", ".join(o.flagged) or "no part"
    extra = f"; attribution: {o.attribution!r}" if o.attribution else ""
    verdict = "" if o.named is None else (" -> named" if o.named else " -> NOT named")
    other = f" (moved in an unmoved phase: {', '.join(sorted(set(o.any_moved) - set(o.flagged)))})"
    other = other if set(o.any_moved) - set(o.flagged) else ""
    return f"{ratios}; moved: {moved}; flagged: {flagged}{other}{verdict}{extra}; {o.pairs} pairs"


def run_case(case: Case, args: argparse.Namespace, work: Path) -> Tally:
    tally = Tally(case)
    root = work / case.name
    project = make_project(root, case, args.runs, args.old_python)
    extra = tuple(args.pytest_args.split()) if args.pytest_args else ()
    print(f"case {case.name}: {case.title}; {' '.join(project.args) or 'llmperf.compare'}", flush=True)
    for s in range(args.sessions):
        doc, seconds, tail = run_session(project, work / f"{case.name}-{s}.json", extra)
        tally.seconds.append(seconds)
        tally.loads.append(load_average())
        found = entries(doc)
        if not found:
            tally.failed.append(tail)
            print(f"  session {s + 1}: compared nothing ({seconds:.0f} s):\n    " + tail.replace("\n", "\n    "))
            continue
        entry = found[0]
        outcome = classify(entry, case)
        tally.outcomes.append(outcome)
        tally.ratios.append(entry.headline)
        print(f"  session {s + 1}: {describe(outcome, entry)}; {seconds:.0f} s, load {tally.loads[-1]}", flush=True)
        if s == 0:  # what the plugin itself said, once per case
            print("".join(f"    why: {line}\n" for line in entry.why), end="", flush=True)
    return tally


def case_e_bench(args: argparse.Namespace) -> str:
    """llama-bench's pp and tg ratios of case e's two builds, or why there are none."""
    from pytest_llmperf.engines.servers import tool_path

    old = old_llama_bench(args.old_python)
    if old is None:
        return f"llama-bench of {args.old_python}'s llama-cpp-python is not built (llmperf server build under it)"
    case = CASES["e"]
    pp, tg = llama_bench_ratios(
        old, tool_path("llama-bench", build=False), _model(case.model), case.prompt_tokens, case.max_tokens, 3
    )
    return f"llama-bench this build / {old.parent.parent.parent.name}: pp time x{pp:.3f}, tg time x{tg:.3f}"


def selected(spec: str) -> list[Case]:
    names: list[str] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        for n in GROUPS.get(name, [name]):
            if n not in CASES:
                raise SystemExit(f"unknown case {n!r}; cases: {', '.join(CASES)}, or groups {', '.join(GROUPS)}")
            names.append(n)
    return [CASES[n] for n in dict.fromkeys(names)]


def default_old_python() -> str:
    cache = Path(os.environ.get("LLMPERF_CACHE_DIR") or Path.home() / ".cache" / "llmperf")
    return str(cache / "venvs" / "llama-cpp-python-0.3.16" / "bin" / "python")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join([*CASES, *GROUPS]))
    p.add_argument(
        "--runs",
        type=int,
        help="the marker's runs (default: the plugin's, 20): an A/B's pairs; against REF, pairs until the "
        "verdict settles, up to 3 x runs. Fewer than 10 pairs leave every part unflagged (Holm at alpha 1%%), "
        "12 are marginal",
    )
    p.add_argument("--quick", action="store_true", help="one session per case (a smoke run)")
    p.add_argument("--old-python", default=default_old_python(), help="case e's REF environment's interpreter")
    p.add_argument("--pytest-args", default="", help="more options for every session (one string)")
    p.add_argument("--jsonl", type=Path, help="append every session's outcome to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions = 1
    sys.path.insert(0, str(HERE))  # against_sessions
    cases = selected(args.cases)
    print(
        f"{len(cases)} case(s), {args.sessions} session(s) each, runs {args.runs or 'the default (20)'}; "
        f"load average at start {load_average()}",
        flush=True,
    )
    tallies = []
    with tempfile.TemporaryDirectory(prefix="llmperf-why-") as tmp:
        for case in cases:
            tally = run_case(case, args, Path(tmp))
            if case.name == "e":
                tally.note = case_e_bench(args)
                print(f"  {tally.note}", flush=True)
            tallies.append(tally)
            if args.jsonl:
                with args.jsonl.open("a") as fh:
                    for o in tally.outcomes:
                        fh.write(json.dumps({"case": case.name, **dataclasses.asdict(o)}) + "\n")
    print(report(tallies))
    print(f"load average at end {load_average()}")
    return 0


def report(tallies: Sequence[Tally]) -> str:
    from pytest_llmperf.core.formats import render_table

    lines = [render_table(HEADERS, [row(t) for t in tallies])]
    for t in tallies:
        if t.case.name == "e" and t.outcomes:
            counts: dict[str, int] = {}
            for o in t.outcomes:
                for m in o.flagged:
                    counts[m] = counts.get(m, 0) + 1
            moved = ", ".join(f"{m} {k}/{t.sessions}" for m, k in sorted(counts.items())) or "no part"
            tpot = statistics.median(r.get("tpot_ms", float("nan")) for r in t.ratios)
            ttft = statistics.median(r.get("ttft_ms", float("nan")) for r in t.ratios)
            lines.append(f"e: flagged {moved}; median ratio TTFT x{ttft:.3f}, TPOT x{tpot:.3f}; {t.note}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
