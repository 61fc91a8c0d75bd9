"""One name per concept (issue 24): ``gpu_layers``, ``threads``, ``mmap``, ``mlock`` everywhere a
user writes them; each old spelling (``core.settings.RENAMED``) is refused with one line naming
the new one: marker key, pytest option, ini key, ``llmperf`` flag."""

from __future__ import annotations

import pytest
from inner import run

from pytest_llmperf import cli
from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.settings import RENAMED, RENAMED_SETTINGS, SETTINGS, resolve
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.session.options import KEYS, SessionSettings, check_side, validate


def test_the_table_renames_to_names_in_use() -> None:
    assert RENAMED == {"n_gpu_layers": "gpu_layers", "n_threads": "threads", "use_mmap": "mmap", "use_mlock": "mlock"}
    for old, new in RENAMED.items():
        assert KEYS[new].kind == "engine" and old not in KEYS
        assert new in EngineConfig.__dataclass_fields__ and old not in EngineConfig.__dataclass_fields__
    assert {new.name for _, new in RENAMED_SETTINGS} == {"gpu_layers", "threads"}
    assert (SETTINGS["gpu_layers"].cli, SETTINGS["threads"].cli) == ("--gpu-layers", "--threads")


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_marker_key_is_refused_in_one_line(old: str, new: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate({old: 0})
    assert str(info.value) == f"llmperf: marker key {old!r} was renamed to {new!r}"


def test_the_new_marker_keys_work() -> None:
    config = validate({"gpu_layers": -1, "threads": 1, "mmap": False, "mlock": False})
    assert dict(config.engine) == {"gpu_layers": -1, "threads": 1, "mmap": False, "mlock": False}
    engine = EngineConfig(model="m").replace(config.engine)
    assert (engine.gpu_layers, engine.threads, engine.mmap, engine.mlock) == (-1, 1, False, False)


def test_an_old_key_of_an_ab_side_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        check_side("b", {"n_threads": 1})
    assert str(info.value) == "A/B side 'b': llama.cpp setting 'n_threads' was renamed to 'threads'"
    assert check_side("b", {"threads": 1}) == {"threads": 1}


def test_an_old_setting_of_a_script_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        SessionSettings.of(tmp_path, environ={}, n_gpu_layers=1)
    assert str(info.value) == "llmperf: setting 'n_gpu_layers' was renamed to 'gpu_layers'"
    assert SessionSettings.of(tmp_path, environ={}, gpu_layers=1).engine.gpu_layers == 1


def test_an_old_marker_key_fails_its_test_with_the_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(n_gpu_layers=0)
        def test_old():
            pass
        """
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*ERROR collecting*", "*test_old: llmperf: marker key 'n_gpu_layers' was renamed to 'gpu_layers'"]
    )


@pytest.mark.parametrize(
    ("old", "new"), [("--llmperf-n-gpu-layers=1", "gpu-layers"), ("--llmperf-n-threads=1", "threads")]
)
def test_an_old_pytest_option_is_refused_in_one_line(pytester: pytest.Pytester, old: str, new: str) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run(pytester, old)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    flag = old.split("=")[0]
    result.stderr.fnmatch_lines([f"ERROR: llmperf: option '{flag}' was renamed to '--llmperf-{new}'"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


@pytest.mark.parametrize(
    ("old", "new"), [("llmperf_n_gpu_layers", "llmperf_gpu_layers"), ("llmperf_n_threads", "llmperf_threads")]
)
def test_an_old_ini_key_is_refused_in_one_line(pytester: pytest.Pytester, old: str, new: str) -> None:
    pytester.makeini(f"[pytest]\n{old} = 1\n")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: llmperf: ini key '{old}' was renamed to '{new}'"])


def test_the_new_options_and_ini_keys_work(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nllmperf_threads = 3\n")
    config = pytester.parseconfig("--llmperf-gpu-layers=-1")
    resolved = resolve(config.getoption, config.getini, environ={})
    assert (resolved["gpu_layers"].value, resolved["gpu_layers"].source) == (-1, "--llmperf-gpu-layers")
    assert (resolved["threads"].value, resolved["threads"].source) == (3, "ini llmperf_threads")


def test_the_old_options_are_hidden_from_help(pytester: pytest.Pytester) -> None:
    out = run(pytester, "--help").stdout.str()
    assert "--llmperf-gpu-layers" in out and "--llmperf-n-gpu-layers" not in out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["profile", "--n-gpu-layers", "1"],
            "llmperf profile: error: option '--n-gpu-layers' was renamed to '--gpu-layers'",
        ),
        (["profile", "--n-threads=1"], "llmperf profile: error: option '--n-threads' was renamed to '--threads'"),
    ],
)
def test_an_old_cli_flag_is_refused_in_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"{line} (see llmperf profile --help)\n"


def test_the_new_cli_flags_work(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["profile", "--gpu-layers", "-1", "--threads", "2"])
    assert (args.gpu_layers, args.threads) == (-1, 2)
    with pytest.raises(SystemExit):
        cli.main(["profile", "--help"])
    out = capsys.readouterr().out
    assert "--gpu-layers" in out and "--n-gpu-layers" not in out
