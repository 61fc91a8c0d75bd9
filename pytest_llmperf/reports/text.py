"""Plain-text reports: the per-test metrics table and the session summary table.

Summary rows are ``judge.result.MeasurementResult.summary_row()``: built from the typed
results that cross pytest-xdist's wire (the JUnit properties come from the same result).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import formats as nodeids
from ..core.formats import fmt
from ..core.catalog import FIGURES, SUMMARY_COLUMNS
from ..measuring.metrics import Measurement
from ..core.settings import DEFAULT_SUMMARY_COLUMNS
from ..core.formats import render_table


def _opt(value: float | None) -> str:
    return "n/a" if value is None else fmt(value)


def _figure_row(m: Measurement, first: str, *more: str) -> tuple[str, str, str, str]:
    """A metrics-table row of catalog figures of one metric: ``TTFT median / p95``."""
    figures = [FIGURES[first], *(FIGURES[name] for name in more)]
    label = " / ".join([figures[0].label, *(f.statistic for f in figures[1:])])
    sample = f"{m.itl.count} tokens" if figures[0].pooled_tokens else f"{m.n_runs} runs"
    return label, figures[0].unit, " / ".join(_opt(f.read(m)) for f in figures), sample


def metrics_table(m: Measurement) -> str:
    """The detail section of one measurement: every figure with its sample count."""
    itl = m.itl
    head = (
        f"{m.engine.engine}: {m.engine.describe()}"
        + (f"; threads {m.engine.n_threads}" if m.engine.n_threads is not None else "")
        + "\n"
        f"workload: {m.prompt_tokens if m.prompt_tokens is not None else '?'} prompt tokens, "
        f"{m.output_tokens} generated per run, {m.n_runs} runs (+{m.workload.warmup} warm-up discarded)\n"
    )
    runs = f"{m.n_runs} runs"
    rows = [
        _figure_row(m, "ttft_ms", "ttft_p95_ms"),
        ("tokenize median", "ms", fmt(m.tokenize_ms), runs),
        _figure_row(m, "prefill_ms"),
        ("prefill (llama.cpp) median", "ms", _opt(m.native_prefill_ms), runs),
        _figure_row(m, "prefill_tps"),
        _figure_row(m, "tpot_ms"),
        ("decode (llama.cpp) median", "ms/token", _opt(m.native_decode_ms_per_token), runs),
        ("engine overhead median", "ms/token", _opt(m.overhead_ms_per_token), runs),
        _figure_row(m, "decode_tps"),
        (
            "sampling (llama.cpp sampler)" + ("" if m.engine.sample else ", timed apart"),
            "ms/token", _opt(m.sampling_ms_per_token), runs,
        ),
        _figure_row(m, "e2e_ms"),
        _figure_row(m, "itl_p50_ms", "itl_p90_ms"),
        _figure_row(m, "itl_p95_ms", "itl_p99_ms"),
        ("ITL mean +- stdev", "ms", f"{fmt(itl.mean_ms)} +- {fmt(itl.stdev_ms)}", f"{itl.count} tokens"),
        ("ITL CV", "", f"{itl.cv:.1%}", f"{itl.count} tokens"),
        ("ITL min / max", "ms", f"{fmt(itl.min_ms)} / {fmt(itl.max_ms)}", f"{itl.count} tokens"),
    ]
    if m.load is not None:
        from ..measuring.load import load_rows

        rows += load_rows(m)
    if m.engine.endpoint:  # served: what the server's prompt cache was allowed to do
        rows.append(("prompt cache", "", m.workload.prompt_cache, ""))
    if m.engine.load_ms is not None:
        rows.append(("model load (wall)", "ms", fmt(m.engine.load_ms), "1 load"))
    if m.engine.native_load_ms is not None:
        rows.append(("model load (llama.cpp)", "ms", fmt(m.engine.native_load_ms), "1 load"))
    from . import breakdown
    from ..baselines.records import diagnosis

    found = diagnosis(m)
    rows += breakdown.stability_rows(found["stability"]) + breakdown.memory_rows(found["memory"])
    text = head + render_table(("metric", "unit", "value", "sample"), rows)
    if "layers" in found:
        text += "\n\nper-layer time:\n" + breakdown.layers_text(found["layers"])
    if "roofline" in found:
        text += "\n\nroofline:\n" + breakdown.roofline_text(found["roofline"])
    warnings = found["stability"]["warnings"]
    return text + ("\n\n" + "\n".join(warnings) if warnings else "")


#: A test id is never cut shorter than this, whatever the width.
MIN_TEST_WIDTH = 16


def summary_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, width: int | None = None
) -> str:
    """The session summary. ``width`` (a terminal's): only ``columns`` (default
    ``DEFAULT_SUMMARY_COLUMNS``), test ids shortened to fit; None: every column, full ids."""

    def cell(value: Any) -> str:
        if value is None:
            return "n/a"
        if isinstance(value, float):
            return fmt(value)
        return str(value)

    names = {name for name, _, _ in SUMMARY_COLUMNS}
    if width is None:
        chosen = list(SUMMARY_COLUMNS)
    else:
        wanted = [c for c in (columns or ()) if c in names and c != "test"] or list(DEFAULT_SUMMARY_COLUMNS)
        by_name = {col[0]: col for col in SUMMARY_COLUMNS}
        chosen = [SUMMARY_COLUMNS[0]] + [by_name[name] for name in dict.fromkeys(wanted)]  # in the order given
    headers = [h for _, h, _ in chosen]
    body = [[cell(r.get(f)) for _, _, f in chosen] for r in rows]
    return render_table(headers, body) if width is None else fit_table(headers, body, width)


def short_ids(ids: Sequence[str]) -> dict[str, str]:
    """Each test id without what all of them share: the path, then the module when the rest
    is unique (``tests/perf/test_a.py::test_decode[#2]`` -> ``test_decode[#2]``)."""
    def tail(nodeid: str, n: int) -> str:
        head, *pieces = nodeids.parts(nodeid)  # a parameter id's own "::" is no separator
        if not pieces:
            return nodeid
        if n > len(pieces):
            return head.rsplit("/", 1)[-1] + "::" + "::".join(pieces)
        return "::".join(pieces[-n:])

    unique = list(dict.fromkeys(ids))
    for parts in range(1, 10):
        short = {i: tail(i, parts) for i in unique}
        if len(set(short.values())) == len(unique):
            return short
    return {i: i for i in unique}


def _clip(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (the ends say the most); a
    parameter id (``[...]``) is kept whole when it leaves room for 6 characters of the name."""
    if len(text) <= width:
        return text
    name, bracket, param = text.partition("[")
    if bracket and len(param) + 1 <= width - 6:
        return _clip(name, width - len(param) - 1) + bracket + param
    keep = width - 2
    return text[: keep - keep // 2] + ".." + text[len(text) - keep // 2 :]


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str:
    """``render_table`` with the first column (test ids) shortened so lines fit ``width``."""
    rows = [list(r) for r in rows]
    short = short_ids([r[0] for r in rows])
    rows = [[short[r[0]]] + r[1:] for r in rows]
    others = sum(max(len(str(c)) for c in col) + 2 for col in list(zip(headers, *rows))[1:])
    room = max(width - others, MIN_TEST_WIDTH, len(headers[0]))
    return render_table(headers, [[_clip(r[0], room)] + r[1:] for r in rows])
