"""Engines turn a workload into run traces. They know nothing of pytest."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..core.workload import EngineInfo
from ..core.workload import RunTrace
from ..core.workload import Workload
from .callable import CallableEngine


@runtime_checkable
class Engine(Protocol):
    """Anything that can run one request of a workload and report its clock readings."""

    def info(self) -> EngineInfo: ...

    def run(self, workload: Workload, run_index: int) -> RunTrace: ...


__all__ = ["CallableEngine", "Engine"]
