"""Schema derivation: what a function's type hints become in ``parameters``."""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from toolgate_plugin import Plugin, SchemaError


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    """A city."""

    city: Annotated[str, Field(description="City name")]
    country: str = "CN"


class Trip(BaseModel):
    stops: list[Place]
    start: Place


def derive(fn: Any, **options: Any) -> dict[str, Any]:
    plugin = Plugin("schema-test")
    plugin.tool(**options)(fn)
    (tool,) = plugin.tools.values()
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


def refs_anywhere(value: Any) -> bool:
    text = json.dumps(value)
    return "$ref" in text or "$defs" in text


def test_scalars_defaults_and_required() -> None:
    def lookup(text: str, count: int, ratio: float = 0.5, exact: bool = False, note: Optional[str] = None) -> None:
        """Looks something up.

        Second paragraph."""

    derived = derive(lookup)
    assert derived["name"] == "lookup"
    assert derived["description"] == "Looks something up.\n\nSecond paragraph."
    schema = derived["parameters"]
    assert schema["type"] == "object"
    assert schema["required"] == ["text", "count"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["text"] == {"type": "string"}
    assert props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number", "default": 0.5}
    assert props["exact"] == {"type": "boolean", "default": False}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert "title" not in json.dumps(schema)


def test_annotated_field_description_and_literal_enum_inline() -> None:
    def weather(
        location: Annotated[str, Field(description="Where, e.g. Shanghai")],
        unit: Literal["c", "f"] = "c",
        scale: Unit = Unit.CELSIUS,
    ) -> None:
        pass

    props = derive(weather)["parameters"]["properties"]
    assert props["location"] == {"type": "string", "description": "Where, e.g. Shanghai"}
    assert props["unit"] == {"type": "string", "enum": ["c", "f"], "default": "c"}
    # An Enum class is a $defs entry in pydantic's schema: inlined on the property.
    assert props["scale"]["enum"] == ["celsius", "fahrenheit"]
    assert props["scale"]["default"] == "celsius"
    assert not refs_anywhere(props)


def test_nested_models_are_inlined_without_refs() -> None:
    def plan(trip: Annotated[Trip, Field(description="The trip")], extra: list[Place] = []) -> None:
        pass

    schema = derive(plan)["parameters"]
    assert not refs_anywhere(schema)
    trip = schema["properties"]["trip"]
    assert trip["description"] == "The trip"
    assert trip["type"] == "object"
    assert trip["required"] == ["stops", "start"]
    place = trip["properties"]["start"]
    assert place["properties"]["city"] == {"type": "string", "description": "City name"}
    assert place["required"] == ["city"]
    assert trip["properties"]["stops"]["items"] == place
    assert schema["properties"]["extra"]["items"] == place


def test_a_property_named_title_survives_and_options_apply() -> None:
    def note(title: str, body: str = "") -> None:
        """Ignored: the description is given."""

    derived = derive(note, name="write_note", description="Write a note.")
    assert derived["name"] == "write_note"
    assert derived["description"] == "Write a note."
    assert derived["parameters"]["properties"]["title"] == {"type": "string"}


def test_no_parameters_is_an_empty_object_schema() -> None:
    def ping() -> str:
        return "pong"

    schema = derive(ping)["parameters"]
    assert schema["type"] == "object"
    assert schema["properties"] == {}
    assert "required" not in schema


class Node(BaseModel):
    children: list[Node] = []


@pytest.mark.parametrize(
    ("fn_source", "message"),
    [
        ("def f(x): pass", "needs a type hint"),
        ("def f(*args: int): pass", "by keyword"),
        ("def f(**kw: int): pass", "by keyword"),
        ("def f(tree: Node): pass", "refers to itself"),
    ],
)
def test_undescribable_functions_are_refused(fn_source: str, message: str) -> None:
    namespace: dict[str, Any] = {"Node": Node}
    exec(fn_source, namespace)
    with pytest.raises(SchemaError, match=message):
        derive(namespace["f"])


def test_options_are_checked_and_registered() -> None:
    plugin = Plugin("opts")

    @plugin.tool(
        role="Lanlan",
        timeout_seconds=3,
        side_effect_level="irreversible",
        allowed_slots=["narrator"],
        async_capability="deferred_ok",
        default_delivery_mode="async_job",
    )
    def launch(target: str) -> None:
        pass

    body = plugin.tools["launch"].registration("http://127.0.0.1:1/t/tools/launch", plugin.source)
    assert body["source"] == "plugin:opts"
    assert body["role"] == "Lanlan"
    assert body["side_effect_level"] == "irreversible"
    assert body["allowed_slots"] == ["narrator"]
    assert body["async_capability"] == "deferred_ok"
    assert body["default_delivery_mode"] == "async_job"
    # toolgate waits a little longer than the function may run.
    assert body["timeout_seconds"] > 3

    with pytest.raises(SchemaError, match="timeout_seconds"):
        plugin.tool(timeout_seconds=0)(lambda: None)
    with pytest.raises(SchemaError, match="async_job"):
        plugin.tool(name="x", default_delivery_mode="async_job")(lambda: None)
    with pytest.raises(ValueError, match="already has"):
        plugin.tool(name="launch")(lambda: None)
