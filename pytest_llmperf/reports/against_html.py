"""The HTML report's section on ``--llmperf-against``: REF, and what each side was (interpreter,
llama-cpp-python, where the code under test came from)."""

from __future__ import annotations

from html import escape
from typing import Any, Mapping, Sequence

from ..judge.result import MeasurementResult
from .session_file import against_of


def against_section(results: Sequence[MeasurementResult], against: Mapping[str, Any] | None = None) -> str:
    """What ``--llmperf-against`` compared: REF and each side (``Session.against_sides``, or the
    session file's ``against``); "" when nothing was judged against REF."""
    described = (against or {}).get("described") or against_of(results)
    if not described:
        return ""
    items = [("REF", described)]
    for name, side in sorted(((against or {}).get("sides") or {}).items(), key=lambda kv: kv[0] != "REF"):
        code = ", ".join(f"{k} from {v}" for k, v in (side.get("code") or {}).items() if v) or "no code of this tree"
        items.append((f"side {name}", f"{side.get('shown', '?')}: Python {side.get('python') or '?'} "
                      f"({side.get('interpreter', '?')}), llama-cpp-python {side.get('llama_cpp') or '?'}; {code}"))
    pairs = sorted(r.verdict.pairs for r in results if r.reference and r.verdict is not None)
    return ('<section id="against">' + f"<h2>Judged against REF {escape(described)}</h2>"
            f'<p class="notes">{len(pairs)} of {len(results)} measurement(s) compared with REF\'s runs interleaved '
            "pair by pair in this session (seeded AB/BA order, warm-ups on both sides); each ratio is this tree / "
            "REF with its 95% CI (Wilcoxon); baselines were neither read nor written.</p><dl>"
            + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items) + "</dl></section>")
