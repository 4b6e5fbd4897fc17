"""Registration against the real toolgate: tools stand on their own, new characters
get them, a name another plugin holds is left to it, no character (or toolgate down,
or a character deleted) means no spam."""

from __future__ import annotations

import copy
import logging
import re
import socket
import threading
from typing import Annotated, Any

import anyio
import pytest
from pydantic import Field

from conftest import Api, Toolgate, serving, wait_for
from toolgate_plugin import Plugin, SchemaError, WatchTiming

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 10.0
# Quick polls, so that a few seconds cover many of them.
FAST = WatchTiming(poll_seconds=0.1, listing_every_polls=2, refused_retry_seconds=60.0)


def register_requests(caplog: pytest.LogCaptureFixture) -> int:
    return sum("/api/tools/register" in record.getMessage() for record in caplog.records if record.name == "httpx")


def plugin_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "toolgate_plugin" and r.levelno == level]


async def holders(api: Api, role: str, name: str) -> list[str]:
    """The sources holding ``name`` in ``role``."""
    listing = await api.get(f"/api/tools?role={role}")
    return [tool["source"] for tool in listing["tools_by_role"][role] if tool["name"] == name]


# An operator's lower --max-tool-schema-bytes, which the plugin is not told: toolgate refuses.
LOWERED_LIMIT = ("--max-tool-schema-bytes", "4096")
# toolgate's default --max-tool-schema-bytes, which the plugin checks at declaration.
SCHEMA_LIMIT = 256 * 1024
# An operator's raised --max-tool-schema-bytes, and a tool between the two limits.
RAISED_SCHEMA_LIMIT = 512 * 1024
RAISED_LIMIT = ("--max-tool-schema-bytes", str(RAISED_SCHEMA_LIMIT))
BETWEEN_LIMITS = 300 * 1024


def too_big(text: Annotated[str, Field(description="x" * 5_000)]) -> str:
    """Parameters over the lowered --max-tool-schema-bytes (4 KiB): a 422."""
    return text


def sized(pad: int) -> Any:
    """A tool whose parameters and description take ``pad`` bytes more than with
    no pad: non-ASCII, escapes and a float in exponent form (``1.5e-7``, not
    Python's ``1.5e-07``) make the count differ from a naive one."""

    def padded(text: str = "\u00e9", ratio: float = 1.5e-7) -> str:
        """Sized \u00fc."""
        return text

    padded.__annotations__["text"] = Annotated[str, Field(description="\u00e9\u4e2d\n\"/\x7f" + "x" * pad)]
    return padded


async def toolgates_count(api: Api, parameters: dict[str, Any], description: str) -> int:
    """The size toolgate gives a tool in its refusal (it must be over the limit)."""
    body = {"name": "probe", "description": description, "parameters": parameters}
    body["callback_url"] = "http://127.0.0.1:9/x"
    response = await api.http.post(f"{api.server.url}/api/tools/register", json=body)
    assert response.status_code == 422, response.text
    match = re.search(r"take (\d+) bytes", response.json()["error"]["message"])
    assert match is not None, response.text
    return int(match.group(1))


async def test_a_tool_over_toolgates_size_limit_is_refused_at_declaration(toolgate: Toolgate, api: Api) -> None:
    probe = Plugin("sizes")
    probe.tool()(sized(0))
    tool = probe.tools["padded"]
    # toolgate's own count, by its refusal of the same tool padded past its limit.
    parameters = copy.deepcopy(tool.parameters)
    parameters["properties"]["text"]["description"] += "x" * SCHEMA_LIMIT
    unpadded = await toolgates_count(api, parameters, tool.description) - SCHEMA_LIMIT
    fitting = SCHEMA_LIMIT - unpadded

    plugin = Plugin("sizes", toolgate_url=toolgate.url)
    with pytest.raises(SchemaError, match=rf"^over: .*{SCHEMA_LIMIT + 1} bytes.*limit is {SCHEMA_LIMIT} bytes"):
        plugin.tool(name="over")(sized(fitting + 1))
    assert "over" not in plugin.tools
    # Exactly at the limit: declared, and toolgate takes it.
    plugin.tool(name="fits")(sized(fitting))
    async with serving(plugin, api, DEADLINE_SECONDS, threading.Event()):
        assert set(await api.listed(plugin.source)) == {"fits"}


@pytest.mark.parametrize("toolgate", [RAISED_LIMIT], indirect=True)
@pytest.mark.parametrize("told_by", ["argument", "environment"])
async def test_a_plugin_told_of_a_raised_limit_registers_a_tool_over_the_default(
    toolgate: Toolgate, api: Api, monkeypatch: pytest.MonkeyPatch, told_by: str
) -> None:
    with pytest.raises(SchemaError, match=rf"limit is {SCHEMA_LIMIT} bytes"):
        Plugin("raised", toolgate_url=toolgate.url).tool(name="big")(sized(BETWEEN_LIMITS))
    if told_by == "argument":
        plugin = Plugin("raised", toolgate_url=toolgate.url, max_tool_schema_bytes=RAISED_SCHEMA_LIMIT)
    else:  # as a plugin started in toolgate's environment (conftest starts toolgate with the flag)
        monkeypatch.setenv("TOOLGATE_MAX_TOOL_SCHEMA_BYTES", str(RAISED_SCHEMA_LIMIT))
        plugin = Plugin("raised", toolgate_url=toolgate.url)
    plugin.tool(name="big")(sized(BETWEEN_LIMITS))
    async with serving(plugin, api, DEADLINE_SECONDS, threading.Event()):
        listed = await api.listed(plugin.source)
        assert set(listed) == {"big"}
        assert listed["big"]["parameters"] == plugin.tools["big"].parameters
        session = await api.session()
        result = await api.call(session, "big", {"text": "through"})
        assert result["output"] == "through", result


@pytest.mark.parametrize("toolgate", [LOWERED_LIMIT], indirect=True)
async def test_a_refused_tool_is_reported_once_and_holds_up_no_other(
    toolgate: Toolgate, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    plugin = Plugin("refusals", toolgate_url=toolgate.url, timing=FAST)
    plugin.tool(name="first")(lambda: "first")
    plugin.tool(name="nowhere", role="Nobody")(lambda: "nowhere")
    plugin.tool(name="too_big")(too_big)
    plugin.tool(name="last")(lambda: "last")
    await plugin.start()
    try:
        await wait_for("the tools toolgate takes", DEADLINE_SECONDS, lambda: _listed(api, plugin, {"first", "last"}))
        await wait_for("the first round's answers", DEADLINE_SECONDS, lambda: _true(register_requests(caplog) >= 4))
        await anyio.sleep(2.0)  # some twenty polls
        assert set(await api.listed(plugin.source)) == {"first", "last"}
        # Neither re-registered in a loop nor retried: the refused ones wait their 60 s.
        assert register_requests(caplog) == 4
        assert plugin.registered is False
        errors = [r.getMessage() for r in plugin_records(caplog, logging.ERROR)]
        assert len(errors) == 2, errors
        (nowhere,) = [m for m in errors if "'nowhere'" in m]
        assert "HTTP 404 not_found" in nowhere and 'role "Nobody" not found' in nowhere
        (big,) = [m for m in errors if "'too_big'" in m]
        assert "HTTP 422 validation_error" in big and "max_tool_schema_bytes" in big

        session = await api.session()
        result = await api.call(session, "last", {})
        assert result["output"] == "last"
    finally:
        await plugin.stop()


async def test_a_refused_tool_is_registered_once_toolgate_takes_it(toolgate: Toolgate, api: Api) -> None:
    timing = WatchTiming(poll_seconds=0.1, listing_every_polls=2, refused_retry_seconds=0.5)
    plugin = Plugin("later", toolgate_url=toolgate.url, timing=timing)
    plugin.tool(name="for_nobody", role="Nobody")(lambda: "here")
    await plugin.start()
    try:
        await api.post("/characters", {"name": "Nobody"})

        async def taken() -> bool:
            return await holders(api, "Nobody", "for_nobody") == [plugin.source]

        await wait_for("the refused tool once its role exists", DEADLINE_SECONDS, taken)
        await wait_for("registered", DEADLINE_SECONDS, lambda: _true(plugin.registered))
    finally:
        await plugin.stop()


async def test_refusals_are_logged_without_the_callback_token(
    toolgate: Toolgate, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    plugin = Plugin("masked", toolgate_url=toolgate.url, timing=FAST)
    plugin.tool(name="t")(lambda: 1)
    token = plugin._callbacks._token
    # A URL toolgate refuses (Plugin() itself refuses such a host; this reaches
    # past that check on purpose): its refusal may echo the URL, token and all.
    plugin._callbacks.url_for = lambda tool: f"http://127.0.0.1.example:9/{token}/tools/{tool.name}"  # type: ignore[method-assign]
    await plugin.start()
    try:
        await wait_for("the refusal", DEADLINE_SECONDS, lambda: _true(bool(plugin_records(caplog, logging.ERROR))))
        (refusal,) = plugin_records(caplog, logging.ERROR)
        assert "'t'" in refusal.getMessage() and "HTTP 422 validation_error: callback_url" in refusal.getMessage()
        assert all(token not in record.getMessage() for record in caplog.records)
    finally:
        await plugin.stop()


async def test_a_character_created_later_gets_the_tools(toolgate: Toolgate, api: Api) -> None:
    plugin = Plugin("everyone", toolgate_url=toolgate.url, timing=FAST)
    plugin.tool(name="everywhere")(lambda: "here too")
    await plugin.start()
    try:
        await wait_for("the tool", DEADLINE_SECONDS, lambda: _listed(api, plugin, {"everywhere"}))
        await api.post("/characters", {"name": "Newcomer"})

        async def in_newcomer() -> bool:
            return await holders(api, "Newcomer", "everywhere") == [plugin.source]

        await wait_for("the tool in the new character", DEADLINE_SECONDS, in_newcomer)
        session = (await api.post("/sessions", {"character": "Newcomer"}))["data"]["id"]
        result = await api.call(session, "everywhere", {})
        assert result["output"] == "here too", result
        assert plugin.registered
    finally:
        await plugin.stop()


async def test_a_name_another_plugin_took_is_left_to_it_until_free(
    toolgate: Toolgate, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    alpha = Plugin("alpha", toolgate_url=toolgate.url, timing=FAST)
    alpha.tool(name="lookup")(lambda: "alpha")
    beta = Plugin("beta", toolgate_url=toolgate.url, timing=FAST)
    beta.tool(name="lookup")(lambda: "beta")
    await alpha.start()
    try:
        await wait_for("alpha's lookup", DEADLINE_SECONDS, lambda: _held_by(api, "plugin:alpha"))
        await beta.start()
        await wait_for("beta's lookup", DEADLINE_SECONDS, lambda: _held_by(api, "plugin:beta"))
        await wait_for("beta registered", DEADLINE_SECONDS, lambda: _true(beta.registered))
        await wait_for("alpha to notice", DEADLINE_SECONDS, lambda: _true(not alpha.registered))
        requests = register_requests(caplog)
        for _ in range(10):  # two seconds: some ten listings of each plugin
            await anyio.sleep(0.2)
            assert await holders(api, "Lanlan", "lookup") == ["plugin:beta"]
        assert register_requests(caplog) == requests
        warnings = [r.getMessage() for r in plugin_records(caplog, logging.WARNING) if "plugin:beta" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "lookup" in warnings[0]
        assert alpha.registered is False and beta.registered is True

        await beta.stop()
        await wait_for("alpha's lookup again", DEADLINE_SECONDS, lambda: _held_by(api, "plugin:alpha"))
        await wait_for("alpha registered", DEADLINE_SECONDS, lambda: _true(alpha.registered))
        session = await api.session()
        assert (await api.call(session, "lookup", {}))["output"] == "alpha"
    finally:
        await beta.stop()
        await alpha.stop()


async def test_no_character_is_said_once_and_registered_is_false(
    toolgate: Toolgate, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    response = await api.http.delete(f"{toolgate.url}/characters/Lanlan")
    assert response.status_code == 200, response.text
    plugin = Plugin("lonely", toolgate_url=toolgate.url, timing=FAST)
    plugin.tool(name="alone")(lambda: "found")
    await plugin.start()
    try:
        await anyio.sleep(2.0)
        assert plugin.registered is False
        assert register_requests(caplog) == 1
        warnings = [r.getMessage() for r in plugin_records(caplog, logging.WARNING)]
        assert len(warnings) == 1 and "no role" in warnings[0], warnings

        await api.post("/characters", {"name": "Lanlan"})
        await wait_for("the tool in the first character", DEADLINE_SECONDS, lambda: _listed(api, plugin, {"alone"}))
        await wait_for("registered", DEADLINE_SECONDS, lambda: _true(plugin.registered))
    finally:
        await plugin.stop()


async def test_toolgate_down_at_the_start_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="toolgate_plugin")
    with socket.socket() as closed:  # bound, never listening: every connection is refused
        closed.bind(("127.0.0.1", 0))
        plugin = Plugin("early", toolgate_url=f"http://127.0.0.1:{closed.getsockname()[1]}", timing=FAST)
        plugin.tool(name="t")(lambda: 1)
        await plugin.start()
        try:
            await anyio.sleep(1.0)  # the first registration and a few polls
            warnings = [r.getMessage() for r in plugin_records(caplog, logging.WARNING)]
        finally:
            await plugin.stop()
    assert len(warnings) == 1 and "toolgate unreachable" in warnings[0], warnings


async def test_a_tool_of_a_deleted_character_is_not_said_to_be_evicted(
    toolgate: Toolgate, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await api.post("/characters", {"name": "Passing"})
    plugin = Plugin("passing", toolgate_url=toolgate.url, timing=FAST)
    plugin.tool(name="only_there", role="Passing")(lambda: 1)
    await plugin.start()
    try:
        await wait_for("registered", DEADLINE_SECONDS, lambda: _true(plugin.registered))
        response = await api.http.delete(f"{toolgate.url}/characters/Passing")
        assert response.status_code == 200, response.text
        await wait_for("the refusal", DEADLINE_SECONDS, lambda: _true(bool(plugin_records(caplog, logging.ERROR))))
        (refusal,) = plugin_records(caplog, logging.ERROR)
        assert 'role "Passing" not found' in refusal.getMessage()
        assert not [r for r in plugin_records(caplog, logging.WARNING) if "evicted" in r.getMessage()]
    finally:
        await plugin.stop()


async def _listed(api: Api, plugin: Plugin, names: set[str]) -> bool:
    return set(await api.listed(plugin.source)) == names


async def _held_by(api: Api, source: str) -> bool:
    return await holders(api, "Lanlan", "lookup") == [source]


async def _true(value: Any) -> bool:
    return bool(value)
