"""How figures are stored: six significant figures, one definition for every JSON writer
(records, per-layer profiles, diagnostics), so a value read back compares equal."""

from __future__ import annotations


def sig6(value: float | None) -> float | None:
    """``value`` to six significant figures (None stays None)."""
    return None if value is None else float(f"{value:.6g}")

def fmt(value: float) -> str:
    """Three significant figures for small values, no false precision for large ones."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"

def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
