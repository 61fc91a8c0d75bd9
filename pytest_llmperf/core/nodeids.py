"""pytest node ids taken apart: the one place that knows where a ``::`` separates parts.

A node id is ``path::Class::name[params]``. The parameter id is free text and may hold
``::`` itself (``test_a[x::y]``), so only the ``::`` before the first ``[`` after the path
separate parts (a name never holds ``[``). A label (``[#2]``, ``llmperf.measure(label=...)``)
is appended like a parameter id and stays with the last part too.
"""

from __future__ import annotations


def parts(nodeid: str) -> list[str]:
    """``["tests/a.py", "TestX", "test_y[x::y]"]`` of ``tests/a.py::TestX::test_y[x::y]``; an
    id with no ``::`` is one part."""
    head, sep, rest = nodeid.partition("::")
    if not sep:
        return [nodeid]
    names, bracket, params = rest.partition("[")
    pieces = names.split("::")
    pieces[-1] += bracket + params
    return [head, *pieces]


def in_module(nodeid: str) -> str:
    """The id without its module path: ``TestX::test_y[x::y]`` (an id with no ``::``: itself)."""
    found = parts(nodeid)
    return "::".join(found[1:]) if len(found) > 1 else nodeid


def last(nodeid: str) -> str:
    """The innermost part with its parameters: ``test_y[x::y]``."""
    return parts(nodeid)[-1]
