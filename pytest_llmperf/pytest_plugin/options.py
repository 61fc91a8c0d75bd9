"""The plugin's command-line options and ini keys, built from ``core.settings_table.SETTINGS``
(the one declaration of every setting: parser, default, help, env, ini)."""

from __future__ import annotations

import pytest

from ..core.settings import SETTINGS


def add_options(parser: pytest.Parser) -> None:
    """Every ``--llmperf-*`` option and ``llmperf_*`` ini key. A value left out is None here:
    ``settings_table.resolve`` then looks at the environment, the ini file and the default."""
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    for s in SETTINGS.values():
        if s.switch:
            group.addoption(s.option, dest=s.dest, action="store_true", help=_escape(s.help_text()))
        else:
            group.addoption(
                s.option, dest=s.dest, default=None, type=s.arg_type(), metavar=s.metavar,
                help=_escape(s.help_text()),
            )
        if s.ini:
            parser.addini(s.ini_key, f"{s.help} (default {s.default_text()})")


def _escape(text: str) -> str:
    """argparse %-formats help strings: a literal ``%`` must be written ``%%``."""
    return text.replace("%", "%%")
