"""Shared fixtures: real llama.cpp engines on the embedded synthetic models.

Models are cached in the repository's ignored ``.llmperf-cache/`` (set before any inner
pytester session starts, so they inherit it) and written once per machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE_DIR = Path(__file__).resolve().parent.parent / ".llmperf-cache"
os.environ.setdefault("LLMPERF_CACHE_DIR", str(CACHE_DIR))

# The plugin imports numpy, scipy and llama_cpp only once an llmperf test runs. In-process
# inner sessions (pytester) drop the modules first imported during them, and numpy's C
# extensions cannot be loaded twice in a process: import them here, once, for all sessions.
import pytest_llmperf.compare  # noqa: E402,F401  (numpy, scipy.stats)
import pytest_llmperf.engines.llama_cpp  # noqa: E402,F401
import pytest_llmperf.session  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from pytest_llmperf import ensure_model

    return ensure_model("tiny")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path: Path):
    from pytest_llmperf import LlamaCppEngine

    engine = LlamaCppEngine(tiny_model_path)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def small_engine():
    from pytest_llmperf import LlamaCppEngine, ensure_model

    engine = LlamaCppEngine(ensure_model("small"))
    yield engine
    engine.close()
