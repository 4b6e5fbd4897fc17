"""A function's parameters as a pydantic model and as the JSON Schema toolgate gets.

The model validates a call's arguments and the schema is generated from the same
model, so what the model is told and what the function accepts cannot drift apart.
The schema is self-contained: every ``$ref`` pydantic emits (enums, nested models)
is inlined, because models and many chat front-ends handle references badly.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pydantic

__all__ = ["SchemaError", "arguments_model", "inline_schema"]


class SchemaError(TypeError):
    """A function whose parameters cannot become a tool schema."""


def arguments_model(fn: Callable[..., Any], model_name: str) -> type[pydantic.BaseModel]:
    """The model of ``fn``'s keyword-callable parameters.

    Every parameter needs a type hint (``Annotated[T, pydantic.Field(...)]`` adds a
    description); a parameter without a default is required. Unknown arguments
    are refused, matching ``additionalProperties: false`` in the schema.
    """
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a hint naming something undefined
        raise SchemaError(f"cannot resolve the type hints of {model_name}: {exc}") from exc
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(fn).parameters.values():
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
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    try:
        return pydantic.create_model(
            model_name,
            __config__=pydantic.ConfigDict(extra="forbid"),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise SchemaError(f"{model_name}: {exc}") from exc


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
