"""The check of a document against a published JSON Schema (``schemas/*.schema.json``, draft
2020-12), importing nothing of the package but its errors, its JSON types and the schema files,
so the record of a measurement (``core.measurement``) checks what it reads below the metric
catalog. Why not the ``jsonschema`` library: it would add four packages (one a compiled Rust
wheel) to every install of a pytest plugin, for the handful of keywords these schemas use. The
keywords understood are listed in ``KEYWORDS``; a schema using another one fails loudly (the
tests also check every shipped schema against ``jsonschema`` itself, and that both agree on bad
files). JSON has no NaN or Infinity, so a non-finite number (Python's ``json`` reads them) is not
a number here. ``core.documents.load_schema`` adds the metric catalog's figures to the session
schema."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from importlib import resources
from typing import Any, TypedDict

from .errors import LLMPerfError
from .formats import JSONValue

#: Keywords the validator applies; annotations (``title``...) are read and ignored.
KEYWORDS = frozenset(
    {
        "type",
        "const",
        "enum",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "minimum",
        "$ref",
        "anyOf",
    }
)
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "$comment", "default"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


#: A JSON schema as this validator reads it: ``KEYWORDS`` and ``ANNOTATIONS``.
Schema = TypedDict(
    "Schema",
    {
        "type": "str | list[str]",
        "const": JSONValue,
        "enum": "list[JSONValue]",
        "properties": "dict[str, Schema]",
        "required": "list[str]",
        "additionalProperties": "bool | Schema",
        "items": "Schema",
        "minItems": int,
        "minimum": float,
        "$ref": str,
        "anyOf": "list[Schema]",
        "$schema": str,
        "$id": str,
        "$defs": "dict[str, Schema]",
        "title": str,
        "description": str,
        "$comment": str,
        "default": JSONValue,
    },
    total=False,
)


class SchemaViolation(LLMPerfError):
    """A document that does not match its schema: ``path`` (``tests['t']['hw'].runs``) and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the document'} {problem}")
        self.path, self.problem = path, problem


@functools.cache
def schema_file(name: str) -> Schema:
    """``schemas/<name>.schema.json`` of the installed package, as the file holds it."""
    # One name per joinpath: Python 3.10's Traversable takes one (a zip import's path too).
    text = resources.files("pytest_llmperf").joinpath("schemas").joinpath(f"{name}.schema.json").read_text("utf-8")
    schema: Schema = json.loads(text)
    return schema


def _resolve(ref: str, root: Schema) -> tuple[Schema, Schema]:
    """``#/$defs/x`` in ``root``, or ``other.schema.json#/$defs/x`` beside it: (schema, its root)."""
    file, _, pointer = ref.partition("#")
    if file:
        root = schema_file(file.rsplit("/", 1)[-1].removesuffix(".schema.json"))
    node: Any = root
    for part in [p for p in pointer.split("/") if p]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node, root


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _is(value: object, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    return isinstance(value, _JSON_TYPES[kind])


def _key(path: str, key: str, named: bool) -> str:
    """``path.key`` for a property the schema names, ``path['key']`` for one it does not."""
    if named and _NAME.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def check(value: object, schema: Schema, root: Schema | None = None, path: str = "") -> None:
    """Raise ``SchemaViolation`` at the first place ``value`` breaks ``schema`` (depth first:
    the keywords in ``KEYWORD_CHECKS``' order)."""
    root = schema if root is None else root
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise LLMPerfError(f"schema keyword(s) {sorted(unknown)} not supported by pytest_llmperf's validator")
    for keyword_check in KEYWORD_CHECKS:
        keyword_check(value, schema, root, path)


def _check_ref(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``$ref``: the value against the schema it points to."""
    if "$ref" in schema:
        target, target_root = _resolve(schema["$ref"], root)
        check(value, target, target_root, path)


def _check_any_of(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``anyOf``: the value against one option at least; else the error that got furthest
    into the value, which says the most."""
    if "anyOf" not in schema:
        return
    errors = []
    for option in schema["anyOf"]:
        try:
            check(value, option, root, path)
            return
        except SchemaViolation as exc:
            errors.append(exc)
    raise max(errors, key=lambda e: len(e.path))


def _check_type(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``type``: one of the kinds named (a number finite: JSON has no NaN or infinity)."""
    if "type" not in schema:
        return
    kinds = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaViolation(path, f"is {value!r}, not a finite number (JSON has none)")
    if not any(_is(value, k) for k in kinds):
        raise SchemaViolation(path, f"is {_kind(value)}, not {' or '.join(_article(k) for k in kinds)}")


def _check_value(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``const``, ``enum``, ``minimum``: the value itself."""
    if "const" in schema and not _same(value, schema["const"]):
        raise SchemaViolation(path, f"is {json.dumps(value)[:60]}, not {json.dumps(schema['const'])}")
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        raise SchemaViolation(path, f"is {json.dumps(value)[:60]}, not one of {json.dumps(schema['enum'])}")
    if "minimum" in schema and isinstance(value, (int, float)) and _is(value, "number") and value < schema["minimum"]:
        raise SchemaViolation(path, f"is {value}, below the minimum {schema['minimum']}")


def _check_array(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``minItems`` and ``items`` of a list."""
    if not isinstance(value, list):
        return
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise SchemaViolation(
            path, "is empty" if schema["minItems"] == 1 else f"has fewer than {schema['minItems']} items"
        )
    if "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], root, f"{path}[{i}]")


def _check_object(value: object, schema: Schema, root: Schema, path: str) -> None:
    """``required``, ``properties`` and ``additionalProperties`` of a dict."""
    if not isinstance(value, dict):
        return
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


#: ``check``'s keyword checks, in the order a value meets them.
KEYWORD_CHECKS: tuple[Callable[[object, Schema, Schema, str], None], ...] = (
    _check_ref,
    _check_any_of,
    _check_type,
    _check_value,
    _check_array,
    _check_object,
)


def _article(kind: str) -> str:
    return {"object": "an object", "array": "an array", "integer": "an integer", "null": "null"}.get(kind, f"a {kind}")


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def validate_schema_file(value: object, name: str, definition: str, path: str = "") -> None:
    """``value`` against ``$defs/<definition>`` of schema ``name`` as its file holds it (no
    figures added: ``core.documents.validate`` checks session documents); ``path`` names where
    ``value`` sits in its file."""
    root = schema_file(name)
    check(value, root["$defs"][definition], root, path)
