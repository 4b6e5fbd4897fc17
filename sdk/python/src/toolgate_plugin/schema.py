"""A function's parameters as a pydantic model and as the JSON Schema toolgate gets.

The model validates a call's arguments and the schema is generated from the same
model, so what the model is told and what the function accepts cannot drift apart.
The schema is self-contained: every ``$ref`` pydantic emits (enums, nested models)
is inlined, because models and many chat front-ends handle references badly.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from .context import CallContext

__all__ = [
    "DEFAULT_SIZE_LIMIT",
    "SchemaError",
    "SizeLimit",
    "arguments_model",
    "check_registrable",
    "check_size",
    "check_text",
    "context_parameter",
    "inline_schema",
    "integers_as_schema_reads",
]

# toolgate refuses a parameter schema nested deeper than this (src/schema.rs MAX_SCHEMA_DEPTH),
# counting the top object as level 1 and a scalar inside it as level 2.
MAX_SCHEMA_DEPTH = 64
# toolgate refuses a runtime tool whose parameters (compact JSON) and description take
# more bytes than this: its default --max-tool-schema-bytes (src/config.rs
# DEFAULT_MAX_TOOL_SCHEMA_BYTES, measured in src/tools/remote/mod.rs validate_within).
MAX_TOOL_SCHEMA_BYTES = 256 * 1024
# Integers toolgate reads as such; it reads a longer one as a float (serde_json's u64 and i64).
_EXACT_INTEGERS = range(-(2**63), 2**64)
# Names pydantic keeps for its own methods: a field named so is refused or breaks
# the model (``model_config`` is even dropped silently, as configuration).
_PROTECTED_PREFIXES = ("model_validate", "model_dump")


class SchemaError(TypeError):
    """A function whose parameters cannot become a tool schema."""


@dataclass(frozen=True)
class SizeLimit:
    """The ``--max-tool-schema-bytes`` a tool is checked against, and where the SDK
    got it: a refusal names both, so a limit from a forgotten environment
    variable is found at once."""

    bytes: int
    origin: str


DEFAULT_SIZE_LIMIT = SizeLimit(
    MAX_TOOL_SCHEMA_BYTES,
    "toolgate's default --max-tool-schema-bytes; for a toolgate whose limit is raised, "
    "pass Plugin(max_tool_schema_bytes=...) or set TOOLGATE_MAX_TOOL_SCHEMA_BYTES",
)


def arguments_model(fn: Callable[..., Any], model_name: str) -> type[pydantic.BaseModel]:
    """The model of ``fn``'s keyword-callable parameters.

    Every parameter needs a type hint (``Annotated[T, pydantic.Field(...)]`` adds a
    description); a parameter without a default is required. Unknown arguments
    are refused, matching ``additionalProperties: false`` in the schema. A
    ``CallContext`` parameter is left out: toolgate fills it, not the model (and
    ``CallContext`` anywhere else is refused by its own pydantic hook).
    """
    hints = _type_hints(fn, model_name)
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(fn).parameters.values():
        _check_parameter(parameter, hints, model_name)
        if is_context(hints[parameter.name]):
            continue
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    try:
        with warnings.catch_warnings():
            # Shadowing a deprecated BaseModel method (json, copy, schema) is harmless:
            # values are read from the instance's __dict__, never as attributes.
            warnings.filterwarnings("ignore", message=".*shadows an attribute", category=UserWarning)
            model: type[pydantic.BaseModel] = pydantic.create_model(
                model_name,
                __config__=pydantic.ConfigDict(extra="forbid"),
                **fields,
            )
    except Exception as exc:  # pydantic raises several kinds for a type it cannot use
        raise SchemaError(f"{model_name}: {exc}") from exc
    dropped = set(fields) - set(model.model_fields)
    if dropped:
        raise SchemaError(f"{model_name}: parameters {sorted(dropped)} are names pydantic keeps for itself")
    return model


def context_parameter(fn: Callable[..., Any], model_name: str) -> str | None:
    """The name of ``fn``'s ``CallContext`` parameter, if it has one (at most one)."""
    hints = _type_hints(fn, model_name)
    names = [name for name in inspect.signature(fn).parameters if name in hints and is_context(hints[name])]
    if len(names) > 1:
        raise SchemaError(f"{model_name}: only one parameter may be a CallContext, got {names}")
    return names[0] if names else None


def is_context(hint: Any) -> bool:
    """Whether a parameter of type ``hint`` gets the call's ``CallContext``: the class
    itself, optionally ``| None`` / ``Optional`` and ``Annotated``.

    Every spelling of "a CallContext" must be recognised: one that is not would
    become a schema property, and the model would fill the idempotency key."""
    hint = _unannotated(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = {_unannotated(option) for option in typing.get_args(hint)}
        return options == {CallContext, type(None)}
    return hint is CallContext


def _unannotated(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _type_hints(fn: Callable[..., Any], model_name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a hint naming something undefined
        raise SchemaError(f"cannot resolve the type hints of {model_name}: {exc}") from exc


def _check_parameter(parameter: inspect.Parameter, hints: dict[str, Any], model_name: str) -> None:
    if parameter.kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ):
        raise SchemaError(
            f"{model_name}: parameter {parameter.name!r} must be passable by keyword "
            "(no *args, **kwargs or positional-only parameters)"
        )
    if parameter.name not in hints:
        raise SchemaError(f"{model_name}: parameter {parameter.name!r} needs a type hint")
    if parameter.name.startswith("_"):
        raise SchemaError(f"{model_name}: parameter {parameter.name!r} may not start with _")
    reserved = parameter.name.startswith(_PROTECTED_PREFIXES) or (
        parameter.name.startswith("model_") and hasattr(pydantic.BaseModel, parameter.name)
    )
    if reserved:
        raise SchemaError(
            f"{model_name}: parameter {parameter.name!r} is a name pydantic keeps for itself; rename it"
        )


def check_registrable(schema: dict[str, Any], model_name: str) -> None:
    """Refuses a schema toolgate would refuse, or that cannot even be sent to it.

    A non-finite number (a default of ``float("inf")``) has no JSON spelling, so the
    registration request could not be written; toolgate refuses schemas nested
    deeper than ``MAX_SCHEMA_DEPTH``, and NUL in any string (a ``Literal`` value, a
    description, a default).
    """
    for text in _strings(schema):
        check_text(text, f"{model_name}: a string of the schema ({text[:40]!r})")
    try:
        json.dumps(schema, allow_nan=False)
    except ValueError as exc:
        raise SchemaError(
            f"{model_name}: the schema holds a number JSON cannot write (inf or nan, e.g. as a default): {exc}"
        ) from exc
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"{model_name}: the schema nests {depth} levels deep; toolgate's limit is {MAX_SCHEMA_DEPTH}")


def check_size(parameters: dict[str, Any], description: str, name: str, limit: SizeLimit = DEFAULT_SIZE_LIMIT) -> None:
    """Refuses a tool over toolgate's size limit as the plugin knows it, counted as
    toolgate counts.

    Here rather than left to toolgate, which refuses the registration: the plugin
    would only log that and offer the tool again every 30 s, to no end. The limit
    is the plugin's (``Plugin(max_tool_schema_bytes=...)``, else
    ``TOOLGATE_MAX_TOOL_SCHEMA_BYTES``, else toolgate's default); a toolgate set
    lower than the plugin was told (its config file, say) still refuses at
    registration."""
    size = registered_size(parameters, description)
    if size > limit.bytes:
        raise SchemaError(
            f"{name}: the parameters schema and description take {size} bytes (compact JSON, UTF-8); "
            f"the limit is {limit.bytes} bytes ({limit.origin})"
        )


def registered_size(parameters: dict[str, Any], description: str) -> int:
    """The bytes toolgate counts against ``--max-tool-schema-bytes``: the parameters as
    serde_json writes them plus the description, in UTF-8.

    pydantic writes JSON as serde_json does (compact, no escaping of non-ASCII,
    ``1.5e-7`` and ``0.00001`` where Python's json has ``1.5e-07`` and ``1e-05``),
    once integers toolgate reads as floats are floats (``10**30`` is ``1e+30`` there)."""
    return len(pydantic_core.to_json(_as_toolgate_reads(parameters))) + len(description.encode())


def _as_toolgate_reads(value: Any) -> Any:
    """``value`` with each integer past 64 bits a float, as toolgate reads it."""
    if isinstance(value, dict):
        return {key: _as_toolgate_reads(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_toolgate_reads(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and value not in _EXACT_INTEGERS:
        try:
            return float(value)
        except OverflowError:  # no float either: toolgate cannot read it at all
            return value
    return value


def check_text(text: str, what: str) -> None:
    """Refuses text toolgate cannot take: NUL (its database cannot store it, so it
    refuses U+0000 in any string of a request) or a lone surrogate (no UTF-8 at all)."""
    if "\x00" in text:
        raise SchemaError(f"{what} contains NUL (U+0000), which toolgate refuses")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise SchemaError(f"{what} is not valid Unicode (a lone surrogate): it has no UTF-8 form") from None


def _strings(value: Any) -> list[str]:
    """Every string of a JSON value, object keys included."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _depth(value: Any) -> int:
    """Nesting depth as toolgate counts it: a value is one level, its children one more."""
    if isinstance(value, dict):
        children: list[Any] = list(value.values())
    elif isinstance(value, list):
        children = value
    else:
        return 1
    return 1 + max((_depth(child) for child in children), default=0)


def integers_as_schema_reads(value: Any, schema: Any) -> Any:
    """``value`` with each whole float (``7.0``) an ``int`` where ``schema`` wants an
    integer there and no other number.

    JSON Schema, which toolgate checks a call's arguments against, counts ``7.0``
    as an integer; pydantic's strict mode refuses it for an ``int``. Without this,
    the plugin would refuse calls the schema it declared allows. What the schema
    does not count as an integer stays as it is for the model to refuse (``7.5``,
    ``true``, ``"7"``), and so does a float where the schema also takes any number
    (``int | float``, ``Any``): pydantic hands that over as the float."""
    return _as_ints(value, _alternatives(schema))


def _as_ints(value: Any, alternatives: list[dict[str, Any]]) -> Any:
    """``value`` converted under ``alternatives``, the schemas one of which it must match.

    Descends only along subschemas, so no deeper than the schema itself
    (``MAX_SCHEMA_DEPTH``), however deep the arguments."""
    if not alternatives or any(_takes_anything(alternative) for alternative in alternatives):
        return value
    if isinstance(value, float):
        whole = math.isfinite(value) and value.is_integer()
        return int(value) if whole and _integer_only(value, alternatives) else value
    if isinstance(value, list):
        return [_as_ints(item, _item_alternatives(alternatives, index)) for index, item in enumerate(value)]
    if isinstance(value, dict):
        candidates = [alternative for alternative in alternatives if _may_match_object(alternative, value)]
        return {key: _as_ints(item, _property_alternatives(candidates, key)) for key, item in value.items()}
    return value


def _alternatives(schema: Any) -> list[dict[str, Any]]:
    """The schemas one of which a value must match: unions (``anyOf``, ``oneOf``)
    flattened. ``allOf`` counts as one too: exact for pydantic's one-element
    wrapper, and for more it can only leave a float that could have been an int."""
    if schema is True:
        return [{}]
    if not isinstance(schema, dict):
        return []  # false: nothing matches
    branches = [*schema.get("anyOf", ()), *schema.get("oneOf", ()), *schema.get("allOf", ())]
    if branches:
        return [alternative for branch in branches for alternative in _alternatives(branch)]
    return [schema]


def _takes_anything(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` restricts neither the type nor the value (``Any``, ``{}``)."""
    return not any(key in schema for key in ("type", "enum", "const"))


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    return {item for item in kind if isinstance(item, str)} if isinstance(kind, list) else set()


def _integer_only(number: float, alternatives: list[dict[str, Any]]) -> bool:
    """Whether some alternative takes whole ``number`` as an integer and none as a float."""
    kinds = {_number_kind(number, alternative) for alternative in alternatives}
    return "integer" in kinds and "number" not in kinds


def _number_kind(number: float, schema: dict[str, Any]) -> str | None:
    """``"number"`` if ``schema`` takes ``number`` as a float, ``"integer"`` if as an
    integer only, else ``None``; an untyped ``enum`` (``Literal[1, "a"]``) by its members."""
    types = _types(schema)
    if "number" in types:
        return "number"
    if "integer" in types:
        return "integer"
    if types:
        return None
    members = schema["enum"] if isinstance(schema.get("enum"), list) else [schema.get("const")]
    equal = [member for member in members if _is_number(member) and member == number]
    if any(isinstance(member, float) for member in equal):
        return "number"
    return "integer" if equal else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _item_alternatives(alternatives: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The schemas of item ``index`` of an array: ``prefixItems`` (a tuple), then ``items``."""
    found: list[dict[str, Any]] = []
    for alternative in alternatives:
        if "array" not in _types(alternative):
            continue
        prefix = alternative.get("prefixItems")
        if isinstance(prefix, list) and index < len(prefix):
            found.extend(_alternatives(prefix[index]))
        else:
            found.extend(_alternatives(alternative.get("items", True)))
    return found


def _may_match_object(schema: dict[str, Any], value: dict[str, Any]) -> bool:
    """Whether object ``value`` may match ``schema``: its required keys are there and
    no ``const`` or ``enum`` of a property rules it out (the tag of a tagged union)."""
    if "object" not in _types(schema):
        return False
    if any(key not in value for key in schema.get("required", ()) if isinstance(key, str)):
        return False
    properties = schema.get("properties")
    for key, sub in properties.items() if isinstance(properties, dict) else ():
        if key not in value or not isinstance(sub, dict):
            continue
        if "const" in sub and value[key] != sub["const"]:
            return False
        if isinstance(sub.get("enum"), list) and value[key] not in sub["enum"]:
            return False
    return True


def _property_alternatives(alternatives: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The schemas of an object's ``key``: its property, else the patterns it matches,
    else ``additionalProperties``."""
    found: list[dict[str, Any]] = []
    for alternative in alternatives:
        properties = alternative.get("properties")
        if isinstance(properties, dict) and key in properties:
            found.extend(_alternatives(properties[key]))
            continue
        matching = _pattern_schemas(alternative.get("patternProperties"), key)
        if matching:
            found.extend(alternative for sub in matching for alternative in _alternatives(sub))
        else:
            found.extend(_alternatives(alternative.get("additionalProperties", True)))
    return found


def _pattern_schemas(patterns: Any, key: str) -> list[Any]:
    """The ``patternProperties`` schemas for ``key``; a pattern Python cannot read
    counts as matching with any value, which leaves the key's value as it is."""
    if not isinstance(patterns, dict):
        return []
    found: list[Any] = []
    for pattern, sub in patterns.items():
        try:
            if re.search(pattern, key):
                found.append(sub)
        except re.error:
            found.append(True)
    return found


# Keywords whose value is a map of names to subschemas: their keys are names,
# never keywords, so a property called "title" survives.
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
)
# Keywords whose value is one subschema or a list of them.
_SCHEMA_VALUES = frozenset(
    {
        "items",
        "prefixItems",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "propertyNames",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "allOf",
        "anyOf",
        "oneOf",
    }
)


def inline_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema with every local ``$ref`` inlined and no titles.

    A recursive model cannot be written without references and is refused.
    """
    try:
        schema = model.model_json_schema()
    except pydantic.PydanticInvalidForJsonSchema as exc:
        raise SchemaError(f"{model.__name__}: {exc}") from exc
    definitions = schema.pop("$defs", {})
    inlined: dict[str, Any] = _inline(schema, definitions, ())
    return inlined


def _inline(schema: Any, definitions: dict[str, Any], expanding: tuple[str, ...]) -> Any:
    if not isinstance(schema, dict):
        return schema  # a boolean schema
    out: dict[str, Any] = {}
    reference = schema.get("$ref")
    if reference is not None:
        name = _definition_name(reference)
        if name in expanding:
            raise SchemaError(
                f"{name} refers to itself; a tool schema must be written out without $ref"
            )
        if name not in definitions:
            raise SchemaError(f"unresolvable reference {reference!r}")
        out.update(_inline(definitions[name], definitions, (*expanding, name)))
    for key, value in schema.items():
        if key in ("$ref", "title"):
            continue
        if key == "discriminator" and isinstance(value, dict):
            # OpenAPI's hint; its mapping points into $defs, which are gone.
            out[key] = {name: sub for name, sub in value.items() if name != "mapping"}
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: _inline(sub, definitions, expanding) for name, sub in value.items()
            }
        elif key in _SCHEMA_VALUES and isinstance(value, list):
            out[key] = [_inline(sub, definitions, expanding) for sub in value]
        elif key in _SCHEMA_VALUES:
            out[key] = _inline(value, definitions, expanding)
        else:
            # Data (default, enum, const, examples) and plain keywords: as they are.
            out[key] = value
    return out


def _definition_name(reference: str) -> str:
    prefix = "#/$defs/"
    if not reference.startswith(prefix):
        raise SchemaError(f"unsupported reference {reference!r}")
    return reference[len(prefix) :]
