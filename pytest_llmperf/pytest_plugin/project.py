"""Where the project is, decided once per session from the project itself: the rootdir and the
ini file pytest picks from the test paths of the command line, ``-c`` and ``--rootdir``, never
from an option's value.

Why: pytest picks its rootdir and ini file before the plugins installed by entry points (this
one) add their options, so the value of an option written with a space
(``--llmperf-json /tmp/out/s.json``) looks like a test path to it once that path exists: on the
second run the rootdir moves to a common ancestor (``/tmp``, ``/``), its ``baselines/`` is not
found and every test would read "no baseline" and pass. Once every option is known (at
``pytest_configure``), the command line is parsed again and pytest's own rule applied to the
test paths alone; the baselines, the history's default place and the module paths in baseline
keys use that folder, and the ``llmperf_*`` ini keys are read from that ini file. Where pytest
was misled, one header line says so, with the fix (``--option=VALUE``)."""

from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Project:
    """The session's project folder and ini file, and the line saying that pytest's differ."""

    rootdir: Path
    inipath: Path | None
    #: The project's ini values where pytest read another ini file (or none), else empty.
    ini: Mapping[str, object] = field(default_factory=dict)
    #: One line when an option's value moved pytest's rootdir or ini file, else None.
    moved: str | None = None
    #: Other lines for the header, once (an option given twice: which value counts).
    notes: tuple[str, ...] = ()

    def getini(self, config: pytest.Config) -> Callable[[str], Any]:
        """``config.getini``, unless pytest read another ini file than the project's: then the
        project's value of the key ("" where it gives none)."""
        if self.inipath == config.inipath:
            return config.getini
        return lambda key: _ini_text(self.ini.get(key))


def _ini_text(value: object) -> str | list[object]:
    value = getattr(value, "value", value)  # pytest >= 9: a ConfigValue
    if value is None:
        return ""
    return value if isinstance(value, (str, list)) else str(value)


def locate(config: pytest.Config) -> Project:
    """The project of this session (``config.rootpath`` itself where nothing misled pytest)."""
    same = Project(config.rootpath, config.inipath)
    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, config.invocation_params.args)]
    paths = _test_paths(config, args)
    if paths is None:
        return same
    found = _setup(config, paths)
    if found is None or (found[0] == config.rootpath and found[1] == config.inipath):
        return same
    rootdir, inipath, ini = found
    return Project(rootdir, inipath, ini, _moved_line(config, args, paths, rootdir, inipath))


def _test_paths(config: pytest.Config, args: list[str]) -> list[str] | None:
    """The command line's positional arguments, parsed now that every plugin's and conftest's
    options are known (an option's value is the option's); None where it cannot be parsed."""
    parser = getattr(config, "_parser", None)
    if parser is None:  # pragma: no cover - a pytest without it: keep pytest's rootdir
        return None
    try:
        namespace = parser.parse_known_args(args)
    except (pytest.UsageError, SystemExit):  # pragma: no cover - pytest parsed the same arguments already
        return None
    return [str(a) for a in getattr(namespace, "file_or_dir", None) or []]


def _setup(config: pytest.Config, paths: list[str]) -> tuple[Path, Path | None, Mapping[str, object]] | None:
    """pytest's own rule (``findpaths.determine_setup``) on the test paths alone."""
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:  # pragma: no cover
        return None
    given: dict[str, Any] = {
        "inifile": config.option.inifilename,
        "args": paths,
        "rootdir_cmd_arg": config.option.rootdir or None,
        "invocation_dir": config.invocation_params.dir,
    }
    for extra in ({"override_ini": config.option.override_ini}, {}):  # pytest >= 9 takes -o here
        try:
            found = determine_setup(**given, **extra)
        except TypeError:
            continue
        except (pytest.UsageError, OSError):  # pragma: no cover - pytest accepted the same setup already
            return None
        return Path(found[0]), None if found[1] is None else Path(found[1]), found[2]
    return None  # pragma: no cover - another determine_setup signature


def _moved_line(config: pytest.Config, args: list[str], paths: list[str], rootdir: Path, inipath: Path | None) -> str:
    """What moved pytest's rootdir (the options whose value it took for a test path), and the fix."""
    left, here = Counter(paths), config.invocation_params.dir
    taken: list[tuple[str, str]] = []
    for before, arg in zip(["", *args], args):
        if arg.startswith("-"):
            continue
        if left[arg] > 0:
            left[arg] -= 1
        elif before.startswith("--") and "=" not in before and (here / arg.split("::")[0]).exists():
            taken.append((before, arg))
    told = ", ".join(f"the value of {option} ({value})" for option, value in taken) or "an option's value"
    fix = ", ".join(f"{option}={value}" for option, value in taken) or "--option=VALUE"
    return (
        f"llmperf: warning: pytest took {told} for a test path: its rootdir moved to {config.rootpath}; "
        f"baselines and history stay in {rootdir}{_ini_change(config.inipath, inipath)}; write {fix}"
    )


def _ini_change(pytest_ini: Path | None, project_ini: Path | None) -> str:
    """`` (llmperf_* ini keys from X, pytest read Y)`` where the two ini files differ."""
    if pytest_ini == project_ini:
        return ""
    return f" (llmperf_* ini keys from {project_ini or 'no ini file'}; pytest read {pytest_ini or 'none'})"
