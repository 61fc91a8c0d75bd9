"""The plugin's fixtures: the ``llmperf`` measuring object and the session's engine, model and
servers. Each hands the pytest-free ``Session`` plain values and turns its one-line errors
into a test failure without a traceback."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from ..core.errors import LLMPerfError
from ..core.settings import SERVER_N_CTX
from ..judge.marker import MarkerConfig
from .marks import FIXTURE, MARKER_CONFIG, session_of


def _fail(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` with an LLMPerfError raised as the test's one failure line."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except LLMPerfError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy

    return run


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> Any:
    """Measures the ``llmperf`` marker's workload; call ``llmperf.measure()`` (or let the
    plugin do it after the test body when the test did not)."""
    from .fixture import LLMPerf

    session = session_of(request.config)
    item = request.node
    config = item.stash.get(MARKER_CONFIG, None) or MarkerConfig({}, {})
    fixture = LLMPerf(
        config,
        session.engine,
        _fail(lambda m, c: session.assess(item.nodeid, item.path, m, c)),
        session.measure_options,
        smoke=session.settings.disable,
        side=session.side,
        nodeid=item.nodeid,
    )
    item.stash[FIXTURE] = fixture
    return fixture


@pytest.fixture(scope="session")
def llmperf_engine(pytestconfig: pytest.Config) -> Any:
    """The session's engine (in-process llama.cpp unless an endpoint or a hook says otherwise; loaded once)."""
    return _fail(session_of(pytestconfig).local_engine)()


def _serve(pytestconfig: pytest.Config, start: Callable[..., Any], **kwargs: Any) -> Any:
    from ..models.gguf import ensure_model

    s = session_of(pytestconfig).settings.engine
    try:
        path = ensure_model(s.preset) if s.preset else s.model
        with start(path, n_threads=s.threads, n_ctx=s.n_ctx or SERVER_N_CTX, n_batch=s.n_batch, alias=s.model_label,
                   **kwargs) as server:
            yield server
    except LLMPerfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None  # no chained second copy


@pytest.fixture(scope="session")
def llmperf_server(pytestconfig: pytest.Config) -> Any:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, serving the
    session's model with its thread count; ``.url`` and ``.engine()`` give an HttpEngine."""
    from ..engines.servers import serve

    yield from _serve(pytestconfig, serve)


@pytest.fixture(scope="session")
def llmperf_llama_server(pytestconfig: pytest.Config) -> Any:
    """llama.cpp's own ``llama-server`` (continuous batching, ``LLAMA_SERVER_PARALLEL`` slots,
    ``/metrics``) on a free loopback port, serving the session's model; built on first use
    (``llmperf server build``). ``.url`` and ``.engine()`` as for ``llmperf_server``."""
    from ..engines.servers import LLAMA_SERVER_PARALLEL, serve_llama_server

    yield from _serve(pytestconfig, serve_llama_server, parallel=LLAMA_SERVER_PARALLEL)


@pytest.fixture(scope="session")
def llmperf_llm(llmperf_engine: Any) -> Any:
    """The session's ``llama_cpp.Llama`` object: the model the llmperf tests measure."""
    llm = getattr(llmperf_engine, "llm", None)
    if llm is None:
        raise pytest.fail.Exception(
            f"llmperf_llm: the session's engine ({type(llmperf_engine).__name__}, from an --llmperf-endpoint or a "
            "pytest_llmperf_make_engine hook) has no llama_cpp.Llama object; use the llmperf_engine fixture",
            pytrace=False,
        )
    return llm
