"""An engine's abilities are declared, not probed: every shipped engine names among its bases
exactly the capability protocols it implements, and an engine with ``info`` and ``run`` alone
has none of them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import pytest_llmperf
from pytest_llmperf.core.workload import EngineInfo, RunTrace
from pytest_llmperf.engines import CallableEngine, SteppedCallableEngine
from pytest_llmperf.engines.capabilities import (
    CAPABILITIES,
    AsyncRuns,
    Closable,
    ConcurrentRuns,
    DrivenLlama,
    Engine,
    EngineProcess,
    FreshInstances,
    FreshLoads,
    LayerTiming,
    LlamaObject,
    NeedsPromptIds,
    ProcessMemory,
    RemoteLayerTiming,
    SentRequests,
    ServerMetrics,
    SteppedRuns,
    TokenProbabilities,
    times_layers,
)
from pytest_llmperf.engines.http import HttpEngine
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.measuring.runner import THIS_PROCESS
from pytest_llmperf.measuring.worker import WorkerEngine
from pytest_llmperf.session.against import SideIdLogits, SideLogits

ROOT = Path(__file__).resolve().parent.parent

#: What each shipped engine (and engine-like object) offers: the one list this test holds
#: the declarations to, so an ability added or dropped is a visible change here too.
SHIPPED: dict[type, set[type]] = {
    CallableEngine: {DrivenLlama},
    SteppedCallableEngine: {SteppedRuns, DrivenLlama},
    LlamaCppEngine: {LayerTiming, TokenProbabilities, FreshLoads, LlamaObject, SteppedRuns, Closable, FreshInstances},
    HttpEngine: {ConcurrentRuns, AsyncRuns, ServerMetrics, TokenProbabilities, NeedsPromptIds, SentRequests, Closable},
    WorkerEngine: {
        RemoteLayerTiming,
        TokenProbabilities,
        FreshLoads,
        ProcessMemory,
        EngineProcess,
        Closable,
        FreshInstances,
    },
    SideLogits: {TokenProbabilities},
    SideIdLogits: {TokenProbabilities, NeedsPromptIds},
    type(THIS_PROCESS): {ProcessMemory},
}


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def members(protocol: type) -> set[str]:
    """The names a protocol asks for (its own and its protocol bases'), methods and data."""
    names: set[str] = set()
    for k in protocol.__mro__:
        if k in (object,) or not _is_protocol(k) or k.__module__ == "typing":
            continue
        names |= {n for n in vars(k) if not n.startswith("_")}
        names |= {n for n in vars(k).get("__annotations__", {}) if not n.startswith("_")}
    return names


def defines(cls: type, name: str) -> bool:
    """Whether a class that is no protocol (the engine or a base of its) defines ``name``: a
    protocol's own stub does not count as an implementation."""
    return any(
        name in vars(k) or name in vars(k).get("__annotations__", {}) for k in cls.__mro__ if not _is_protocol(k)
    )


def test_every_capability_is_a_runtime_checkable_protocol_with_members() -> None:
    assert len(set(CAPABILITIES)) == len(CAPABILITIES)
    for protocol in (Engine, *CAPABILITIES):
        assert _is_protocol(protocol) and getattr(protocol, "_is_runtime_protocol", False), protocol
        assert members(protocol), protocol
    assert members(Engine) == {"info", "run"}
    assert members(NeedsPromptIds) == {"token_logits", "needs_prompt_ids"}


@pytest.mark.parametrize("cls", list(SHIPPED), ids=lambda c: c.__name__)
def test_a_shipped_engine_declares_exactly_what_it_implements(cls: type) -> None:
    declared = {p for p in CAPABILITIES if p in cls.__mro__}
    implemented = {p for p in CAPABILITIES if all(defines(cls, m) for m in members(p))}
    assert declared == implemented, (
        f"{cls.__name__}: declared but not implemented {sorted(p.__name__ for p in declared - implemented)}; "
        f"implemented but not declared {sorted(p.__name__ for p in implemented - declared)}"
    )
    assert declared == SHIPPED[cls]


@pytest.mark.parametrize("cls", [c for c in SHIPPED if c is not type(THIS_PROCESS)], ids=lambda c: c.__name__)
def test_every_engine_names_the_engine_protocol_but_the_side_proxies(cls: type) -> None:
    """The engines are ``Engine``s by declaration; the A/B side proxies stand in for an engine's
    token probabilities only."""
    assert (Engine in cls.__mro__) is (cls not in (SideLogits, SideIdLogits))


def test_the_declarations_hold_at_run_time() -> None:
    """``isinstance`` (what the measuring code asks) agrees with the declarations."""
    http = HttpEngine("http://127.0.0.1:9/v1")  # never connects
    try:
        made: list[Any] = [
            CallableEngine(lambda prompt, n: iter("ab")),
            http,
            SideLogits(None, 1.0),  # type: ignore[arg-type]  # no side process: only asked what it is
            SideIdLogits(None, 1.0),  # type: ignore[arg-type]
            THIS_PROCESS,
        ]
        for engine in made:
            assert {p for p in CAPABILITIES if isinstance(engine, p)} == SHIPPED[type(engine)], type(engine)
    finally:
        http.close()
    assert times_layers(LlamaCppEngine.__new__(LlamaCppEngine)) and times_layers(WorkerEngine.__new__(WorkerEngine))
    assert not times_layers(http)


class Plain:
    """A user's engine with nothing but the Engine protocol."""

    def info(self) -> EngineInfo:
        return EngineInfo(engine="plain", model="plain")

    def run(self, workload: Any, run_index: int) -> RunTrace:
        return RunTrace(start_ns=0, prefill_done_ns=None, token_ns=(1, 2), prompt_tokens=None)


def test_a_plain_info_run_engine_is_an_engine_with_no_capability() -> None:
    engine = Plain()
    assert isinstance(engine, Engine)
    assert [p.__name__ for p in CAPABILITIES if isinstance(engine, p)] == []
    assert not times_layers(engine)
    # A callable declares DrivenLlama, and has layers to time only once a run drove a Llama.
    wrapped = CallableEngine(lambda prompt, n: iter("ab"))
    assert [p.__name__ for p in CAPABILITIES if isinstance(wrapped, p)] == ["DrivenLlama"]
    assert not times_layers(wrapped)
    assert not isinstance(lambda prompt, n: iter("ab"), Engine)  # a callable is wrapped, not taken as is


def test_a_user_engine_offers_an_ability_by_its_members_too() -> None:
    """The protocols are structural: a user's engine written before them (``concurrent_safe``
    set, ``token_logits`` defined) keeps what it offered without naming a protocol."""

    class Threaded(Plain):
        concurrent_safe = True

        def token_logits(self, workload: Any, forced: Any = None, prompt_ids: Any = None) -> str:
            return "not here"

    engine = Threaded()
    assert {p for p in CAPABILITIES if isinstance(engine, p)} == {ConcurrentRuns, TokenProbabilities}


def test_an_engine_that_says_it_is_not_concurrent_gets_one_request_at_a_time() -> None:
    """``concurrent_safe = False`` matches the protocol by its member, and still means no."""
    from pytest_llmperf.core.errors import ConfigError
    from pytest_llmperf.measuring.served import _check_engine

    class Serial(Plain):
        concurrent_safe = False

    class Threaded(Plain):
        concurrent_safe = True

    with pytest.raises(ConfigError, match="one request at a time"):
        _check_engine(Serial(), 4, None)  # type: ignore[arg-type]
    _check_engine(Threaded(), 4, None)  # type: ignore[arg-type]
    _check_engine(Serial(), 1, None)  # type: ignore[arg-type]


def test_a_side_proxy_offers_what_its_side_declared() -> None:
    assert SideLogits.of(None, {"logits": False}, 1.0) is None  # type: ignore[arg-type]
    assert type(SideLogits.of(None, {"logits": True}, 1.0)) is SideLogits  # type: ignore[arg-type]
    assert type(SideLogits.of(None, {"logits": True, "needs_ids": True}, 1.0)) is SideIdLogits  # type: ignore[arg-type]


def test_the_capabilities_are_public_and_documented() -> None:
    public = set(pytest_llmperf.__all__)
    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("## Engine capabilities") :]
    for protocol in CAPABILITIES:
        assert protocol.__name__ in public, protocol
        assert re.search(rf"`{protocol.__name__}`", section), protocol


def test_no_engine_is_probed_with_getattr() -> None:
    """The measuring code asks ``isinstance``: no getattr/hasattr on a variable that holds an
    engine is left (``m.engine``, a measurement's ``EngineInfo``, is no engine)."""
    probes = re.compile(r"(getattr|hasattr)\((self\.)?(engine|local_engine|endpoint_engine|llmperf_engine|subject)\b")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "pytest_llmperf").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if probes.search(line)
    ]
    assert found == []
