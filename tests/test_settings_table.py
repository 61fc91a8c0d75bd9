"""Every setting is declared once (``core.settings.SETTINGS``): the pytest option, the
ini key, the environment variable and the ``llmperf`` commands' flag all come from it, with
the same default, and every help text shows that default the same way."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf import cli
from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.settings import SETTINGS, EngineSettings, markdown_table, resolve
from pytest_llmperf.session import SessionSettings

ROOT = Path(__file__).resolve().parent.parent
#: CLI flags named like a setting that mean something else: the change-point test's own level.
NOT_THE_SETTING = {("detect", "--alpha")}


def _squeeze(text: str) -> str:
    """Help text without whitespace: argparse wraps lines wherever the terminal width says."""
    return "".join(text.split())


def _sample(name: str) -> str:
    """A valid value of every setting that has an env var or ini key."""
    return {"api": "chat", "prompt_cache": "warm", "lost_baseline": "warn", "endpoint": "http://127.0.0.1:7/v1"}.get(
        name, "7"
    )


def _nothing_given(dest: str) -> None:
    return None


def test_every_setting_is_an_option_an_ini_key_and_an_env_var_with_one_default(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    defaults = resolve(_nothing_given, lambda key: "", environ={})
    for s in SETTINGS.values():
        assert config.getoption(s.dest) in (None, False), s.option  # declared, nothing given
        assert defaults[s.name].value == s.default and defaults[s.name].source == "default"
        if s.ini:
            assert config.getini(s.ini_key) == "", s.ini_key
            from_ini = resolve(
                _nothing_given, lambda key, k=s.ini_key, name=s.name: _sample(name) if key == k else "", environ={}
            )
            assert from_ini[s.name].source == f"ini {s.ini_key}"
            assert from_ini[s.name].value == s.parse(_sample(s.name))
        else:
            with pytest.raises(ValueError):
                config.getini(f"llmperf_{s.name}")
        if s.env:
            assert not s.switch
            from_env = resolve(_nothing_given, lambda key: "", environ={s.env: _sample(s.name)})
            assert from_env[s.name].source == f"${s.env}"
            assert from_env[s.name].value == s.parse(_sample(s.name))


def test_every_setting_reaches_the_session_settings() -> None:
    names = {f.name for f in dataclasses.fields(SessionSettings)} | {f.name for f in dataclasses.fields(EngineSettings)}
    assert set(SETTINGS) <= names, set(SETTINGS) - names


def test_a_bad_value_names_where_it_came_from() -> None:
    with pytest.raises(
        ConfigError, match=r"^\$LLMPERF_REQUEST_TIMEOUT: must be > 0 seconds and at most 1e\+06 seconds, got 0$"
    ):
        resolve(_nothing_given, lambda key: "", environ={"LLMPERF_REQUEST_TIMEOUT": "0"})
    with pytest.raises(ConfigError, match=r"^ini llmperf_api: must be completions or chat, got 'rpc'$"):
        resolve(_nothing_given, lambda key: "rpc" if key == "llmperf_api" else "", environ={})


def _cli_arguments() -> dict[tuple[str, str], argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, command in sub.choices.items():
        for action in command._actions:
            for flag in action.option_strings:
                found[(name, flag)] = action
    return found


def test_the_cli_takes_shared_settings_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMPERF_ENDPOINT", raising=False)
    by_flag = {s.cli: s for s in SETTINGS.values() if s.cli}
    wanted = {s.name for s in by_flag.values()}
    arguments = _cli_arguments()
    used = set()
    for (command, flag), action in arguments.items():
        s = by_flag.get(flag)
        if s is None or (command, flag) in NOT_THE_SETTING:
            continue
        used.add(s.name)
        assert action.default == s.default, (command, flag)
        assert f"(default {s.default_text()}" in action.help.replace("%%", "%"), (command, flag, action.help)
        assert action.type is not None and action.type.__name__ == s.parse.__name__, (command, flag)
    assert used == wanted, wanted - used  # every flag the table names is taken by a command


def test_pytest_help_and_llmperf_help_show_the_same_defaults(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest_help = _squeeze(run(pytester, "--help").stdout.str())
    for s in SETTINGS.values():
        if not s.switch:
            assert _squeeze(f"{s.option}") in pytest_help
            assert _squeeze(f"(default {s.default_text()}") in pytest_help, s.option
    commands = {command for command, flag in _cli_arguments() if flag in {x.cli for x in SETTINGS.values()}}
    for command in sorted(commands):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = _squeeze(capsys.readouterr().out)
        for name, flag in _cli_arguments():
            s = next((x for x in SETTINGS.values() if x.cli == flag), None)
            if name == command and s is not None and (name, flag) not in NOT_THE_SETTING:
                shown = _squeeze(f"(default {s.default_text()}")
                assert shown in text and shown in pytest_help, (command, flag)


def test_docs_settings_table_is_the_table() -> None:
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert markdown_table() in doc, "docs/settings.md: paste core.settings.markdown_table()'s output"


def test_every_option_the_docs_name_exists_and_their_tables_show_its_default() -> None:
    by_option = {s.option: s for s in SETTINGS.values()}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for option in re.findall(r"--llmperf-[a-z0-9-]*[a-z0-9]", line):
                assert option in by_option, f"{path.name}:{n}: {option} is no option"
            row = re.match(r"^\| `(--llmperf-[a-z0-9-]+)", line)
            if row and not by_option[row.group(1)].switch:  # a table row: its default as the table's
                s = by_option[row.group(1)]
                assert s.default_text() in line, f"{path.name}:{n}: {s.option}'s default is {s.default_text()}"
