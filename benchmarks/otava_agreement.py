"""Our change points against Apache Otava's on the same series, read by Otava from our history.

Otava's PyPI release pins numpy 2.2 and scipy < 1.17 and pulls cloud and chat SDKs, so it is
never a dependency of the plugin: this script makes (once) a separate virtual environment with
``apache-otava`` in the user cache (``~/.cache/pytest-llmperf/otava-venv``; ``--venv`` to
choose), writes seeded synthetic sessions into a real SQLite history through the plugin's own
store, exports it with ``llmperf history --csv`` (the CSV files and the ``otava.yaml`` the docs
describe), runs ``otava analyze --output json`` on it, runs ``llmperf detect``'s detector on
the same series, and prints where the two agree.

Series (60 sessions each, the drift of benchmarks/changepoints.py): +5% step at session 40,
A/A, the 6% creep, and a +10% step at session 30.

Run: ``python benchmarks/otava_agreement.py [--series 10] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from changepoints import CREEP, SESSIONS, STEP, session_runs

from pytest_llmperf.history import append_session
from pytest_llmperf.history import series as detect
from pytest_llmperf.history.connection import parse
from pytest_llmperf.history.series import export_csv, read_series

OTAVA = "apache-otava==0.8.0"
#: The sessions' branch (as CI sets it): Otava's PostgreSQL source selects one branch.
BRANCH = "main"
os.environ["GITHUB_REF_NAME"] = BRANCH


def otava_venv(folder: Path) -> Path:
    """The venv's ``otava`` script, installing it the first time (a few minutes: it pulls
    google-cloud-bigquery and slack-sdk with it)."""
    exe = folder / "bin" / "otava"
    if not exe.exists():
        print(f"creating {folder} with {OTAVA} (once)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", OTAVA], check=True)
    return exe


def scenarios(series: int) -> dict[str, np.ndarray]:
    step10 = np.where(np.arange(SESSIONS) >= 30, np.log(1.10), 0.0)
    out = {}
    for i in range(series):
        out[f"step5_{i}"] = STEP
        out[f"aa_{i}"] = np.zeros(SESSIONS)
        out[f"creep_{i}"] = CREEP
        out[f"step10_{i}"] = step10
    return out


def write_history(target: str, folder: Path, shifts: dict[str, np.ndarray], seed: int) -> None:
    """One session per index, each measuring every series (a "test" each), at hourly times
    ending now (Otava reads the last year by default)."""
    runs = {
        name: session_runs(np.random.default_rng([seed, zlib.crc32(name.encode())]), shift, base=20.0)
        for name, shift in shifts.items()
    }
    loc = parse(target, "benchmark", folder)
    path = folder
    now = datetime.datetime.now(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
    for s in range(SESSIONS):
        results = [
            {
                "test": f"bench.py::{name}",
                "nodeid": f"bench.py::{name}",
                "label": "",
                "hardware_key": "bench",
                "record": {
                    "hardware": {},
                    "subject": {"n_threads": 1},
                    "workload": {},
                    "summary": {},
                    "runs": {"tpot_ms": [float(v) for v in r[s]]},
                },
                "verdict": None,
            }
            for name, r in runs.items()
        ]
        started = (now - datetime.timedelta(hours=SESSIONS - s)).isoformat(timespec="seconds")
        append_session(loc, results, started, path, compared=False)


def otava_points(
    exe: Path, config: Path, tests: list[str], pvalue: float, window: int, env: dict[str, str] | None = None
) -> dict[str, list[int]]:
    out = subprocess.run(
        [
            str(exe),
            "analyze",
            *tests,
            "--output",
            "json",
            "-P",
            str(pvalue),
            "--window",
            str(window),
            "--branch",
            BRANCH,
        ],
        env={**os.environ, **(env or {}), "OTAVA_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"otava failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    out = out.stdout
    found: dict[str, list[int]] = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            for test, groups in json.loads(line).items():
                found[test] = sorted(int(c["index"]) for g in groups for c in g["changes"])
    return found


def agree(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1 for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=10, help="series per scenario (4 scenarios)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pvalue", type=float, default=0.001, help="Otava's -P (its default 0.001)")
    ap.add_argument("--window", type=int, default=50, help="Otava's --window (its default 50)")
    ap.add_argument(
        "--venv",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pytest-llmperf" / "otava-venv",
    )
    args = ap.parse_args()
    exe = otava_venv(args.venv)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.sqlite"
        write_history(str(db), Path(tmp), scenarios(args.series), args.seed)
        loc = parse(str(db), "benchmark", tmp)
        series = read_series(loc, metrics=["tpot_ms"])
        export_csv(series, Path(tmp) / "csv")
        slugs = {s.name: f"bench.py_{s.name.split('::')[1]}-bench" for s in series}
        theirs = otava_points(exe, Path(tmp) / "csv" / "otava.yaml", list(slugs.values()), args.pvalue, args.window)
        print(
            f"{len(series)} series of {SESSIONS} sessions; Otava -P {args.pvalue} --window {args.window}; "
            "ours: E-divisive, permutation test at alpha 0.01"
        )
        by_kind: dict[str, list[tuple[list[int], list[int]]]] = {}
        for s in series:
            ours = [st.index for st in detect.steps(s)]
            kind = s.name.split("::")[1].rsplit("_", 1)[0]
            by_kind.setdefault(kind, []).append((ours, theirs.get(slugs[s.name], [])))
        print(
            f"{'scenario':<8} {'series':>6} {'same points (+-1)':>18} {'ours: mean found':>17} {'Otava: mean found':>18}  examples (ours | Otava)"
        )
        total = same = 0
        for kind, pairs in by_kind.items():
            n_same = sum(agree(o, t) for o, t in pairs)
            total += len(pairs)
            same += n_same
            examples = "; ".join(f"{o} | {t}" for o, t in pairs[:3])
            print(
                f"{kind:<8} {len(pairs):>6} {n_same:>18} {np.mean([len(o) for o, _ in pairs]):>17.2f} "
                f"{np.mean([len(t) for _, t in pairs]):>18.2f}  {examples}"
            )
        print(f"agreement: {same}/{total} series give the same change points (+-1 session)")
        for name, slug in slugs.items():
            ours = [st.index for st in detect.steps(next(s for s in series if s.name == name))]
            if not agree(ours, theirs.get(slug, [])):
                print(f"  differ: {name.split('::')[1]}: ours {ours}, Otava {theirs.get(slug, [])}")
        postgres_source(exe, args, series, slugs, theirs)


def postgres_source(exe: Path, args: argparse.Namespace, series: list, slugs: dict, from_csv: dict) -> None:
    """The same history in a throw-away PostgreSQL (tests/pgserver.py), read by Otava's own
    PostgreSQL source with the ``otava-postgres.yaml`` that ``llmperf history --csv`` writes."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import psycopg  # noqa: F401
        from pgserver import PgServer, bindir
    except ImportError:
        print("PostgreSQL source: skipped (no psycopg)")
        return
    if bindir() is None:
        print("PostgreSQL source: skipped (no PostgreSQL binaries)")
        return
    with tempfile.TemporaryDirectory() as tmp, PgServer() as pg:
        url = pg.new_database()
        write_history(url, Path(tmp), scenarios(args.series), args.seed)
        export_csv(read_series(parse(url, "benchmark", tmp), metrics=["tpot_ms"]), Path(tmp), postgres=True)
        conn = {
            "POSTGRES_HOSTNAME": "127.0.0.1",
            "POSTGRES_PORT": str(pg.port),
            "POSTGRES_USERNAME": pg.user,
            "POSTGRES_PASSWORD": "unused (trust)",
            "POSTGRES_DATABASE": url.rsplit("/", 1)[1],
        }
        got = otava_points(exe, Path(tmp) / "otava-postgres.yaml", list(slugs.values()), args.pvalue, args.window, conn)
        same = sum(got.get(slug) == from_csv.get(slug) for slug in slugs.values())
        print(
            f"PostgreSQL source (otava-postgres.yaml on a throw-away server): {same}/{len(slugs)} series give "
            "Otava the same change points as the CSV export"
        )


if __name__ == "__main__":
    main()
