"""A llama.cpp setting is one entry of ``core.workload.LLAMA_SETTINGS`` plus its row in
docs/engine-settings.md: the marker key, the engine's keywords, the ``llama_cpp.Llama(...)`` call,
the fingerprint and the session options come from the entry. What must still carry its name
(the typed fields of ``EngineConfig``, ``EngineInfo``, ``EngineSettings``; the docs row; a real
``Llama`` keyword) is named here, in one assertion message, rather than failing deep in a session."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

from pytest_llmperf.core.fingerprint import NEWER_KEYS, SUBJECT_LABELS, subject
from pytest_llmperf.core.settings import ENGINE_DEFAULTS, LLAMA_OPTIONS, SETTINGS, VALUE_KINDS, EngineSettings
from pytest_llmperf.core.workload import LLAMA_SETTINGS, EngineInfo, ValueKind, llama_arguments
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.session.options import KEYS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engine-settings.md"


def _docs_keys() -> set[str]:
    """The keys of docs/engine-settings.md's ``## Keys`` table (a row may name several)."""
    text = DOCS.read_text()
    body = text.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`(\w+)`", cell)}


def test_every_entry_has_its_typed_fields_and_defaults() -> None:
    config = {f.name: f for f in dataclasses.fields(EngineConfig)}
    info = {f.name for f in dataclasses.fields(EngineInfo)}
    session = {f.name for f in dataclasses.fields(EngineSettings)}
    missing = []
    for name, entry in LLAMA_SETTINGS.items():
        if name not in config:
            missing.append(f"{name}: no EngineConfig field (engines/llama_cpp_native.py)")
        elif config[name].default != entry.default:
            missing.append(
                f"{name}: EngineConfig's default {config[name].default!r} is not the table's {entry.default!r}"
            )
        if name not in info:
            missing.append(f"{name}: no EngineInfo field (core/workload.py)")
        if entry.option is not None and name not in session:
            missing.append(f"{name}: a session option without an EngineSettings field (core/settings.py)")
    extra = set(config) - {"model"} - set(LLAMA_SETTINGS)
    missing += [f"{name}: an EngineConfig field without a LLAMA_SETTINGS entry" for name in sorted(extra)]
    assert not missing, "llama.cpp settings table: " + "; ".join(missing)


def test_every_entry_has_its_docs_row_and_every_row_its_entry() -> None:
    documented = _docs_keys() - {"model"}
    no_row = sorted(set(LLAMA_SETTINGS) - documented)
    no_entry = sorted(documented - set(LLAMA_SETTINGS))
    assert not no_row and not no_entry, (
        f"docs/engine-settings.md's Keys table: no row for {no_row} (LLAMA_SETTINGS entries); "
        f"rows without a LLAMA_SETTINGS entry (core/workload.py): {no_entry}"
    )


def test_every_entry_reaches_the_llama_call() -> None:
    """Each entry sets ``llama_cpp.Llama(...)`` keywords that exist, or a model parameter that
    exists, or says why it sets nothing of llama.cpp's (the engine reads it itself)."""
    import llama_cpp

    accepted = set(inspect.signature(llama_cpp.Llama.__init__).parameters) - {"self", "kwargs"}
    model_fields = {name for name, _ in llama_cpp.llama_model_params._fields_}
    keywords, model_params = llama_arguments({**ENGINE_DEFAULTS, "threads": 1, "repack": True})
    problems = []
    for name, entry in LLAMA_SETTINGS.items():
        if not entry.llama and entry.model_param is None and not entry.not_llama:
            problems.append(f"{name}: sets no Llama(...) keyword (llama=), model parameter or not_llama reason")
        problems += [f"{name}: Llama(...) takes no keyword {kw!r}" for kw in entry.llama if kw not in accepted]
        problems += [f"{name}: {kw!r} is not in the Llama(...) call" for kw in entry.llama if kw not in keywords]
        if entry.model_param is not None and entry.model_param not in model_fields:
            problems.append(f"{name}: llama_model_params has no field {entry.model_param!r}")
        if entry.model_param is not None and entry.model_param not in model_params:
            problems.append(f"{name}: model parameter {entry.model_param!r} is not set")
    assert not problems, "llama.cpp settings table (core/workload.py LLAMA_SETTINGS): " + "; ".join(problems)


def test_every_entry_is_a_marker_key_an_option_and_a_fingerprint_key() -> None:
    engine_keys = [n for n, k in KEYS.items() if k.kind == "engine"]
    assert engine_keys == ["model", *LLAMA_SETTINGS], engine_keys
    kinds = set(typing.get_args(ValueKind))
    # One parser (an option's text) and checker (a marker's value) per kind: core/values.py.
    assert not kinds - set(VALUE_KINDS), (
        f"no parser and checker (core/settings.py VALUE_KINDS) for {kinds - set(VALUE_KINDS)}"
    )
    for name in LLAMA_OPTIONS:  # names derived from the setting's, as every SETTINGS entry's
        s = SETTINGS[name]
        assert (s.option, s.env, s.ini_key, s.cli) == (
            "--llmperf-" + name.replace("_", "-"),
            "LLMPERF_" + name.upper(),
            "llmperf_" + name,
            "--" + name.replace("_", "-"),
        )
    keys = {e.subject_key for e in LLAMA_SETTINGS.values() if e.fingerprint}
    assert keys <= SUBJECT_LABELS.keys()
    assert {"n_threads", "n_gpu_layers", "n_ctx", "n_batch"} <= keys - NEWER_KEYS  # recorded from the start
    assert subject(EngineInfo(engine="x", model="m")).keys() >= keys


#: A value of each setting that is not its default and that a CPU-only machine loads (an on/off
#: setting not named here: the other of its default). ``gpu_layers`` and ``type_v`` keep theirs: no
#: GPU to offload to; a quantized V cache would need flash attention, which is off here.
NOT_DEFAULTS = {
    "threads": 1,
    "n_ctx": 768,
    "n_batch": 256,
    "n_ubatch": 128,
    "flash_attn": False,
    "type_k": "q8_0",
    "type_v": "f16",
    "gpu_layers": 0,
    "mmap": False,
    "mlock": True,
    "sample": True,
    "repack": False,
}


def test_every_setting_reaches_llama_cpp_the_engine_info_and_the_fingerprint(tiny_model_path: Path) -> None:
    """Through ``from_config`` (the pool's and the engine worker's way) into ``Llama(...)``: what
    llama-cpp-python read back from llama.cpp's parameters (``Llama.__getstate__``) is what the
    table maps each setting to; EngineInfo and the subject fingerprint carry it."""
    from pytest_llmperf.engines.llama_cpp import LlamaCppEngine

    flipped = {n: not e.default for n, e in LLAMA_SETTINGS.items() if e.kind == "flag" and isinstance(e.default, bool)}
    values = {name: NOT_DEFAULTS.get(name, flipped.get(name, entry.default)) for name, entry in LLAMA_SETTINGS.items()}
    unset = sorted(set(LLAMA_SETTINGS) - set(NOT_DEFAULTS) - set(flipped))
    config = EngineConfig(model=str(tiny_model_path)).replace(values)
    engine = LlamaCppEngine.from_config(config)
    try:
        held = engine.llm.__getstate__()
        extra_bufts = bool(engine.llm.model_params.use_extra_bufts)
        info, fingerprint = engine.info(), subject(engine.info())
    finally:
        engine.close()
    assert engine.config == config, engine.config.differences(config)
    keywords, model_params = llama_arguments(values)
    wrong = [f"{kw}={held.get(kw)!r}, not {want!r}" for kw, want in keywords.items() if held.get(kw) != want]
    assert not wrong, f"Llama(...) holds other values than the settings table maps to: {wrong}"
    assert model_params == {"use_extra_bufts": extra_bufts}
    reported = {name: getattr(info, name, "missing") for name in LLAMA_SETTINGS}
    assert reported == values, reported
    stored = {e.subject_key: values[name] for name, e in LLAMA_SETTINGS.items() if e.fingerprint}
    assert {k: fingerprint.get(k, "missing") for k in stored} == stored
    assert not unset, f"add a value that is not the default for {unset} to NOT_DEFAULTS"


def test_an_unknown_or_old_setting_of_the_engine_is_one_line(tiny_model_path: Path) -> None:
    from pytest_llmperf.core.errors import ConfigError
    from pytest_llmperf.engines.llama_cpp import LlamaCppEngine

    with pytest.raises(ConfigError, match=r"^unknown llama.cpp setting 'treads'; did you mean 'threads'\? \("):
        LlamaCppEngine(tiny_model_path, treads=1)
    with pytest.raises(ConfigError, match=r"^llmperf: llama.cpp setting 'n_threads' was renamed to 'threads'$"):
        LlamaCppEngine(tiny_model_path, n_threads=1)
