"""Where it went, in every report: the parts of each phase (``judge.parts``) of the session's
comparisons, gathered once and shown by the terminal summary (a block of at most the
terminal's width under the comparison table), the Markdown summary (``session_file``'s "Where
it went" section) and the HTML report (its tables; its chart is ``charts.parts_chart``).

A is the baseline, REF or the A/B's A; B is this run, this tree or its B. The why lines name
the phases that moved; the terminal and the Markdown show those phases' parts, the HTML report
and the JSON every part."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import catalog
from ..core.formats import render_table
from ..judge.parts import MATERIAL_SHARE, PartChange
from ..judge.result import Outcome
from ..judge.verdict import fmt_value
from .text import short_ids, wrap, wrapped_table

#: The phases that have parts, in the catalog's order (prefill, decode).
PHASES: tuple[str, ...] = tuple(dict.fromkeys(m.phase for m in catalog.PARTS))

#: A parts table's columns after the part (its first column names the phase and unit) and
#: both sides' medians (headed by the sides' names: ``Explained.headers``).
PART_HEADERS = ("change", "95% CI", "moved")

#: A side's name in a table header is cut to this many characters.
SIDE_HEADER = 12

#: The terminal shows this many comparisons whose phase moved (``-v``: every one).
TERMINAL_SHOWN = 5

#: How a parts table reads (the Markdown and HTML reports' note).
LEGEND = (
    "Each part's median on both sides (A: the baseline, REF or an A/B's A; B: this run, this tree "
    "or its B); llama.cpp's own parts change as a ratio B/A, the others as B - A in their unit; "
    f"moved: in a phase whose headline moved, significant after Holm over the phase's parts and at least "
    f"{MATERIAL_SHARE:.0%} of the phase's time."
)


@dataclass(frozen=True)
class Explained:
    """One comparison whose parts were compared."""

    test: str
    #: ``B [name] vs A [name]`` for an A/B, else "".
    title: str
    #: The verdict's short word (``REGRESSION decode``), or an A/B's ``FAIL``/"".
    state: str
    #: One line per phase that moved (``judge.parts.why_line``).
    why: tuple[str, ...]
    parts: tuple[PartChange, ...]
    #: The comparison fails its test (a regression, an A/B budget).
    failed: bool
    #: What A and B were: ("baseline", "now"), ("REF", "this tree") or the A/B's names.
    sides: tuple[str, str] = ("A", "B")
    #: Where llama.cpp's time went, per layer and op (``judge.attribution``'s JSON), when its
    #: pass ran; else None.
    attribution: Mapping[str, object] | None = None
    #: Why a pass that was due did not run (an A/B's ``attribution_note``), else "".
    attribution_note: str = ""

    def attribution_text(self) -> list[str]:
        """The attribution's title and readings when its pass ran, else the note why it did not."""
        return attribution_lines(self.attribution) or ([self.attribution_note] if self.attribution_note else [])

    @property
    def moved_phases(self) -> tuple[str, ...]:
        """The phases whose headline moved: each why line starts with its phase."""
        return tuple(p for p in PHASES if any(line.startswith(p + " ") for line in self.why))

    def of_phase(self, phase: str) -> tuple[PartChange, ...]:
        """The phase's parts in the catalog's order."""
        return tuple(p for p in self.parts if p.phase == phase)

    def headers(self, phase: str) -> tuple[str, ...]:
        """A moved phase's parts table's headers: ``decode (ms/token)``, both sides' names, ``PART_HEADERS``."""
        return (phase_header(phase, self.of_phase(phase)), *side_headers(self.sides), *PART_HEADERS)

    def name(self, shown: Mapping[str, str] | None = None) -> str:
        """``test_x`` or ``test_x: B [new] vs A [old]``; ``shown``: test ids as the terminal shows them."""
        test = (shown or {}).get(self.test, self.test)
        return f"{test}: {self.title}" if self.title else test


def side_headers(sides: tuple[str, str]) -> tuple[str, str]:
    """Both sides' names as a parts table's headers: cut to ``SIDE_HEADER`` characters where
    the cut names still read apart, else ``A``/``B`` (the comparison's title names them whole)."""
    if all(len(s) <= SIDE_HEADER for s in sides):
        return sides
    cut = tuple(_clip(s, SIDE_HEADER) for s in sides)
    return (cut[0], cut[1]) if cut[0] != cut[1] else ("A", "B")


def explained(results: Iterable[Outcome], ab: Iterable[Mapping[str, Any]] = ()) -> list[Explained]:
    """Every comparison of the session with parts (or an attribution pass's comparison): the
    results' verdicts (against a baseline or REF), then the A/B comparisons (session JSON ``ab``
    entries); none without either."""
    out = []
    for r in results:
        v = r.verdict
        if v is not None and (v.parts or v.attribution is not None):
            sides = ("REF", "this tree") if v.reference else ("baseline", "now")
            attribution = None if v.attribution is None else v.attribution.to_json()
            out.append(Explained(r.test, "", v.short, tuple(v.why()), v.parts, r.regressed, sides, attribution))
    for e in ab:
        parts = tuple(PartChange.from_json(p) for p in e.get("parts") or ())
        if parts or e.get("attribution") or e.get("attribution_note"):
            a, b = e["a"]["name"], e["b"]["name"]
            failed = bool(e.get("failures"))
            out.append(
                Explained(
                    str(e.get("test", "")),
                    f"B [{b}] vs A [{a}]",
                    "FAIL" if failed else "",
                    tuple(e.get("why") or ()),
                    parts,
                    failed,
                    (a, b),
                    e.get("attribution") or None,
                    str(e.get("attribution_note") or ""),
                )
            )
    return out


def moved(entries: Iterable[Explained]) -> list[Explained]:
    """The comparisons whose phase moved (a why line), the failing ones first."""
    return sorted((e for e in entries if e.why), key=lambda e: not e.failed)


def part_cells(p: PartChange, unit: bool = True) -> list[str]:
    """A part's row: its label, A's and B's medians, the change (``x1.01`` or ``+0.903 ms/token``;
    ``unit=False``: ``+0.903``), its 95% CI, and whether it moved."""
    mark = "moved" if p.moved else "-"
    return [p.label, fmt_value(p.a_median), fmt_value(p.b_median), p.change_text(unit), p.ci_text(), mark]


def phase_header(phase: str, parts: Sequence[PartChange]) -> str:
    """``decode (ms/token)``: the first column's header (a phase's parts share their unit)."""
    units = sorted({p.unit for p in parts})
    return f"{phase} ({', '.join(units)})" if units else phase


# --- the terminal ---------------------------------------------------------------------------


def terminal_lines(entries: Sequence[Explained], width: int, *, verbose: bool = False) -> list[str]:
    """The terminal's "where it went" block: per comparison whose phase moved (at most
    ``TERMINAL_SHOWN``; ``verbose``: all), its name, its why lines wrapped to ``width`` and a
    table of each moved phase's parts; every line at most ``width`` characters."""
    shown_moved = moved(entries)
    if not shown_moved:
        return []
    names = short_ids([e.test for e in shown_moved])
    chosen = shown_moved if verbose else shown_moved[:TERMINAL_SHOWN]
    lines = [line for e in chosen for line in _entry_lines(e, names, width)]
    rest = len(shown_moved) - len(chosen)
    if rest:
        lines += _wrap(
            f"llmperf: {rest} more comparison(s) whose phase moved: -v shows them; the JSON, Markdown "
            "and HTML reports have every one",
            width,
            "",
        )
    return lines


def _entry_lines(e: Explained, names: Mapping[str, str], width: int) -> list[str]:
    """One comparison: its name and state, its why lines, a parts table per moved phase, and
    the attribution's readings when its pass ran."""
    head = e.name(names) + (f" ({e.state})" if e.state else "")
    lines = wrap(head, width)  # a test's name whole: cut, two tests could read alike
    for why in e.why:
        lines += _wrap(why, width, "  ", "    ")
    for phase in e.moved_phases:
        lines += ["  " + line for line in _phase_table(e.headers(phase), e.of_phase(phase), width - 2).splitlines()]
    for line in e.attribution_text():  # per layer and op, when its pass ran; else why not
        lines += _wrap(line, width, "  ", "    ")
    return lines


def _phase_table(headers: Sequence[str], parts: Sequence[PartChange], width: int) -> str:
    """A phase's parts table; without the unit in its change cells when that is too wide
    (the first header names it), then with its labels cut to fit."""
    table = render_table(headers, [part_cells(p) for p in parts])
    if all(len(line) <= width for line in table.splitlines()):
        return table
    return wrapped_table(headers, [part_cells(p, unit=False) for p in parts], width)  # labels wrapped, never cut


def _wrap(text: str, width: int, indent: str, subsequent: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent if subsequent is None else subsequent,
        break_on_hyphens=False,
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


# --- HTML -----------------------------------------------------------------------------------

#: The HTML report's parts table: every part of every phase (a part's source is its label's title).
HTML_HEADERS = ("phase", "part", "A", "B", "change", "95% CI", "p (Holm)", "moved")


def html_headers(e: Explained) -> tuple[str, ...]:
    """``HTML_HEADERS`` with both sides' names for A and B."""
    return ("phase", "part", *(f"{s} ({x})" for s, x in zip(e.sides, "AB")), *HTML_HEADERS[4:])


def html_rows(parts: Sequence[PartChange]) -> list[list[str]]:
    """Every part's row of the HTML report's table (plain text; the caller escapes, and shows
    the part's ``source`` on its label)."""
    rows = []
    for p in parts:
        label, a, b, change, ci, was = part_cells(p)
        rows.append([p.phase, label, a, b, change, ci, f"{p.p_value:.3g}", was])
    return rows


# --- where llama.cpp's time went: the attribution pass (judge.attribution's JSON) --------------

#: An attribution's top changes table: at most this many slices per phase.
ATTRIBUTION_TOP = 8

#: Its columns: what the slice is (layer, op type, op group), its name, both sides' medians
#: (ms per step), the ratio B/A and its 95% CI, whether it moved.
ATTRIBUTION_HEADERS = ("slice", "name", "A ms", "B ms", "B/A", "95% CI", "moved")

#: The attribution's kinds of slice (its JSON's per-phase keys) and what a table calls them.
SLICE_KINDS = (("layers", "layer"), ("groups", "op group"), ("ops", "op type"))


def attribution_phases(d: Mapping[str, Any] | None) -> list[tuple[str, str, list[list[str]]]]:
    """Per phase of an attribution (``judge.attribution.AttributionChange.to_json()``: a
    verdict's or an A/B entry's ``attribution``): (phase, its one-line reading, its top changes:
    the slices that moved, the largest change in ms first, at most ``ATTRIBUTION_TOP``); none
    without one."""
    if not d:
        return []
    out = []
    for phase, body in (d.get("phases") or {}).items():
        moved_slices = [(label, s) for kind, label in SLICE_KINDS for s in body.get(kind) or () if s.get("moved")]
        moved_slices.sort(key=lambda ls: -abs(float(ls[1].get("b_ms") or 0) - float(ls[1].get("a_ms") or 0)))
        rows = [_slice_cells(label, s) for label, s in moved_slices[:ATTRIBUTION_TOP]]
        out.append((str(phase), str(body.get("reading") or ""), rows))
    return out


def _slice_cells(label: str, s: Mapping[str, Any]) -> list[str]:
    """One slice's row (``ATTRIBUTION_HEADERS``); a slice one side lacks says which has it."""
    a, b, ratio, low, high = (s.get(k) for k in ("a_ms", "b_ms", "ratio", "ci_low", "ci_high"))
    only = "A" if not b else "B"
    return [
        label,
        str(s.get("name", "?")),
        fmt_value(float(a or 0.0)) if ratio is not None or only == "A" else "-",
        fmt_value(float(b or 0.0)) if ratio is not None or only == "B" else "-",
        f"only in {only}" if ratio is None else f"{float(ratio):.2f}",
        f"{float(low):.2f}..{float(high):.2f}" if low is not None and high is not None else "n/a",
        "moved" if s.get("moved") else "-",
    ]


def attribution_title(d: Mapping[str, object]) -> str:
    """``Where llama.cpp's time went (llama.cpp's decode time moved): A REF, B this tree``."""
    return f"Where llama.cpp's time went ({d.get('reason') or 'asked'}): A {d.get('a', 'A')}, B {d.get('b', 'B')}"


def attribution_lines(d: Mapping[str, object] | None) -> list[str]:
    """The attribution's title and each phase's reading, one line each (the Markdown's)."""
    phases = attribution_phases(d)
    if d is None or not phases:
        return []
    return [attribution_title(d), *(f"{phase}: {reading}" for phase, reading, _ in phases if reading)]
