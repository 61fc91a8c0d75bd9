"""One self-contained HTML file from a session's results: summary, tables, inline SVG charts.

Nothing is fetched at view time: styles sit in one ``<style>`` element and every figure is
inline SVG whose ids are prefixed per figure (many SVGs share one document). Verdicts carry
a word and a symbol besides their colour. Input: typed results (``judge.result.Outcome``)
and the history's recent trend per test, so the plugin (``--llmperf-html``) and ``llmperf
report`` draw the same page. Also ``llmperf history --html``'s page of trends."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.catalog import BUDGETS, FIGURES, HEADLINE, is_ceiling
from ..core.documents import output_kind, write_output
from ..core.formats import cell, fmt, fmt_or
from ..core.measurement import Measurement, PromptSeen, Turn
from ..core.settings import usable_cpus
from ..history.series import Trend, metric_order, steps, table, title, trend_data
from ..judge.budgets import BudgetState, BudgetStatus
from ..judge.result import BaselineVerdict, Outcome
from ..judge.verdict import HEADLINE_ORDER, BaselineStatus, Verdict, headline
from . import charts, record_charts
from .charts import section as load_curve
from .charts import trend_chart
from .session_file import (
    AB_HEADERS,
    PROMPT_COLUMNS,
    ab_budget_lines,
    ab_pairs_line,
    ab_rows,
    ab_title,
    against_agreement_rows,
    against_of,
    agreement_rows,
    comparison_cells,
    comparison_headers,
    detects_cell,
    summary_values,
    turns_of,
)
from .text import length_note, length_rows, load_state_rows, memory_rows, trace_rows
from .where import (
    ATTRIBUTION_HEADERS,
    LEGEND,
    Explained,
    attribution_phases,
    attribution_title,
    explained,
    html_headers,
    html_rows,
)

if TYPE_CHECKING:
    from ..history.series import Series
    from ..judge.parts import PartChange
    from ..judge.verdict import Comparison


#: The verdict of a result that has none (not compared).
NOT_COMPARED = BaselineVerdict(BaselineStatus.NOT_COMPARED)

#: The history's recent trend of a test (``history.series.attach``): ``{result.test: [trend_data]}``.
Trends = Mapping[str, Sequence[Trend]]
#: Under ``--llmperf-against``, a prompt set's pairs by test (its decision's ``by_request``:
#: ``session.against.by_request``): ``{result.test: by_request}``.
ByRequest = Mapping[str, Mapping[str, Any]]

#: A state a badge shows: a test's (a regression, over budget, its verdict against the baseline
#: or REF, why it was not compared) or an A/B budget's.
State = Verdict | BudgetStatus | BaselineStatus | BudgetState

#: state -> (css class, symbol), every member of each state type; the word is always printed next
#: to the colour.
LOOKS: dict[State, tuple[str, str]] = {
    Verdict.REGRESSION: ("bad", "\u25b2"),
    Verdict.MACHINE_SLOWER: ("warn", "\u223c"),
    Verdict.INCONCLUSIVE: ("warn", "?"),
    Verdict.IMPROVED: ("good", "\u25bc"),
    Verdict.UNCHANGED: ("same", "="),
    BudgetStatus.FAIL: ("bad", "\u25b2"),
    BudgetStatus.OK: ("good", "\u2713"),
    BudgetStatus.NONE: ("same", "\u00b7"),
    BudgetState.BREACHED: ("bad", "\u25b2"),
    BudgetState.UNAVAILABLE: ("bad", "\u25b2"),
    BudgetState.UNDECIDED: ("warn", "?"),
    BudgetState.MET: ("good", "\u2713"),
    BaselineStatus.ERROR: ("bad", "\u2716"),
    BaselineStatus.COMPARED: ("same", "\u00b7"),
    BaselineStatus.NO_BASELINE: ("same", "\u00b7"),
    BaselineStatus.OTHER_HARDWARE: ("same", "\u00b7"),
    BaselineStatus.WORKLOAD_CHANGED: ("same", "\u00b7"),
    BaselineStatus.NOT_COMPARED: ("same", "\u00b7"),
}
#: The tests' states counted first, the worst first (``HEADLINE_ORDER`` for the verdicts); the
#: others follow by their words.
WORST_FIRST = (Verdict.REGRESSION, BudgetStatus.FAIL, BaselineStatus.ERROR, *HEADLINE_ORDER[1:], BudgetStatus.OK)
#: A test over budget, as its badge says it.
OVER_BUDGET = "OVER BUDGET"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:0 0 6px;word-break:break-all}h3{font-size:14px;margin:14px 0 6px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:14px 16px;margin:14px 0}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0 8px}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left;white-space:normal}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-weight:600;font-size:12px;border:1px solid}
.bad{background:#fde2e0;color:#8e1b10;border-color:#e9a39b}.warn{background:#fff1d6;color:#7a4b00;border-color:#e8c27a}
.good{background:#e0f3e4;color:#155d27;border-color:#9fd1ab}.same{background:#eceff3;color:#3b4350;border-color:#c6ccd5}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:10px}
figure[data-figure="layer-bars"]{grid-column:1/-1}
figure{margin:0;border:1px solid #eee;border-radius:4px;padding:4px;background:#fff}
figure svg{width:100%;height:auto;display:block}figcaption{font-size:11.5px;color:#555;padding:2px 4px}
.notes{font-size:12.5px;color:#444;margin:4px 0}.notes li{margin:2px 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:12.5px;margin:4px 0}dt{color:#666}dd{margin:0}
code{font-size:12px}a{color:#1f5fbf}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def state_of(result: Outcome) -> tuple[State, str]:
    """A test's state and its word: REGRESSION, OVER BUDGET, then its verdict against the
    baseline (or REF), or why it was not compared (the verdict's cell)."""
    verdict = result.verdict or NOT_COMPARED
    if verdict.failures:
        return Verdict.REGRESSION, str(Verdict.REGRESSION)
    if result.over_budget:
        return BudgetStatus.FAIL, OVER_BUDGET
    if verdict.status is BaselineStatus.COMPARED:
        shown = headline(c.verdict for c in verdict.comparisons)
        return shown, str(shown)
    return verdict.status, verdict.short or "not compared"


def badge(state: State, text: str | None = None) -> str:
    css, symbol = LOOKS[state]
    return f'<span class="badge {css}">{symbol} {_e(text or state)}</span>'


def test_badge(result: Outcome) -> str:
    """The test's word, with the verdict's cell when it regressed (``REGRESSION decode``)."""
    state, word = state_of(result)
    return badge(state, word if state is BudgetStatus.FAIL else (result.verdict or NOT_COMPARED).short or word)


def scope_ids(svg: str, prefix: str) -> str:
    """Prefix every id (and reference to it) so inline SVGs cannot collide in one page."""
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    if not ids:
        return svg
    names = "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))
    pattern = re.compile(r'(\bid="|#)(' + names + r')(?=["\)])')
    return pattern.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", svg)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], raw: bool = False) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def budget_value(record: Measurement, key: str) -> float | None:
    """The statistic a budget key bounds, recomputed from the record (None: not in records)."""
    budget = BUDGETS.get(key)
    return None if budget is None else budget.from_record(record)


#: Budget key -> the figure (``Figures``) holding its statistic: a result without a record
#: (judged against ``--llmperf-against``'s REF) shows its budgets from them.
BUDGET_FIGURES = {f.budget_key: name for name, f in FIGURES.items() if f.bound}


def _budget_rows(result: Outcome) -> list[list[str]]:
    """One row per budget: its limit, the measured statistic and whether it holds."""
    figures = result.figures.values() if result.figures else {}
    rows = []
    for key, limit in sorted(result.budgets.items()):
        value = budget_value(result.record, key) if result.record else figures.get(BUDGET_FIGURES.get(key, ""))
        bound = "&ge; " if key in BUDGETS and not is_ceiling(key) else "&le; "  # a floor, else a ceiling
        rows.append([_e(key), bound + _e(fmt(limit)), _e(fmt_or(value)), _budget_badge(result, key, limit, value)])
    return rows


def _budget_badge(result: Outcome, key: str, limit: float, value: float | None) -> str:
    """ok, OVER BUDGET or "not in record": the budget recomputed from the record, else (no
    record, or no value in it) the result's own judgement of it."""
    if value is None or not result.record:
        ok = value is not None and key not in result.breached_budgets
    else:
        ok = BUDGETS[key].holds(value, limit)
    return badge(BudgetStatus.OK) if ok else (badge(BudgetStatus.FAIL) if value is not None else "not in record")


def _comparison_rows(comparisons: Sequence[Comparison], paired: bool = False) -> list[list[str]]:
    """``paired`` (against ``--llmperf-against``'s REF): the ratio this tree / REF and its CI."""
    return [
        [
            *map(_e, comparison_cells(c, paired)),
            f'<span title="{_e(c.reason)}">{badge(c.verdict)}</span>',
            f'<span title="{_e(c.reach())}">{_e(detects_cell(c))}</span>',
        ]
        for c in comparisons
    ]


#: The figures (``catalog.FIGURES``: label, unit; values from the record's ``summary``) of an
#: uncompared test's "now" table; the session summary's row shows ``catalog.HEADLINE``.
NOW_FIGURES = ("ttft_ms", "prefill_tps", "tpot_ms", "decode_tps", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms")


def _env(record: Measurement) -> str:
    hw, subj = record.hardware, record.subject
    items = [
        ("hardware", ", ".join(f"{k} {v}" for k, v in sorted(hw.items()) if v is not None)),
        ("subject", ", ".join(f"{k} {v}" for k, v in sorted(subj.items()) if v is not None)),
        ("commit", record.commit or "unknown"),
        ("recorded at", record.recorded_at if record.recorded_at is not None else "?"),
    ]
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def _chart_html(fig_id: str, caption: str, svg: str, prefix: str) -> str:
    return (
        f'<figure class="plot" data-figure="{fig_id}">{scope_ids(svg, prefix)}'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def test_section(
    index: int,
    result: Outcome,
    trend: Sequence[Mapping[str, object]] = (),
    against: str = "",
    by_request: Mapping[str, Any] | None = None,
) -> str:
    """One test's section; ``trend``: its recent sessions from the history (``Trends``);
    ``against``: the session's ``--llmperf-against`` REF (a test it could not pair is "not compared");
    ``by_request``: its decision's pairs of a prompt set there (``ByRequest``)."""
    record = result.record or Measurement.read({})
    verdict = result.verdict or NOT_COMPARED
    parts = [
        f'<section class="test" id="test-{index}" data-test="{_e(result.test)}" data-state="{_e(state_of(result)[1])}">',
        f"<h2>{_e(result.test)} {test_badge(result)}</h2>",
        _workload_notes(result, against),
    ]
    notes = _test_notes(verdict, record)
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    rows = _comparison_rows(verdict.comparisons, paired=bool(result.reference))
    if rows:
        parts.append(_table(comparison_headers([result])[1:], rows, raw=True))
    else:
        s = summary_values(result)
        now = [[FIGURES[k].label, FIGURES[k].unit, fmt_or(s.get(k))] for k in NOW_FIGURES]
        parts.append(_table(("metric", "unit", "now"), now))
    parts += where_html(explained([result]), f"t{index}w-")
    budget_rows = _budget_rows(result)
    if budget_rows:
        parts.append(_table(("budget", "limit", "measured", "status"), budget_rows, raw=True))
    parts += _memory_table(record)
    parts += _trace_table(record)
    parts += _lengths_table(record)
    parts += _prompt_table(result)
    parts += _turns_table(record.prompt or result.prompt)
    plots = _record_plots(index, result) + _by_request_plot(index, result, by_request) + _trend_plot(index, trend)
    parts.append('<div class="plots">' + "".join(plots) + "</div></section>")
    return "\n".join(parts)


def where_html(entries: Sequence[Explained], prefix: str) -> list[str]:
    """Where it went of one test or A/B (``where.explained``): the lines of the phases that
    moved, the parts chart (A's and B's parts of each phase side by side), the table of every
    part, and where llama.cpp's time went per layer and op when its pass ran."""
    out = []
    for e in entries:
        out += [
            f'<div class="where" data-where="{_e(e.test)}"><h3>Where it went</h3>',
            *_parts_html(e, prefix),
            *attribution_html(e.attribution),
            *([f'<p class="attribution-note">{_e(e.attribution_note)}</p>'] if e.attribution_note else []),
            "</div>",
        ]
    return out


def _parts_html(e: Explained, prefix: str) -> list[str]:
    """The why lines, the parts chart and table; nothing without parts."""
    if not e.parts:
        return []
    why = "".join(f"<li>{_e(line)}</li>" for line in e.why) or "<li>no phase moved; its parts as measured</li>"
    caption = f"The parts of each phase, medians: {e.sides[0]} (A) and {e.sides[1]} (B); hatched: moved"
    return [
        f'<ul class="notes">{why}</ul>',
        _chart_html("parts", caption, charts.render(charts.parts_chart, e.parts, e.sides), prefix),
        _table(html_headers(e), _sourced(html_rows(e.parts), e.parts), raw=True),
        f'<p class="notes">{_e(LEGEND)}</p>',
    ]


def _sourced(rows: Sequence[Sequence[str]], parts: Sequence[PartChange]) -> list[list[str]]:
    """The parts table's cells escaped, each part's label titled with its source (where its
    figure comes from)."""
    return [
        [_e(row[0]), f'<span title="{_e(p.source)}">{_e(row[1])}</span>', *(_e(c) for c in row[2:])]
        for row, p in zip(rows, parts)
    ]


def attribution_html(d: Mapping[str, object] | None) -> list[str]:
    """Where llama.cpp's time went, per layer and op (an attribution pass's comparison:
    ``judge.attribution.AttributionChange.to_json()``, a verdict's or an A/B entry's
    ``attribution``): its reason, each phase's reading and its top changes; nothing without one."""
    phases = attribution_phases(d)
    if d is None or not phases:
        return []
    out = [f'<div class="attribution"><h3>{_e(attribution_title(d))}</h3>']
    for phase, reading, rows in phases:
        out.append(f'<p class="notes"><b>{_e(phase)}</b>: {_e(reading or "no reading")}</p>')
        if rows:
            out.append(_table(ATTRIBUTION_HEADERS, rows))
    return [*out, "</div>"]


def _workload_notes(result: Outcome, against: str) -> str:
    """What was run (prompt and generated tokens, runs) and what it was judged against."""
    f, ref, verdict = result.figures, result.reference, result.verdict or NOT_COMPARED
    w: Mapping[str, object] = (result.record.identity if result.record else None) or (
        {"prompt_tokens": f.prompt_tokens, "max_tokens": f.output_tokens} if f else {}
    )
    if ref:
        judged = f"against REF {ref}: {verdict.pairs} interleaved pairs"
    elif against:
        judged = f"against REF {against}: not compared"
    else:
        judged = f"baseline: {'compared' if result.baseline_record else verdict.status if result.verdict else 'not compared'}"
    runs = summary_values(result).get("n_runs", f.runs if f else None)
    counts = [
        _counted(w.get("prompt_tokens"), "prompt tokens", "a prompt whose tokens the engine does not count"),
        _counted(w.get("max_tokens"), "generated per run", "generated tokens not counted"),
        _counted(runs, "runs", "runs not recorded"),
    ]
    return f'<p class="notes">{_e(", ".join(counts))}; {_e(judged)}</p>'


def _counted(value: object, noun: str, missing: str) -> str:
    """``24 prompt tokens``, or what stands for a count nobody took (never ``None ...``)."""
    return missing if value is None or value == "" else f"{value} {noun}"


def _test_notes(verdict: BaselineVerdict, record: Measurement) -> list[str]:
    """The verdict's failures and note, what changed since the baseline, each comparison's
    reach, the stability warnings."""
    notes = list(verdict.failures)
    if verdict.note:
        notes.append(verdict.note)
    if verdict.changes and verdict.status is not BaselineStatus.OTHER_HARDWARE:  # other hardware: the note names them
        notes.append("changed since the baseline: " + ", ".join(verdict.changes))
    notes += [f"{c.phase} {c.label}: {c.reach()}" for c in verdict.comparisons if c.mirror_of is None and c.reach()]
    return notes + list(record.stability.warnings if record.stability is not None else ())


def _memory_table(record: Measurement) -> list[str]:
    """The memory and start-up table (memory held, fresh model loads), when the record has them."""
    held = memory_rows(record.memory) if record.memory else []
    held += load_state_rows(record.model_loads, figures=True) if record.model_loads else []
    return [_table(("memory and start-up", "unit", "value", "source"), held)] if held else []


def _trace_table(record: Measurement) -> list[str]:
    """A replayed trace's summary (the stored ``load.trace``): its requests, span and pace, and
    how late the client sent them against their schedule (its own lag)."""
    rows = trace_rows(record.load.trace if record.load is not None else None, schedule=False)
    return [_table(("trace replay, open loop", "unit", "value", "sample"), rows)] if rows else []


def _lengths_table(record: Measurement) -> list[str]:
    """TTFT and prefill by prompt length (a prompt set whose lengths vary), with its rule's line."""
    lengths = record.prompt_lengths
    rows = length_rows(lengths)
    note = length_note(lengths)
    return (
        [_table(("by prompt length", "unit", "value", "sample"), rows), f'<ul class="notes"><li>{_e(note)}</li></ul>']
        if rows and note
        else []
    )


def _prompt_table(result: Outcome) -> list[str]:
    """A measured callable's prompt as llama.cpp saw it and its stream as the caller got it."""
    if not result.prompt:
        return []
    rows = [(label, cell(result.prompt.get(key))) for key, label in PROMPT_COLUMNS]
    return [_table(("your code's prompt and stream", "value"), rows)]


#: The "turn by turn" table's columns (a conversation's ``prompt.turns``, ``core.measurement.Turn``).
TURN_HEADERS = ("turn", "prompt tokens evaluated / reused", "TTFT p50 / p95 ms", "decode ms/token", "runs")


def _turns_table(prompt: PromptSeen | None) -> list[str]:
    """A conversation's figures turn by turn (the stored ``prompt.turns``): the prompt tokens
    llama.cpp evaluated and reused (its counters), TTFT p50 / p95, decode per token, runs."""
    rows = [
        [str(t.turn), _turn_tokens(t), f"{cell(t.ttft_p50_ms)} / {cell(t.ttft_p95_ms)}", cell(t.tpot_ms), str(t.runs)]
        for t in turns_of(prompt)
    ]
    return [f'<div class="turns"><h3>Conversation, turn by turn</h3>{_table(TURN_HEADERS, rows)}</div>'] if rows else []


def _turn_tokens(t: Turn) -> str:
    """A turn's prompt tokens evaluated / reused, or why they were not counted."""
    evaluated, reused = t.evaluated_prompt_tokens, t.prompt_reused_tokens
    if evaluated is None or reused is None:
        return "not counted: the callable drove no llama_cpp.Llama of this process"
    return f"{evaluated} / {reused}"


def _record_plots(index: int, result: Outcome) -> list[str]:
    """The record's charts (``record_charts.charts_for``), each against the baseline and budgets."""
    record = result.record or Measurement.read({})
    layers = record.layers
    rule = layers.outlier_rule if layers is not None and layers.has("outlier_rule") else ""
    plots = []
    for n, (fig_id, caption, fn) in enumerate(record_charts.charts_for(record)):
        svg = charts.render(fn, record, result.baseline_record, result.budgets)
        if fig_id == "layer-bars" and rule:
            caption += f"; outlier layers in red: {rule}"
        plots.append(_chart_html(fig_id, caption, svg, f"t{index}f{n}-"))
    return plots


def _by_request_plot(index: int, result: Outcome, by_request: Mapping[str, Any] | None) -> list[str]:
    """Under ``--llmperf-against``, a prompt set's TTFT against prompt length, REF and this tree
    (``record_charts.ttft_by_request``), when its decision kept the pairs' runs."""
    if not record_charts.draws_by_request(by_request):
        return []
    svg = charts.render(record_charts.ttft_by_request, by_request, result.budgets)
    return [_chart_html("ttft-by-length", record_charts.TTFT_BY_REQUEST, svg, f"t{index}r-")]


def _trend_plot(index: int, trend: Sequence[Mapping[str, object]]) -> list[str]:
    """The history's recent sessions of this test (``history.series.attach``), when there are any."""
    caption = "Recent trend: level per session with its 95% CI (the last is this session); dashed: change points"
    return [_chart_html("trend", caption, charts.render(trend_chart, trend), f"t{index}tr-")] if trend else []


def summary_section(results: Sequence[Outcome], created_at: str | None) -> str:
    """The session at a glance: how many tests in each state, a row per test, what changed in
    the subject, the environment, the load curve and the largest changes."""
    parts = [
        '<section id="summary">',
        "<h2>Summary</h2>",
        f"<p>{len(results)} measurement(s){' at ' + _e(created_at) if created_at else ''}: {_state_counts(results)}</p>",
        _table(
            ("test", "verdict", "budget", *(f.header for f in HEADLINE), "changed since the baseline"),
            [_summary_row(i, r) for i, r in enumerate(results)],
            raw=True,
        ),
        "<h3>Changed in the subject since the baseline</h3>",
        _changed_list(results),
    ]
    recorded = [r.record for r in results if r.record]  # none against --llmperf-against's REF (section above)
    parts += ["<h3>Environment (first measurement)</h3>", _env(recorded[0])] if recorded else []
    parts += _summary_charts(results)
    parts.append("</section>")
    return "\n".join(parts)


def _state_counts(results: Sequence[Outcome]) -> str:
    """A badge per state with its count, the worst first (``WORST_FIRST``)."""
    states = Counter(state_of(r) for r in results)
    rank = {state: i for i, state in enumerate(WORST_FIRST)}
    ranked = sorted(states.items(), key=lambda item: (rank.get(item[0][0], len(rank)), item[0][1]))
    return " ".join(badge(state, f"{n} {word}") for (state, word), n in ranked)


def _summary_row(i: int, r: Outcome) -> list[str]:
    """A test's row of the summary table: link, verdict, budget, headline figures, changes."""
    s = summary_values(r)
    return [
        f'<a href="#test-{i}">{_e(r.test)}</a>',
        test_badge(r),
        _e(r.budget),
        *(_e(fmt_or(s.get(f.key))) for f in HEADLINE),
        _e(", ".join((r.verdict or NOT_COMPARED).changes)) or "-",
    ]


def _changed_list(results: Sequence[Outcome]) -> str:
    """What changed in the subject since the baselines, with how many tests saw each change."""
    changes = Counter(c for r in results for c in (r.verdict or NOT_COMPARED).changes)
    if not changes:
        return "<p class='notes'>nothing, or no test was compared with a baseline</p>"
    return "<ul class='notes'>" + "".join(f"<li>{_e(c)} ({n} test(s))</li>" for c, n in changes.most_common()) + "</ul>"


def _summary_charts(results: Sequence[Outcome]) -> list[str]:
    """The session-wide charts: the served load curve and the largest changes, when there are any."""
    drawn = (
        (
            "load-curve",
            "Served load: throughput against per-request latency, one point per load level (label: concurrency)",
            load_curve(results),
            "load-",
        ),
        ("change-overview", "Largest changes with 95% CI (colour and label: verdict)", key_chart(results), "summary-"),
    )
    return [_chart_html(fig_id, caption, svg, prefix) for fig_id, caption, svg, prefix in drawn if svg]


def key_chart(results: Sequence[Outcome]) -> str | None:
    """The session at a glance (the Markdown summary's figure); None without comparisons."""
    compared = any((r.verdict or NOT_COMPARED).comparisons for r in results)
    return charts.render(charts.change_overview, results) if compared else None


#: From this many tests on, sections are drawn in worker processes (matplotlib is single-threaded).
PARALLEL_FROM = 16


def test_sections(
    results: Sequence[Outcome],
    workers: int | None = None,
    trends: Trends | None = None,
    against: str = "",
    by_request: ByRequest | None = None,
) -> list[str]:
    """Every test's section, in order. Big reports are split among fresh ``python -m
    pytest_llmperf.reports.html`` processes (the results' and trends' JSON in, sections out):
    nothing of the session's process (llama.cpp threads) is forked, and no caller needs a
    ``__main__`` guard as multiprocessing's spawn would. A chunk whose worker fails is drawn
    here instead. ``against``: the session's ``--llmperf-against`` REF, described. ``workers``:
    at most the usable CPUs (more would only time-slice, and start a process per chunk at once);
    ``by_request``: a prompt set's pairs against REF, by test."""
    trends = trends or {}  # a test without a trend: no trend figure
    by_request = by_request or {}
    workers = min(usable_cpus(), len(results), 8 if workers is None else max(1, workers))
    if workers <= 1 or len(results) < PARALLEL_FROM:
        return _sections_here(0, results, trends, against, by_request)
    bounds = [round(len(results) * k / workers) for k in range(workers + 1)]
    chunks = [(lo, list(results[lo:hi])) for lo, hi in pairwise(bounds)]
    # This process draws the first chunk itself (matplotlib is loaded here already).
    with ThreadPoolExecutor(workers - 1) as pool:
        others = pool.map(
            lambda chunk: _sections_in_worker(chunk[0], chunk[1], trends, against, by_request), chunks[1:]
        )
        first = _sections_here(chunks[0][0], chunks[0][1], trends, against, by_request)
        return first + [section for sections in others for section in sections]


def _sections_here(
    start: int, part: Sequence[Outcome], trends: Trends, against: str, by_request: ByRequest
) -> list[str]:
    """The sections of ``part`` (the tests from ``start`` on), drawn in this process."""
    return [
        test_section(start + i, r, trends.get(r.test, ()), against, by_request.get(r.test)) for i, r in enumerate(part)
    ]


def _sections_in_worker(
    start: int, part: Sequence[Outcome], trends: Trends, against: str, by_request: ByRequest
) -> list[str]:
    """The sections of ``part`` drawn by a ``--worker`` process; here when the worker fails."""
    job = {
        "start": start,
        "results": [r.to_json() for r in part],
        "against": against,
        "trends": {r.test: trends[r.test] for r in part if r.test in trends},
        "by_request": {r.test: by_request[r.test] for r in part if r.test in by_request},
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", __name__, "--worker"],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            check=True,
        )
        sections = json.loads(proc.stdout)
        if isinstance(sections, list) and len(sections) == len(part):
            return sections
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    return _sections_here(start, part, trends, against, by_request)


def _ab_badge(status: BudgetState) -> str:
    """An A/B budget's outcome: FAIL (breached, or agreement not available), met, undecided."""
    return badge(status, "FAIL" if status.fails else None)


def ab_section(ab: Sequence[Mapping[str, object]]) -> str:
    """The session's A/B comparisons (the session JSON's ``ab`` entries): per test its sides,
    the paired ratios, the output agreement and every budget's outcome; "" without any."""
    if not ab:
        return ""
    divs = [line for n, e in enumerate(ab) for line in _ab_div(n, e)]
    return "\n".join(['<section id="ab">', "<h2>A/B comparisons</h2>", *divs, "</section>"])


def _ab_div(n: int, e: Mapping[str, Any]) -> list[str]:
    """One A/B comparison: its sides and pairs, the paired ratios, the output agreement, the budgets."""
    failing = bool(e.get("failures"))
    parts = [
        f'<div class="ab" id="ab-{n}" data-test="{_e(e["test"])}" data-state="{"FAIL" if failing else "ok"}">',
        f"<h3>{_e(e['test'])}: {_e(ab_title(e))} " + badge(BudgetStatus.FAIL if failing else BudgetStatus.OK) + "</h3>",
        f'<p class="notes">{_e(ab_pairs_line(e))}; '
        f"A: {_e(e['a'].get('engine', e['a']['name']))}; B: {_e(e['b'].get('engine', e['b']['name']))}</p>",
    ]
    rows = ab_rows(e)
    if rows:
        parts.append(_table(AB_HEADERS, rows))
    parts += where_html(explained([], [e]), f"ab{n}w-")
    agreement = agreement_rows(e)
    if agreement:
        parts.append(_table(("output agreement", "value"), agreement))
    budgets = ab_budget_lines(e)
    if budgets:
        items = "".join(f"<li>{_ab_badge(status)} {_e(line)}</li>" for status, line in budgets)
        parts.append(f'<ul class="notes">{items}</ul>')
    parts.append("</div>")
    return parts


def render_html(
    results: Sequence[Outcome],
    created_at: str | None = None,
    workers: int | None = None,
    trends: Trends | None = None,
    against: Mapping[str, Any] | None = None,
    ab: Sequence[Mapping[str, object]] = (),
) -> str:
    """The whole page; ``workers``: processes drawing charts (default: usable CPUs, max 8);
    ``trends``: each test's recent sessions from the history (``history.series.attach``);
    ``against``: what ``--llmperf-against`` compared (``against_section``); ``ab``: the
    session's A/B comparisons (``ab_section``)."""
    charts.require_matplotlib()
    ref = (against or {}).get("described") or against_of(results)
    title = f"pytest-llmperf report against {ref}" if ref else "pytest-llmperf report"
    body = [against_section(results, against), summary_section(results, created_at), ab_section(ab)]
    decisions = (against or {}).get("decisions") or ()
    pairs = {str(d.get("test")): d["by_request"] for d in decisions if isinstance(d, Mapping) and d.get("by_request")}
    body += test_sections(results, workers, trends, ref, pairs)
    return _page(title, body, '<meta name="viewport" content="width=device-width, initial-scale=1">')


def _page(title: str, body: Iterable[str], head: str = "") -> str:
    """A whole page: ``title`` its title and heading, ``head`` more of its head, the non-empty
    parts of ``body`` a line each."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{head}<title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body><main><h1>{_e(title)}</h1>\n"
        + "\n".join(filter(None, body))
        + "\n</main></body></html>\n"
    )


def markdown_lines(html_path: Path | str, md_path: Path | None, results: Sequence[Outcome]) -> list[str]:
    """What the Markdown summary says about the HTML report: a link relative to the Markdown
    file and the key figure embedded as an SVG file next to it (Markdown cannot inline SVG).
    Without a Markdown file (e.g. $GITHUB_STEP_SUMMARY, which shows no local files), or when
    either is not a file (standard output, a device, a FIFO: nothing is written beside those)
    only the path is named."""

    def is_file(path: Path | str) -> bool:
        try:
            return output_kind(path) == "file"
        except OSError:
            return False

    if md_path is None or not is_file(md_path) or not is_file(html_path):
        return [f"Plots: HTML report `{html_path}` (keep it as a CI artifact)."]
    base = Path(md_path).resolve().parent
    lines = [f"Plots: [HTML report]({Path(os.path.relpath(Path(html_path).resolve(), base)).as_posix()})"]
    svg = key_chart(results)
    if svg:
        figure = Path(md_path).with_suffix(".svg")
        write_output(figure, '<?xml version="1.0" encoding="utf-8"?>\n' + svg)
        lines.append(f"![Compared metrics, most notable first]({figure.name})")
    return lines


def _worker() -> None:
    """``python -m pytest_llmperf.reports.html --worker``: {"start", "results", "trends"} on
    stdin (``Outcome.to_json()`` each, rebuilt here), the sections as a JSON list on stdout."""
    job = json.load(sys.stdin)
    results = [Outcome.from_json(r, check=False) for r in job["results"]]
    trends = job.get("trends") or {}
    against = job.get("against") or ""
    pairs = job.get("by_request") or {}
    json.dump(_sections_here(job["start"], results, trends, against, pairs), sys.stdout)


def against_section(results: Sequence[Outcome], against: Mapping[str, Any] | None = None) -> str:
    """What ``--llmperf-against`` compared: REF and each side (``Session.against_sides``, or the
    session file's ``against``); "" when nothing was judged against REF."""
    against = against or {}
    described = against.get("described") or against_of(results)
    if not described:
        return ""
    sides = sorted((against.get("sides") or {}).items(), key=lambda kv: kv[0] != "REF")
    items = [("REF", described), *((f"side {name}", _side_text(side)) for name, side in sides)]
    pairs = [r for r in results if r.reference and r.verdict is not None]
    return (
        '<section id="against">' + f"<h2>Judged against REF {_e(described)}</h2>"
        f'<p class="notes">{len(pairs)} of {len(results)} measurement(s) compared with REF\'s runs interleaved '
        "pair by pair in this session (seeded AB/BA order, warm-ups on both sides); each ratio is this tree / "
        "REF with its 95% CI (Wilcoxon); baselines were neither read nor written.</p><dl>"
        + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items)
        + "</dl>"
        + _against_agreement(results)
        + "</section>"
    )


def _side_text(side: Mapping[str, Any]) -> str:
    """One side of ``--llmperf-against``: what it is, its Python and llama-cpp-python, whose code it runs."""
    code = ", ".join(f"{k} from {v}" for k, v in (side.get("code") or {}).items() if v) or "no code of this tree"
    return (
        f"{side.get('shown', '?')}: Python {side.get('python') or '?'} "
        f"({side.get('interpreter', '?')}), llama-cpp-python {side.get('llama_cpp') or '?'}; {code}"
    )


def _against_agreement(results: Sequence[Outcome]) -> str:
    """The output agreement with REF, when a result has one."""
    headers, agreement = against_agreement_rows(results)
    if not agreement:
        return ""
    return "<h3>Output agreement with REF (A: REF, B: this tree)</h3>" + _table(
        headers, [[row[0].strip("`"), *row[1:]] for row in agreement]
    )


def history_page(series: Sequence[Series]) -> str:
    """``llmperf history --html``: per test and hardware, the trend plots and the tables."""
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in sorted(series, key=metric_order):
        groups.setdefault((s.name, s.hardware_key), []).append(s)
    body = []
    for n, ((name, hw), members) in enumerate(groups.items()):
        found = {id(s): steps(s) for s in members}
        svg = charts.render(trend_chart, [trend_data(s, found[id(s)]) for s in members])
        lines = [step.line() for s in members for step in found[id(s)]]
        body.append(
            f'<section class="test" data-test="{html.escape(name)}"><h2>{html.escape(name)}</h2>'
            f'<p class="notes">{html.escape(hw)}; {len(members[0].points)} session(s)</p>'
            f'<figure class="plot" data-figure="trend">{scope_ids(svg, f"h{n}-")}<figcaption>'
            "Level per session with its 95% CI; dashed: change points (E-divisive, permutation test), "
            "labelled with the step and the subject change that coincides</figcaption></figure>"
            + ("<ul class='notes'>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>" if lines else "")
            + "".join(f"<pre>{html.escape(title(s))}\n{html.escape(table(s, found[id(s)]))}</pre>" for s in members)
            + "</section>"
        )
    return _page("pytest-llmperf history", body)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker()
