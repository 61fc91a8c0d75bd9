"""The marker schema: every bad key or value is a one-line error naming the key."""

from __future__ import annotations

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.session.options import KEYS, validate


def test_valid_keys_split_by_kind() -> None:
    config = validate({"p95_ms": 45, "min_tps": 10.5, "max_tokens": 16, "runs": 3})
    assert config.budgets == {"p95_ms": 45.0, "min_tps": 10.5}
    assert config.workload == {"max_tokens": 16, "runs": 3}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"p59_ms": 1}, "unknown llmperf marker key 'p59_ms'; did you mean 'p99_ms', 'p95_ms' or 'p90_ms'?"),
        ({"p95_ms": -1}, "'p95_ms' must be > 0"),
        ({"p95_ms": "fast"}, "'p95_ms' must be a number"),
        ({"p95_ms": True}, "'p95_ms' must be a number"),
        ({"max_tokens": 1}, "'max_tokens' must be >= 2"),
        ({"runs": 0}, "'runs' must be >= 1"),
        ({"runs": 2.5}, "'runs' must be an integer"),
        ({"prompt": ""}, "'prompt' must be a non-empty string"),
        ({"prompt": "x", "prompt_tokens": 3}, "either 'prompt' or 'prompt_tokens'"),
    ],
)
def test_bad_values(kwargs, message) -> None:
    with pytest.raises(ConfigError) as info:
        validate(kwargs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_positional_arguments_rejected() -> None:
    with pytest.raises(ConfigError, match="keyword arguments only"):
        validate({}, (45,))


def test_override_replaces_prompt_kind() -> None:
    config = validate({"prompt_tokens": 32, "runs": 2}).merged({"prompt": "hi"})
    assert config.workload == {"runs": 2, "prompt": "hi"}
    Workload(**config.workload)


def test_every_key_documented() -> None:
    assert all(k.help for k in KEYS.values())
