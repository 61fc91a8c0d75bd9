"""The HTML report: rendered from a real session, opened in headless Chromium.

The browser checks skip, saying why, when no Chromium is installed; with
``LLMPERF_REQUIRE_BROWSER=1`` (``.ci/run`` sets it after installing Debian's ``chromium``)
they fail instead, so a CI where the report was never opened cannot pass.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.figure  # noqa: F401  (imported before any inner session, which would unload it)
import numpy as np
import pytest
from inner import busiest_baseline, chromium, outpace

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.result import MeasurementResult
from pytest_llmperf.reports import charts
from pytest_llmperf.reports import html as html_report

SUITE = """
import pytest

@pytest.mark.llmperf(prompt_tokens=64, max_tokens=32, runs=8, p95_ms=40, ttft_ms=200, min_tps=50, layers=True)
def test_steady(): pass

@pytest.mark.llmperf(prompt_tokens=128, max_tokens=32, runs=8, tpot_ms=20)
def test_regressed(): pass
"""

PER_TEST_FIGURES = {"itl-ecdf", "run-strips", "token-timeline"}
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def open_in_chromium(page: Path, tmp: Path, *action: str) -> tuple[str, list[str]]:
    """Run Chromium on ``page``; returns stdout and the URLs the page itself requested (from
    Chromium's net log: requests on behalf of a file:// page; the browser's own update and
    account pings are not the page's)."""
    net_log = tmp / f"net-{len(list(tmp.glob('net-*')))}.json"
    proc = subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp / 'profile'}",
            f"--log-net-log={net_log}",
            "--window-size=1280,2400",
            "--virtual-time-budget=5000",
            *action,
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = json.loads(net_log.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requested = [
        e["params"]["url"]
        for e in log["events"]
        if e["type"] == start_job and "file://" in str(e.get("params", {}).get("network_isolation_key", ""))
    ]
    return proc.stdout, requested


class Outline(HTMLParser):
    """Test sections and the figures (with an <svg>) inside each."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, set[str]] = {}
        self.summary_figures: set[str] = set()
        self.ids: list[str] = []
        self._section: str | None = None
        self._figure: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        if tag == "section" and "data-test" in a:
            self._section = a["data-test"]
            self.sections[self._section] = set()
        elif tag == "figure":
            self._figure = a.get("data-figure")
        elif tag == "svg" and self._figure:
            (self.sections[self._section] if self._section else self.summary_figures).add(self._figure)


def outline(html: str) -> Outline:
    parser = Outline()
    parser.feed(html)
    return parser


def external_references(html: str) -> list[str]:
    """Anything a browser would fetch: src/href/url() pointing off the page (SVG namespace
    declarations are names, not requests)."""
    refs = re.findall(r'(?:src|href|xlink:href|action|poster)\s*=\s*["\']([^"\'#][^"\']*)', html)
    refs += re.findall(r"url\(\s*['\"]?([^#'\")][^'\")]*)", html)
    refs += re.findall(r"@import", html)
    return [r for r in refs if not r.startswith("data:")]


@dataclass(frozen=True)
class RealReport:
    """A real two-session run (baselines recorded, one test's baseline made 2x faster, then
    compared) and the reports it wrote."""

    folder: Path
    stdout: str
    session: dict

    @property
    def page(self) -> Path:
        return self.folder / "out" / "report.html"


def inner_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--rootdir={folder}",
            "--llmperf-threads",
            "1",
            *args,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> RealReport:
    """Made once for the checks without and with a browser (two sessions on real llama.cpp)."""
    folder = tmp_path_factory.mktemp("real-report")
    (folder / "test_suite.py").write_text(SUITE)
    recorded = inner_pytest(folder, "--llmperf-update-baselines")
    assert recorded.returncode == 0, recorded.stdout[-3000:]
    path = folder / "baselines" / "test_suite.json"
    data = json.loads(path.read_text())
    for entry in data["tests"]["test_regressed"].values():
        outpace(entry, 2.0)  # faster than its fastest run: a certain slowdown on any machine
        busiest_baseline(entry)  # never blamed on the machine (CI runners' steal time)
        entry["subject"]["backend_version"] = "0.3.35"
    path.write_text(json.dumps(data))
    compared = inner_pytest(
        folder,
        "--llmperf-html",
        "out/report.html",
        "--llmperf-json",
        "session.json",
        "--llmperf-markdown",
        "summary.md",
    )
    assert compared.returncode == 1 and re.search(r"\b[12] failed\b", compared.stdout), compared.stdout[-3000:]
    return RealReport(folder, compared.stdout, json.loads((folder / "session.json").read_text()))


def test_real_session_report(real_report: RealReport, tmp_path: Path) -> None:
    assert re.search(r"llmperf: HTML report written to out.report\.html", real_report.stdout), real_report.stdout
    html = real_report.page.read_text()
    regressed = next(r for r in real_report.session["results"] if r["test"].endswith("test_regressed"))
    assert regressed["baseline_record"] and regressed["budgets"] == {"tpot_ms": 20.0}
    verdicts = {c["metric"]: c["verdict"] for c in regressed["verdict"]["comparisons"]}
    assert verdicts["tpot_ms"] == "REGRESSION", verdicts

    # Self-contained: nothing to fetch, every id unique across the inline SVGs.
    assert external_references(html) == []
    static = outline(html)
    assert len(static.ids) == len(set(static.ids))
    assert sorted(static.sections) == sorted(r["test"] for r in real_report.session["results"])
    assert "REGRESSION" in html and "changed since the baseline: llama-cpp-python 0.3.35 -&gt; " in html
    assert "budget tpot_ms=20 ms" in html and "budget p95_ms=40 ms" in html  # budgets drawn as lines

    # The Markdown summary links the report and embeds the key figure (an SVG beside it).
    md = (real_report.folder / "summary.md").read_text()
    assert "Plots: [HTML report](out/report.html)" in md
    assert "![Compared metrics, most notable first](summary.svg)" in md
    assert (real_report.folder / "summary.svg").read_text().count("<svg") == 1

    # The same page from the saved JSON report.
    out = tmp_path / "again.html"
    assert cli_main(["report", str(real_report.folder / "session.json"), "-o", str(out)]) == 0
    assert outline(out.read_text()).sections == static.sections


def test_real_session_report_in_chromium(real_report: RealReport, tmp_path: Path) -> None:
    """In the browser: the DOM holds every section and figure, the page asked for nothing,
    and the screenshot is a drawn page, not a blank one."""
    session = real_report.session
    tests = [r["test"] for r in session["results"]]
    dom, requested = open_in_chromium(real_report.page, tmp_path, "--dump-dom")
    assert requested == []
    rendered = outline(dom)
    assert sorted(rendered.sections) == sorted(tests)
    for r in session["results"]:  # layer and roofline figures where the record has the data
        optional = {"layer-bars": "layers", "roofline": "roofline"}
        expected = PER_TEST_FIGURES | {f for f, key in optional.items() if r["record"].get(key)}
        expected |= {"parts"} if (r["verdict"] or {}).get("parts") else set()  # where the time went
        assert rendered.sections[r["test"]] == expected, r["test"]
    assert "layer-bars" in rendered.sections[tests[0]]  # layers=True
    assert rendered.summary_figures == {"change-overview"}

    _, requested = open_in_chromium(real_report.page, tmp_path, f"--screenshot={tmp_path / 'shot.png'}")
    assert requested == []
    from PIL import Image

    shot = Image.open(tmp_path / "shot.png").convert("RGB")
    assert shot.size == (1280, 2400)
    pixels = np.asarray(shot.resize((320, 600))).reshape(-1, 3)
    inked = float((pixels.min(axis=1) < 200).mean())
    colours = len(np.unique(pixels, axis=0))
    assert inked > 0.03 and colours > 100, (inked, colours)  # text, plots, colours: not a blank page


def test_the_net_log_check_sees_page_requests(tmp_path: Path) -> None:
    """The 'no request' assertion above is not vacuous: an external image and stylesheet show up."""
    page = tmp_path / "leaky.html"
    page.write_text(
        '<!DOCTYPE html><img src="http://127.0.0.1:9/probe.png"><link rel="stylesheet" href="http://127.0.0.1:9/x.css">'
    )
    assert external_references(page.read_text()) == ["http://127.0.0.1:9/probe.png", "http://127.0.0.1:9/x.css"]
    _, requested = open_in_chromium(page, tmp_path, "--dump-dom")
    assert sorted(requested) == ["http://127.0.0.1:9/probe.png", "http://127.0.0.1:9/x.css"]


def _record(scale: float = 1.0) -> dict:
    itl = [[(0.5 + 0.002 * i + 0.05 * (r == 0)) * scale for i in range(40)] for r in range(6)]
    layer = {
        "names": [f"layer {i}" for i in range(4)] + ["output"],
        "median_ms": [v * scale for v in (0.1, 0.1, 0.4, 0.1, 0.05)],
        "share": [0.13, 0.13, 0.53, 0.13, 0.07],
        "step_ms": 0.75 * scale,
        "n_runs": 6,
        "outliers": ["layer 2"],
    }
    phase = {
        "bytes_per_token": 2e8,
        "flops_per_token": 2.7e8,
        "intensity_flop_per_byte": 1.35,
        "bound_tps": 100.0,
        "achieved_tps": 80 / scale,
        "achieved_bw_gbs": 16.0,
        "mbu": 0.8,
        "mfu": 0.02,
        "verdict": "memory-bound",
    }
    return {
        "runs": {"ttft_ms": [5.0 * scale] * 6, "tpot_ms": [0.6 * scale] * 6, "decode_tps": [1600 / scale] * 6},
        "itl_ms": itl,
        "summary": {"n_runs": 6, "ttft_ms": 5.0 * scale, "decode_tps": 1600 / scale, "itl_p95_ms": 0.6 * scale},
        "workload": {"prompt_tokens": 64, "max_tokens": 41},
        "hardware": {"cpu": "test"},
        "subject": {"engine": "llama.cpp"},
        "layers": {
            "phases": {"prefill": layer, "decode": layer},
            "outlier_rule": "median + 5 x MAD",
            "overhead_ratio": 1.1,
        },
        "roofline": {
            "peak_bw_gbs": 20.0,
            "peak_bw_source": "measured",
            "peak_tflops": 0.5,
            "peak_tflops_source": "given",
            "decode": phase,
            "prefill": {**phase, "verdict": "compute-bound"},
        },
    }


def test_layer_and_roofline_figures_when_the_record_has_them() -> None:
    result = MeasurementResult(
        "t.py::test_layers",
        record=Measurement.read(_record(1.3)),
        baseline_record=Measurement.read(_record()),
        budget="ok",
        budgets={"p99_ms": 2.0, "tpot_ms": 1.0, "min_mbu": 0.5},
    )
    section = html_report.test_section(0, result)
    found = outline(section).sections["t.py::test_layers"]
    assert found == PER_TEST_FIGURES | {"layer-bars", "roofline"}
    assert "median + 5 x MAD" in section and f"fill: {charts.BUDGET}" in section  # outlier layer in red
    assert "MBU 80%" in section and "memory-bound" in section and "budget p99_ms=2 ms" in section
    assert "budget min_mbu=0.5 of peak bandwidth" in section  # the MBU floor on the roofline
    without = html_report.test_section(
        0,
        replace(
            result, record=Measurement.read({k: v for k, v in _record().items() if k not in ("layers", "roofline")})
        ),
    )
    assert outline(without).sections["t.py::test_layers"] == PER_TEST_FIGURES


def test_parallel_sections_match_sequential(monkeypatch: pytest.MonkeyPatch) -> None:
    """Big reports draw in worker processes; the page must not depend on it."""
    results = [
        MeasurementResult(
            f"t.py::test_{i}", record=Measurement.read(_record(1 + i / 10)), baseline_record=Measurement.read(_record())
        )
        for i in range(3)
    ]
    trend = {
        "test": "t.py::test_2",
        "metric": "tpot_ms",
        "label": "decode TPOT",
        "unit": "ms",
        "points": [[0.6, 0.55, 0.65, "abc1234"], [0.7, 0.66, 0.74, "def5678"]],
        "steps": [],
    }
    trends = {"t.py::test_2": [trend]}  # beside the results, as the history gives it
    sequential = html_report.test_sections(results, workers=1, trends=trends)
    assert ['data-figure="trend"' in s for s in sequential] == [False, False, True]
    monkeypatch.setattr(html_report, "PARALLEL_FROM", 1)
    assert html_report.test_sections(results, workers=2, trends=trends) == sequential


def test_without_matplotlib_a_one_line_message(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--llmperf-html", "r.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert 'the HTML report needs matplotlib: pip install "pytest-llmperf[report]"' in result.stderr.str()
    assert "Traceback" not in result.stderr.str()
    capsys.readouterr()
    (pytester.path / "s.json").write_text('{"schema": "pytest-llmperf/session", "schema_version": 1, "results": []}')
    assert cli_main(["report", str(pytester.path / "s.json"), "-o", str(pytester.path / "r.html")]) == 2
    assert capsys.readouterr().err.strip() == (
        'llmperf: error: the HTML report needs matplotlib: pip install "pytest-llmperf[report]"'
    )
