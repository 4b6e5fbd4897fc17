"""A function's parameters as a pydantic model and as the JSON Schema toolgate gets.

The model validates a call's arguments and the schema is generated from the same
model, so what the model is told and what the function accepts cannot drift apart.
The schema is self-contained: every ``$ref`` pydantic emits (enums, nested models)
is inlined, because models and many chat front-ends handle references badly.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

import pydantic

from .context import CallContext

__all__ = [
    "SchemaError",
    "arguments_model",
    "check_registrable",
    "check_text",
    "context_parameter",
    "inline_schema",
]

# toolgate refuses a parameter schema nested deeper than this (src/schema.rs MAX_SCHEMA_DEPTH),
# counting the top object as level 1 and a scalar inside it as level 2.
MAX_SCHEMA_DEPTH = 64
# Names pydantic keeps for its own methods: a field named so is refused or breaks
# the model (``model_config`` is even dropped silently, as configuration).
_PROTECTED_PREFIXES = ("model_validate", "model_dump")


class SchemaError(TypeError):
    """A function whose parameters cannot become a tool schema."""


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
