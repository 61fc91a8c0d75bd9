"""The plugin's fixtures: the ``llmperf`` measuring object and the session's engine, model and
servers. Each hands the pytest-free ``Session`` plain values and turns its one-line errors
into a test failure without a traceback.

The ``llmperf`` fixture object is the test's ``session.results.Measurer`` (the one per-test
pipeline: labels, smoke mode, fresh loads, sequential looks, assessment, budgets) seen from
pytest: its errors become the test's one failure line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from ..core.errors import LLMPerfError
from ..core.settings import SERVER_N_CTX
from ..engines.capabilities import LlamaObject
from ..models.gguf import ensure_model
from ..session.options import MarkerConfig
from .marks import MARKER_CONFIG, SESSION, full_id

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import llama_cpp

    from ..core.measurement import Measurement
    from ..engines import TokenStream
    from ..engines.capabilities import Engine
    from ..engines.servers import Server
    from ..judge.ab import ABResult
    from ..judge.result import Outcome
    from ..session.results import Measurer

    #: What ``measure()`` takes as an engine: any Engine, or ``fn(prompt, max_tokens)``.
    Subject = Engine | TokenStream


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """An LLMPerfError inside becomes the test's one failure line (no traceback)."""
    try:
        yield
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> LLMPerf:
    """Measures the ``llmperf`` marker's workload; call ``llmperf.measure()`` (or let the
    plugin do it after the test body when the test did not)."""

    item = request.node
    config = item.stash.get(MARKER_CONFIG, None) or MarkerConfig({}, {})
    session = request.config.stash[SESSION]
    fixture = LLMPerf(session.test(item.nodeid, config, item.path, full_id(item, request.config.rootpath)))
    item.stash[FIXTURE] = fixture
    return fixture


@pytest.fixture(scope="session")
def llmperf_engine(pytestconfig: pytest.Config) -> Engine:
    """The session's engine (in-process llama.cpp unless an endpoint or a hook says otherwise; loaded once)."""
    with _one_line():
        return pytestconfig.stash[SESSION].engines.local()


def _serve(
    pytestconfig: pytest.Config, start: Callable[..., AbstractContextManager[Server]], **kwargs: object
) -> Iterator[Server]:
    s = pytestconfig.stash[SESSION].settings.engine
    with _one_line():
        path = ensure_model(s.preset) if s.preset else s.model
        with start(
            path, threads=s.threads, n_ctx=s.n_ctx or SERVER_N_CTX, n_batch=s.n_batch, alias=s.model_label, **kwargs
        ) as server:
            yield server


@pytest.fixture(scope="session")
def llmperf_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, serving the
    session's model with its thread count; ``.url`` and ``.engine()`` give an HttpEngine."""
    from ..engines.servers import serve  # asyncio (engines.http): only a test that uses a server

    yield from _serve(pytestconfig, serve)


@pytest.fixture(scope="session")
def llmperf_llama_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    """llama.cpp's own ``llama-server`` (continuous batching, ``LLAMA_SERVER_PARALLEL`` slots,
    ``/metrics``) on a free loopback port, serving the session's model; built on first use
    (``llmperf server build``). ``.url`` and ``.engine()`` as for ``llmperf_server``."""
    from ..engines.servers import LLAMA_SERVER_PARALLEL, serve_llama_server

    yield from _serve(pytestconfig, serve_llama_server, parallel=LLAMA_SERVER_PARALLEL)


@pytest.fixture(scope="session")
def llmperf_llm(llmperf_engine: Engine) -> llama_cpp.Llama:
    """The session's ``llama_cpp.Llama`` object: the model the llmperf tests measure."""
    llm: llama_cpp.Llama | None = llmperf_engine.llm if isinstance(llmperf_engine, LlamaObject) else None
    if llm is None:
        raise pytest.fail.Exception(
            f"llmperf_llm: the session's engine ({type(llmperf_engine).__name__}, from an --llmperf-endpoint or a "
            "pytest_llmperf_make_engine hook) has no llama_cpp.Llama object; use the llmperf_engine fixture",
            pytrace=False,
        )
    return llm


class LLMPerf:
    """Bound to one test: ``measure()`` runs the workload and records it for the report.

    Keyword arguments to ``measure`` are marker keys and override the marker for that call;
    ``engine`` may be any Engine or a callable ``fn(prompt, max_tokens)`` yielding tokens.
    Under ``--llmperf-disable``: one run each, no budgets, no baseline assessment.
    """

    def __init__(self, measurer: Measurer) -> None:
        self._measurer = measurer
        #: Each ``measure()``'s outcome (``judge.result.Outcome``) and each ``compare()``'s, in order.
        self.results: list[Outcome] = measurer.results
        self.ab_results: list[ABResult] = measurer.ab_results

    @property
    def engine(self) -> Engine:
        """The llama.cpp engine this test's marker names (the session's unless the marker sets
        llama.cpp keys such as ``threads`` or ``flash_attn``; loaded on first use)."""
        with _one_line():
            return self._measurer.engine()

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.results if r.measurement is not None]  # all: live

    def measure(self, engine: Subject | None = None, *, label: str = "", **overrides: object) -> Measurement:
        with _one_line():
            m = self._measurer.measure(engine, label=label, **overrides).measurement
        assert m is not None  # measured here: live
        return m

    def compare(self, a: object = None, b: object = None, *, label: str = "", **keys: object) -> ABResult:
        """Run A and B interleaved and compare them with paired statistics (``Measurer.compare``)."""
        with _one_line():
            return self._measurer.compare(a, b, label=label, **keys)


#: The test's llmperf fixture object, on its item (the plugin's report hooks read it).
FIXTURE = pytest.StashKey[LLMPerf]()
