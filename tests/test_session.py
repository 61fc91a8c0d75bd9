"""The session object without pytest: a script measures, judges against a baseline it
recorded, writes the session JSON and prints the summary, and never imports pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.session import Session, SessionSettings

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
from pathlib import Path

from pytest_llmperf.session import Session

root = Path(sys.argv[1])
MARKER = {"prompt_tokens": 16, "max_tokens": 8, "runs": 4, "warmup": 1, "tpot_ms": 10000.0}


def one_session(**values):
    # The three calls of docs/api.md: a session, one measurement (sequential looks included), its end.
    session = Session.of(root, threads=1, history="off", **values)
    attributes = set(vars(session))
    report = session.measure("perf/test_x.py::test_decode", MARKER)
    lines = session.end(environ={}, width=100)
    assert set(vars(session)) == attributes, set(vars(session)) ^ attributes  # all made in __init__
    return report, session.outputs, lines, session


parts, outputs, lines, session = one_session(update_baselines=True)
assert not outputs.failed and outputs.written, outputs
parts, outputs, lines, session = one_session(json=str(root / "session.json"))
heavy = sorted(m for m in sys.modules if m == "pytest" or m.startswith(("_pytest", "pluggy")))
print(json.dumps({"pytest_modules": heavy, "lines": lines, "verdict": session.results[0].verdict.status,
                  "sections": [t for t, _ in parts.sections]}))
"""


def test_a_script_runs_a_session_without_pytest(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in [k for k in env if k.startswith("LLMPERF_") and k != "LLMPERF_CACHE_DIR"]:
        env.pop(name)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["pytest_modules"] == []
    assert out["verdict"] == "compared"
    assert out["sections"] == ["llmperf"]
    assert ["sep", "llmperf summary"] in out["lines"]
    assert any("test_decode" in text for kind, text in out["lines"] if kind == "line")
    data = json.loads((tmp_path / "session.json").read_text())
    assert [r["test"] for r in data["results"]] == ["perf/test_x.py::test_decode"]
    stored = list((tmp_path / "baselines").rglob("*.json"))
    assert (
        len(stored) == 1
        and data["results"][0]["baseline_file"] == stored[0].relative_to(tmp_path / "baselines").as_posix()
    )


def test_settings_of_a_script_take_the_table_defaults_and_reject_unknown_names(tmp_path: Path) -> None:
    s = SessionSettings.of(tmp_path, environ={}, threads="2")
    assert s.engine.threads == 2 and s.threads_source == "--llmperf-threads"
    assert s.engine.n_batch == 512 and s.alpha == 0.01 and s.threshold == 0.05
    assert s.baseline_dir == tmp_path / "baselines"
    assert s.history is not None and s.history.target == str(tmp_path / ".llmperf" / "history.sqlite")
    env = SessionSettings.of(tmp_path, environ={"LLMPERF_THREADS": "3", "LLMPERF_HISTORY": "off"})
    assert env.engine.threads == 3 and env.threads_source == "$LLMPERF_THREADS" and env.history is None
    with pytest.raises(ConfigError, match="unknown llmperf setting"):
        SessionSettings.of(tmp_path, thread=2)
    with pytest.raises(ConfigError, match="exclude each other"):
        SessionSettings.of(tmp_path, environ={}, skip=True, only=True)


def test_session_reads_nothing_but_its_settings(tmp_path: Path) -> None:
    """Every attribute exists from the start; nothing is loaded until asked for."""
    session = Session(SessionSettings.of(tmp_path, environ={}))
    assert session.engines.pool is None and session.outputs is None
    assert session.finish(environ={}) is None  # nothing measured, no report asked for
    assert session.summary(verbosity=0, width=80) == []


def test_the_three_call_script_of_the_api_docs_runs_as_written(tmp_path: Path) -> None:
    """docs/api.md's script, verbatim, in an empty folder: it measures, judges (no baseline
    yet), writes the session's history there and prints one line; pytest never imported."""
    docs = (ROOT / "docs" / "api.md").read_text()
    part = docs[docs.index("## A measurement as the plugin makes it, without pytest") :]
    block = part[part.index("```python\n") + len("```python\n") : part.index("\n```\n")]
    assert block.count("session.") == 2 and "Session.of(" in block  # three calls
    check = "\nimport sys\nassert not [m for m in sys.modules if m == 'pytest' or m.startswith('_pytest')]\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in [k for k in env if k.startswith("LLMPERF_") and k != "LLMPERF_CACHE_DIR"]:
        env.pop(name)
    proc = subprocess.run(
        [sys.executable, "-c", block + check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.splitlines()[-1]
    assert ("passed" in printed or "TPOT" in printed) and "no-baseline" in printed, printed
