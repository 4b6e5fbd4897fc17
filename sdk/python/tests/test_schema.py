"""Schema derivation: what a function's type hints become in ``parameters``."""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import re
from typing import Annotated, Any, Literal, Optional, Union

import pytest
from pydantic import BaseModel, Field

from toolgate_plugin import CallContext, Plugin, SchemaError, Tool, ToolOptions, WatchTiming


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


class Cat(BaseModel):
    kind: Literal["cat"]
    meows: int


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: int


def test_a_discriminated_union_keeps_no_reference_mapping() -> None:
    def adopt(pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]) -> None:
        pass

    pet = derive(adopt)["parameters"]["properties"]["pet"]
    assert not refs_anywhere(pet) and "#/" not in json.dumps(pet)
    assert pet["discriminator"] == {"propertyName": "kind"}
    assert [option["properties"]["kind"]["const"] for option in pet["oneOf"]] == ["cat", "dog"]


def test_a_call_context_parameter_is_no_part_of_the_schema() -> None:
    def record(row: str, call: CallContext) -> None:
        pass

    plugin = Plugin("ctx")
    plugin.tool()(record)
    tool = plugin.tools["record"]
    assert tool.context_parameter == "call"
    assert set(tool.parameters["properties"]) == {"row"}
    assert tool.parameters["required"] == ["row"]

    def twice(a: CallContext, b: CallContext) -> None:
        pass

    with pytest.raises(SchemaError, match="one parameter"):
        derive(twice)


def optional_context(row: str, call: CallContext | None = None) -> Any:
    return call


def optional_context_old_spelling(row: str, call: Optional[CallContext] = None) -> Any:
    return call


def annotated_context(row: str, call: Annotated[CallContext, "delivery facts"]) -> Any:
    return call


def annotated_optional_context(row: str, call: Annotated[Optional[CallContext], "facts"] = None) -> Any:
    return call


@pytest.mark.parametrize(
    "fn", [optional_context, optional_context_old_spelling, annotated_context, annotated_optional_context]
)
def test_every_spelling_of_a_call_context_gets_the_context(fn: Any) -> None:
    plugin = Plugin("ctx")
    plugin.tool()(fn)
    tool = plugin.tools[fn.__name__]
    assert tool.context_parameter == "call"
    assert set(tool.parameters["properties"]) == {"row"}
    context = CallContext(call_id="c1", idempotency_key="texec_1", attempt=2)
    answer = asyncio.run(tool.answer({"row": "r"}, context))
    assert answer["output"] == {"call_id": "c1", "idempotency_key": "texec_1", "attempt": 2}, answer
    # The model cannot fill it: it is no argument at all.
    forged = asyncio.run(tool.answer({"row": "r", "call": {"idempotency_key": "texec_forged"}}, context))
    assert forged["is_error"] is True and "call" in forged["error"]


class Job(BaseModel):
    model_config = {"defer_build": True}
    label: str
    call: CallContext


def in_a_list(calls: list[CallContext]) -> None:
    pass


def in_a_union(call: Union[CallContext, int]) -> None:
    pass


def in_a_model(job: Job) -> None:
    pass


@pytest.mark.parametrize("fn", [in_a_list, in_a_union, in_a_model])
def test_a_call_context_anywhere_else_is_refused(fn: Any) -> None:
    with pytest.raises(SchemaError, match="CallContext is filled by toolgate"):
        derive(fn)


def test_replay_safety_is_registered() -> None:
    plugin = Plugin("replay")
    plugin.tool(replay_safety="confirm_on_replay")(lambda: None)
    body = plugin.tools["<lambda>"].registration("http://127.0.0.1:1/t/tools/x", plugin.source)
    assert body["replay_safety"] == "confirm_on_replay"


def infinite(limit: float = float("inf")) -> None:
    pass


def model_config(model_config: str) -> None:
    pass


def model_fields(model_fields: str) -> None:
    pass


def model_dump(model_dump: str) -> None:
    pass


class CallableObject:
    def __call__(self, a: int) -> int:
        return a


def two(a: int, b: str = "x") -> str:
    return b * a


def nul_literal(v: Literal["a\x00"]) -> None:
    pass


def nul_field_description(v: Annotated[str, Field(description="x\x00")]) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "options", "message"),
    [
        (infinite, {}, "inf or nan"),
        (model_config, {}, "pydantic keeps"),
        (model_fields, {}, "pydantic keeps"),
        (model_dump, {}, "pydantic keeps"),
        (functools.partial(two, b="y"), {}, "must be a function"),
        (functools.partial(two, b="y"), {"name": "named"}, "must be a function"),
        (CallableObject(), {}, "must be a function"),
        (two, {"description": "d" * 16385}, "16384 bytes"),
        (two, {"description": "\u00e9" * 8193}, "16384 bytes"),
        (two, {"name": ".."}, "path segment"),
        (two, {"name": "."}, "path segment"),
        (two, {"name": "a\x00b"}, "NUL"),
        (two, {"name": "a\ud800"}, "lone surrogate"),
        (two, {"description": "x\x00y"}, "NUL"),
        (two, {"role": "La\x00nlan"}, "NUL"),
        (nul_literal, {}, "NUL"),
        (nul_field_description, {}, "NUL"),
    ],
)
def test_what_toolgate_would_refuse_is_refused_at_declaration(fn: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        derive(fn, **options)


def test_a_schema_nested_past_toolgates_limit_is_refused() -> None:
    nested: Any = int
    for _ in range(70):  # each list is one level more (its "items" schema)
        nested = list[nested]

    def deep(x: Any) -> None:
        pass

    deep.__annotations__["x"] = nested
    with pytest.raises(SchemaError, match="levels deep"):
        derive(deep)


def test_names_shadowing_old_basemodel_methods_still_work() -> None:
    def shadows(json: str, copy: int, model_name: str) -> str:
        return f"{json}{copy}{model_name}"

    plugin = Plugin("shadows")
    plugin.tool()(shadows)
    tool = plugin.tools["shadows"]
    assert set(tool.parameters["properties"]) == {"json", "copy", "model_name"}
    answer = asyncio.run(tool.answer({"json": "j", "copy": 1, "model_name": "m"}))
    assert answer == {"output": "j1m", "is_error": False}


def test_a_plugin_name_toolgate_would_refuse_as_a_source_is_refused() -> None:
    Plugin("x" * 121)  # plugin:<name> is toolgate's 128 characters
    for name, message in [("x" * 122, "at most 121"), ("a\x00b", "NUL"), ("", "needs a name")]:
        with pytest.raises(ValueError, match=message):
            Plugin(name)


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ({"listing_every_polls": 0}, "listing_every_polls must be at least 1"),
        ({"listing_every_polls": 1.5}, "listing_every_polls must be an integer"),
        ({"poll_seconds": 0}, "poll_seconds"),
        ({"poll_seconds": float("nan")}, "poll_seconds"),
        ({"backoff_first_seconds": -1}, "backoff_first_seconds"),
        ({"refused_retry_seconds": float("inf")}, "refused_retry_seconds"),
        ({"backoff_first_seconds": 3, "backoff_max_seconds": 2}, "not be less than"),
    ],
)
def test_timings_that_cannot_work_are_refused(timing: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WatchTiming(**timing)


# toolgate's default --max-tool-schema-bytes, and a raised one an operator might set.
DEFAULT_LIMIT = 256 * 1024
RAISED_LIMIT = 512 * 1024
LIMIT_ENV = "TOOLGATE_MAX_TOOL_SCHEMA_BYTES"


def of_size(pad: int) -> Any:
    """A tool whose parameters and description take a little over ``pad`` bytes."""

    def padded(text: str) -> str:
        return text

    padded.__annotations__["text"] = Annotated[str, Field(description="x" * pad)]
    return padded


def test_the_argument_raises_the_size_limit() -> None:
    big = of_size(300 * 1024)
    with pytest.raises(SchemaError, match=rf"limit is {DEFAULT_LIMIT} bytes \(toolgate's default"):
        Plugin("sizes").tool()(big)
    plugin = Plugin("sizes", max_tool_schema_bytes=RAISED_LIMIT)
    assert plugin.max_tool_schema_bytes == RAISED_LIMIT
    plugin.tool()(big)
    assert "padded" in plugin.tools
    with pytest.raises(SchemaError, match=rf"limit is {RAISED_LIMIT} bytes \(set by Plugin\(max_tool_schema_bytes"):
        plugin.tool(name="bigger")(of_size(RAISED_LIMIT))


@pytest.mark.parametrize("value", [str(RAISED_LIMIT), f"+{RAISED_LIMIT}"])
def test_the_environment_raises_the_size_limit(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(LIMIT_ENV, value)
    plugin = Plugin("sizes")
    assert plugin.max_tool_schema_bytes == RAISED_LIMIT
    plugin.tool()(of_size(300 * 1024))
    assert "padded" in plugin.tools
    from_env = rf"limit is {RAISED_LIMIT} bytes \(set by the environment variable {LIMIT_ENV}"
    with pytest.raises(SchemaError, match=from_env):
        plugin.tool(name="bigger")(of_size(RAISED_LIMIT))


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    big = of_size(300 * 1024)
    monkeypatch.setenv(LIMIT_ENV, str(RAISED_LIMIT))
    lower = Plugin("sizes", max_tool_schema_bytes=DEFAULT_LIMIT)
    with pytest.raises(SchemaError, match=rf"limit is {DEFAULT_LIMIT} bytes \(set by Plugin\("):
        lower.tool()(big)
    monkeypatch.setenv(LIMIT_ENV, "4096")
    Plugin("sizes", max_tool_schema_bytes=RAISED_LIMIT).tool()(big)
    # The environment is not read at all then, as toolgate's flag shadows its variable.
    monkeypatch.setenv(LIMIT_ENV, "lots")
    assert Plugin("sizes", max_tool_schema_bytes=RAISED_LIMIT).max_tool_schema_bytes == RAISED_LIMIT


def test_a_lower_limit_refuses_a_tool_the_default_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    small = of_size(5_000)
    Plugin("sizes").tool()(small)
    with pytest.raises(SchemaError, match=r"^padded: .* bytes .*limit is 4096 bytes \(set by Plugin\("):
        Plugin("sizes", max_tool_schema_bytes=4096).tool()(small)
    monkeypatch.setenv(LIMIT_ENV, "4096")
    with pytest.raises(SchemaError, match=rf"limit is 4096 bytes \(set by the environment variable {LIMIT_ENV}"):
        Plugin("sizes").tool()(small)


def test_a_tool_declared_without_a_plugin_has_the_default_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolgate_plugin.schema import SizeLimit  # here: the module's other tests need not have it

    big = of_size(300 * 1024)
    # The environment is the plugin's to read: a Tool of its own is checked as toolgate's default says.
    monkeypatch.setenv(LIMIT_ENV, str(RAISED_LIMIT))
    with pytest.raises(SchemaError, match=rf"limit is {DEFAULT_LIMIT} bytes"):
        Tool.from_function(big, ToolOptions())
    raised = SizeLimit(RAISED_LIMIT, "given")
    assert Tool.from_function(big, ToolOptions(), size_limit=raised).name == "padded"
    with pytest.raises(SchemaError, match=r"limit is 4096 bytes \(given\)"):
        Tool.from_function(of_size(5_000), ToolOptions(), size_limit=SizeLimit(4096, "given"))


@pytest.mark.parametrize("value", [0, -1, 1.5, float(RAISED_LIMIT), str(RAISED_LIMIT), True])
def test_a_size_limit_argument_that_is_no_positive_integer_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^Plugin\(max_tool_schema_bytes=\.\.\.\) must be a positive integer"):
        Plugin("sizes", max_tool_schema_bytes=value)


@pytest.mark.parametrize("value", ["0", "", "-5", "lots", " 4096", "4096 ", "4_096", "4096.0", "0x1000", "\u0664"])
def test_a_size_limit_in_the_environment_that_toolgate_could_not_read_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(LIMIT_ENV, value)
    message = rf"^the environment variable {LIMIT_ENV} must be a positive integer .*{re.escape(repr(value))}"
    with pytest.raises(ValueError, match=message):
        Plugin("sizes")
