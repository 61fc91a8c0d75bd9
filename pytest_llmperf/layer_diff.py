"""Per-layer diff between two records that both carry layer timing: which layers got slower.

Each layer's per-run medians are the samples (runs are independent, tokens within a run are
not); a layer counts as slower when a one-sided Mann-Whitney U test says so at ``alpha``
after Holm over all layers of both phases, and its median grew by more than ``threshold``.
This is a diagnosis next to the phase verdicts, which stay the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from scipy.stats import mannwhitneyu

from .compare import holm


@dataclass(frozen=True)
class LayerChange:
    phase: str
    name: str
    baseline_ms: float
    now_ms: float
    p_value: float  # Holm-adjusted, one-sided (now slower)
    slower: bool

    @property
    def change_pct(self) -> float:
        return (self.now_ms / self.baseline_ms - 1) * 100 if self.baseline_ms else 0.0

    def line(self) -> str:
        return (
            f"{self.phase} {self.name}: {self.now_ms:.3g} ms vs {self.baseline_ms:.3g} ms "
            f"({self.change_pct:+.1f}%, p={self.p_value:.2g} Holm)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "name": self.name,
            "baseline_ms": self.baseline_ms,
            "now_ms": self.now_ms,
            "change_pct": self.change_pct,
            "p_value": self.p_value,
            "slower": self.slower,
        }


def compare_layers(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any], *, alpha: float = 0.01, threshold: float = 0.05
) -> tuple[LayerChange, ...]:
    """Every layer of both phases, baseline vs now; () when either record has no layer data or
    the models' layers differ."""
    base, cand = baseline.get("layers"), candidate.get("layers")
    if not base or not cand:
        return ()
    rows = []
    for phase in ("prefill", "decode"):
        b, c = base["phases"].get(phase), cand["phases"].get(phase)
        if not b or not c or b["names"] != c["names"]:
            return ()
        b_runs, c_runs = np.asarray(b["per_run_ms"], float), np.asarray(c["per_run_ms"], float)
        for i, name in enumerate(b["names"]):
            if len(b_runs) > 1 and len(c_runs) > 1:
                p = float(mannwhitneyu(c_runs[:, i], b_runs[:, i], alternative="greater").pvalue)
            else:
                p = 1.0
            rows.append((phase, name, float(b["median_ms"][i]), float(c["median_ms"][i]), p))
    adjusted = holm([r[4] for r in rows]) if rows else []
    return tuple(
        LayerChange(phase, name, b_ms, c_ms, p, p < alpha and c_ms > b_ms * (1 + threshold))
        for (phase, name, b_ms, c_ms, _), p in zip(rows, adjusted)
    )

