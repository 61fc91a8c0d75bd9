"""llama-server's Prometheus ``/metrics`` (started with ``--metrics``), read and parsed.

Only llama.cpp's own series (``llamacpp:*``) are kept, without labels: counters such as
``prompt_tokens_total`` and ``n_decode_total`` are compared before and after a load level, so
the server's count of what it did sits beside the client's (served_fidelity.py). Reading is
best-effort with a short deadline, and done outside every timed region.
"""

from __future__ import annotations

import math
from typing import Any

PREFIX = "llamacpp:"
READ_TIMEOUT_S = 2.0
#: Most series kept (a hostile endpoint cannot grow a report without bound).
MAX_SERIES = 256


def parse(text: str) -> dict[str, float]:
    """``{name without prefix: value}`` of the ``llamacpp:`` samples in Prometheus text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(PREFIX):
            continue
        name, _, rest = line.partition(" ")
        name = name.split("{", 1)[0][len(PREFIX):]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and name:
            values[name] = value
        if len(values) >= MAX_SERIES:
            break
    return values


def read(client: Any, metrics_url: str) -> dict[str, float] | None:
    """The server's ``llamacpp:`` metrics, or None when it has none (another server, no
    ``--metrics``, unreachable)."""
    import httpx

    try:
        response = client.get(metrics_url, timeout=READ_TIMEOUT_S, headers={"Accept": "text/plain"})
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    values = parse(response.text[: 1 << 20])
    return values or None


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Counters (``*_total``) as after minus before; gauges as read after."""
    if not before or not after:
        return None
    out = {}
    for name, value in after.items():
        if name.endswith("_total"):
            if name in before:
                out[name] = value - before[name]
        else:
            out[name] = value
    return out
