"""The package's JSON Schemas (``pytest_llmperf/schemas/*.schema.json``, draft 2020-12) and a
small validator that reads them, so the session and baseline readers check exactly what the
published schemas say without a runtime dependency.

Why not the ``jsonschema`` library: it would add four packages (one a compiled Rust wheel) to
every install of a pytest plugin, for the handful of keywords these schemas use. The keywords
understood are listed in ``KEYWORDS``; a schema using another one fails loudly (the tests also
check every shipped schema against ``jsonschema`` itself, and that both agree on bad files).
JSON has no NaN or Infinity, so a non-finite number (Python's ``json`` reads them) is not a
number here.
"""

from __future__ import annotations

import functools
import json
import math
import re
from importlib import resources
from typing import Any, Mapping

from .errors import LLMPerfError

#: Keywords the validator applies; annotations (``title``...) are read and ignored.
KEYWORDS = frozenset(
    {"type", "const", "enum", "properties", "required", "additionalProperties", "items", "minItems",
     "minimum", "$ref", "anyOf"}
)
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "$comment", "default"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


class SchemaViolation(LLMPerfError):
    """A document that does not match its schema: ``path`` (``tests['t']['hw'].runs``) and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the document'} {problem}")
        self.path, self.problem = path, problem


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> Mapping[str, Any]:
    """``schemas/<name>.schema.json`` of the installed package."""
    text = resources.files("pytest_llmperf").joinpath("schemas", f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _resolve(ref: str, root: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``#/$defs/x`` in ``root``, or ``other.schema.json#/$defs/x`` beside it: (schema, its root)."""
    file, _, pointer = ref.partition("#")
    if file:
        root = load_schema(file.rsplit("/", 1)[-1].removesuffix(".schema.json"))
    node: Any = root
    for part in [p for p in pointer.split("/") if p]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node, root


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return _KINDS.get(type(value), type(value).__name__)


def _is(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    return {
        "object": lambda: isinstance(value, dict),
        "array": lambda: isinstance(value, list),
        "string": lambda: isinstance(value, str),
        "boolean": lambda: isinstance(value, bool),
        "null": lambda: value is None,
    }[kind]()


def _key(path: str, key: str, named: bool) -> str:
    """``path.key`` for a property the schema names, ``path['key']`` for one it does not."""
    if named and _NAME.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def check(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None, path: str = "") -> None:
    """Raise ``SchemaViolation`` at the first place ``value`` breaks ``schema`` (depth first)."""
    root = schema if root is None else root
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise LLMPerfError(f"schema keyword(s) {sorted(unknown)} not supported by pytest_llmperf's validator")
    if "$ref" in schema:
        target, target_root = _resolve(schema["$ref"], root)
        check(value, target, target_root, path)
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                check(value, option, root, path)
                break
            except SchemaViolation as exc:
                errors.append(exc)
        else:  # the error that got furthest into the value says the most
            raise max(errors, key=lambda e: len(e.path))
    if "type" in schema:
        kinds = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaViolation(path, f"is {value!r}, not a finite number (JSON has none)")
        if not any(_is(value, k) for k in kinds):
            raise SchemaViolation(path, f"is {_kind(value)}, not {' or '.join(_article(k) for k in kinds)}")
    if "const" in schema and not _same(value, schema["const"]):
        raise SchemaViolation(path, f"is {json.dumps(value)[:60]}, not {json.dumps(schema['const'])}")
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        raise SchemaViolation(path, f"is {json.dumps(value)[:60]}, not one of {json.dumps(schema['enum'])}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        raise SchemaViolation(path, f"is {value}, below the minimum {schema['minimum']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise SchemaViolation(path, "is empty" if schema["minItems"] == 1 else f"has fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                check(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaViolation(path, f"has no {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                check(item, props[key], root, _key(path, key, True))
            elif extra is False:
                raise SchemaViolation(_key(path, key, False), "is not a key this file may have")
            elif isinstance(extra, dict):
                check(item, extra, root, _key(path, key, False))


def _article(kind: str) -> str:
    return {"object": "an object", "array": "an array", "integer": "an integer", "null": "null"}.get(kind, f"a {kind}")


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def validate(value: Any, name: str, definition: str | None = None, path: str = "") -> None:
    """``value`` against schema ``name`` (``schemas/<name>.schema.json``), or against its
    ``$defs/<definition>``; ``path`` names where ``value`` sits in its file."""
    root = load_schema(name)
    schema = root["$defs"][definition] if definition else root
    check(value, schema, root, path)
