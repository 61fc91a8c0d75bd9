"""Environment fingerprint, in two halves.

*Hardware* (CPU, cores, memory, GPU, OS, architecture) must match for two measurements to be
comparable: a baseline from a laptop says nothing about a CI runner. *Subject* (llama.cpp
build, model file, quantization, threads, offload, context, our version, Python) is what a
regression test exists to change: it is recorded and its changes are printed next to the
verdict, but the comparison runs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from .documents import JSONValue
from .settings import usable_cpus
from .workload import LLAMA_SETTINGS, EngineInfo

#: Bytes of a model file hashed for its identity: the GGUF header, metadata and tensor table
#: sit at the start, so this changes with any change of shape, type, tokenizer or metadata,
#: and stays cheap for multi-GB files. Size and the hash of the last block cover the weights'
#: tail.
MODEL_HEAD_BYTES = 4 * 1024 * 1024
MODEL_TAIL_BYTES = 64 * 1024


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> int | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_model() -> str | None:
    """NVIDIA GPU names when nvidia-smi is present; None otherwise (CPU-only machines)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:  # its error ("NVIDIA-SMI has failed ...") is on stdout: not a GPU name
        return None
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
    return ", ".join(names) or None


def hardware() -> dict[str, JSONValue]:
    return {
        "cpu": _cpu_model(),
        "logical_cpus": usable_cpus(),
        "memory_gib": _memory_gib(),
        "gpu": _gpu_model(),
        "os": platform.system(),
        "arch": platform.machine(),
    }


def hardware_key(hw: Mapping[str, object]) -> str:
    """A short, readable key: several machines' baselines live side by side under these."""
    digest = hashlib.sha256(repr(sorted(hw.items())).encode()).hexdigest()[:8]
    return f"{str(hw.get('os', '?')).lower()}-{hw.get('arch', '?')}-{hw.get('logical_cpus', '?')}cpu-{digest}"


def model_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of the file's first 4 MiB, last 64 KiB and size: milliseconds even for GBs."""
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with p.open("rb") as fh:
        h.update(fh.read(MODEL_HEAD_BYTES))
        if size > MODEL_HEAD_BYTES:
            fh.seek(max(size - MODEL_TAIL_BYTES, MODEL_HEAD_BYTES))
            h.update(fh.read())
    return h.hexdigest()[:16]


def subject(info: EngineInfo) -> dict[str, JSONValue]:
    return {
        "engine": info.engine,
        "backend_version": info.backend_version,
        "model": info.model,
        "model_digest": model_digest(info.model_path) if info.model_path else None,
        "model_size_bytes": info.model_size_bytes,
        "quantization": info.quantization,
        # Every llama.cpp setting; stored schema names (baselines, history) where they are not the
        # settings' (``stored``: llama.cpp's ``n_threads``, ``n_gpu_layers``; settings.RENAMED).
        **{s.subject_key: getattr(info, s.name) for s in LLAMA_SETTINGS.values() if s.fingerprint},
        "llmperf_version": __version__,
        "python": platform.python_version(),
    }


SUBJECT_LABELS = {
    "backend_version": "llama-cpp-python",
    "model_digest": "model file",
    "model_size_bytes": "model size",
    "quantization": "model",
    **{s.subject_key: s.label or s.name for s in LLAMA_SETTINGS.values() if s.fingerprint},
    "llmperf_version": "pytest-llmperf",
    "python": "Python",
    "engine": "engine",
    "model": "model name",
}


#: Subject keys added after baselines were first recorded: a record without one is not changed.
NEWER_KEYS = frozenset(s.subject_key for s in LLAMA_SETTINGS.values() if s.fingerprint and s.newer)


def subject_changes(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """``["llama-cpp-python 0.3.35 -> 0.3.36", "threads 2 -> 1"]``: what changed since."""
    changes = []
    for key, label in SUBJECT_LABELS.items():
        if key == "model_size_bytes" and before.get("quantization") != after.get("quantization"):
            continue  # the quantization line says it
        if key in NEWER_KEYS and key not in before:
            continue  # recorded before the setting was: not a change
        if before.get(key) != after.get(key):
            changes.append(f"{label} {before.get(key)} -> {after.get(key)}")
    # Keys a pytest_llmperf_fingerprint hook added (pytest_plugin/hooks.py), named as given; one the
    # baseline does not have yet is not a change (as NEWER_KEYS).
    for key in sorted(set(before) - SUBJECT_LABELS.keys()):
        if before.get(key) != after.get(key):
            changes.append(f"{key} {before.get(key)} -> {after.get(key)}")
    return changes


@dataclass(frozen=True)
class Fingerprint:
    hardware: dict[str, JSONValue]
    subject: dict[str, JSONValue]

    @property
    def hardware_key(self) -> str:
        return hardware_key(self.hardware)


HARDWARE_LABELS = {
    "cpu": "CPU",
    "logical_cpus": "usable CPUs",
    "memory_gib": "memory GiB",
    "gpu": "GPU",
    "os": "OS",
    "arch": "arch",
}


def hardware_differences(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """``["CPU 'Xeon A' -> 'EPYC B'", "usable CPUs 8 -> 2"]``: why two machines' timings are
    not comparable, field by field (keys absent from both are ignored)."""
    keys = list(HARDWARE_LABELS) + sorted((set(before) | set(after)) - set(HARDWARE_LABELS))
    return [
        f"{HARDWARE_LABELS.get(k, k)} {before.get(k)!r} -> {after.get(k)!r}"
        for k in keys
        if before.get(k) != after.get(k)
    ]


def other_hardware_note(
    recorded: Mapping[str, Mapping[str, object]],
    hardware_key: str,
    here: Mapping[str, object],
    hint: str = "record one with --llmperf-update-baselines",
) -> str:
    """The "not comparable here" note, naming the fingerprint fields that differ between this
    machine (``here``: its hardware fingerprint) and the recorded one closest to it (fewest
    differing fields; ``recorded``: each recorded hardware key's fingerprint)."""
    differs = _closest_differences(recorded, here) if here else ""
    return (
        f"not comparable here: baselines exist only for other hardware ({', '.join(sorted(recorded))}); "
        f"this machine is {hardware_key}{differs}; {hint}"
    )


def closest_hardware(
    recorded: Mapping[str, Mapping[str, object]], here: Mapping[str, object]
) -> tuple[str, list[str]] | None:
    """The recorded hardware key with the fewest fingerprint fields unlike ``here`` (the first
    by key among equals) and those fields; None when none is recorded."""
    diffs = {key: hardware_differences(hw, here) for key, hw in recorded.items()}
    key = min(diffs, key=lambda k: (len(diffs[k]), k), default=None)
    return None if key is None else (key, diffs[key])


def _closest_differences(recorded: Mapping[str, Mapping[str, object]], here: Mapping[str, object]) -> str:
    """``; differs from KEY (closest of N recorded): cpu 'a' -> 'b'; ...``: the recorded hardware
    with the fewest fields unlike ``here``, and those fields; "" when none is recorded."""
    closest = closest_hardware(recorded, here)
    if closest is None:
        return ""
    fields = "; ".join(closest[1]) or "no recorded field (hardware keys differ)"
    others = f" (closest of {len(recorded)} recorded)" if len(recorded) > 1 else ""
    return f"; differs from {closest[0]}{others}: {fields}"
