"""Peak resident memory of this process over a measurement.

Linux keeps the peak (VmHWM) and lets a process reset it (write "5" to /proc/self/clear_refs),
so the peak can be taken over the measurement alone; elsewhere, or when the reset is refused,
the process-lifetime peak from getrusage is reported, and ``scope`` says which.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class PeakRss:
    bytes: int
    scope: str  # "measurement" (peak reset before it) or "process" (lifetime peak)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss(was_reset: bool) -> PeakRss:
    hwm = _vm_hwm_bytes()
    if hwm is not None:
        return PeakRss(hwm, "measurement" if was_reset else "process")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return PeakRss(maxrss if sys.platform == "darwin" else maxrss * 1024, "process")
