"""How figures are stored: six significant figures, one definition for every JSON writer
(records, per-layer profiles, diagnostics), so a value read back compares equal."""

from __future__ import annotations


def sig6(value: float | None) -> float | None:
    """``value`` to six significant figures (None stays None)."""
    return None if value is None else float(f"{value:.6g}")
