"""A plugin against the real toolgate: registration, calls, restarts, eviction, stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from conftest import Api, Toolgate, all_listed, serving, wait_for
from toolgate_plugin import Plugin

pytestmark = pytest.mark.anyio

# The promise: registered again within 10 s of toolgate being back.
REREGISTER_DEADLINE_SECONDS = 10.0
# stop() and signals: the process is gone within 5 s.
EXIT_DEADLINE_SECONDS = 5.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "weather.py"


class Order(BaseModel):
    item: str
    quantity: int = 1


seen_types: list[str] = []
release_blocking = threading.Event()


def make_plugin(toolgate: Toolgate) -> Plugin:
    plugin = Plugin("pytest", toolgate_url=toolgate.url)

    @plugin.tool()
    def price(order: Order, currency: Literal["EUR", "CNY"] = "EUR") -> dict[str, Any]:
        """Price an order."""
        # The function gets the validated model, not a dict.
        seen_types.append(type(order).__name__)
        assert threading.current_thread() is not threading.main_thread()
        return {"item": order.item, "total": order.quantity * 2.5, "currency": currency}

    @plugin.tool(name="greet")
    async def greet_async(name: Annotated[str, Field(description="Who")]) -> str:
        """Greet someone."""
        await asyncio.sleep(0)
        return f"hello {name}"

    @plugin.tool()
    def explode(reason: str) -> None:
        """Always fails."""
        raise RuntimeError(f"exploded because {reason}")

    @plugin.tool(timeout_seconds=0.3)
    async def slow_async() -> str:
        await asyncio.sleep(60)
        return "never"

    @plugin.tool(timeout_seconds=0.3)
    def slow_sync() -> str:
        release_blocking.wait(60)
        return "never"

    return plugin


@pytest.fixture
async def plugin(toolgate: Toolgate, api: Api) -> AsyncIterator[Plugin]:
    async with serving(make_plugin(toolgate), api, REREGISTER_DEADLINE_SECONDS, release_blocking) as plugin:
        yield plugin


async def test_tools_are_registered_with_their_schemas(api: Api, plugin: Plugin) -> None:
    listed = await api.listed("plugin:pytest")
    assert set(listed) == {"price", "greet", "explode", "slow_async", "slow_sync"}
    for name, tool in plugin.tools.items():
        assert listed[name]["parameters"] == tool.parameters
        assert listed[name]["description"] == tool.description
        assert listed[name]["callback_url"].startswith(f"http://127.0.0.1:{plugin.callback_port}/")
    assert listed["greet"]["description"] == "Greet someone."

    session = await api.session()
    catalog = await api.get(f"/sessions/{session}/tools/runtime")
    by_name = {tool["name"]: tool for tool in catalog["data"]["tools"]}
    assert {"price", "greet", "explode", "slow_async", "slow_sync"} <= set(by_name)
    assert by_name["price"]["parameters"] == plugin.tools["price"].parameters


async def test_calls_reach_sync_and_async_functions_with_validated_arguments(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    seen_types.clear()
    result = await api.call(session, "price", {"order": {"item": "tea", "quantity": 4}, "currency": "CNY"})
    assert result["is_error"] is False, result
    assert result["output"] == {"item": "tea", "total": 10.0, "currency": "CNY"}
    assert seen_types == ["Order"]

    result = await api.call(session, "greet", {"name": "Lanlan"})
    assert result["is_error"] is False, result
    assert result["output"] == "hello Lanlan"

    # toolgate checks the schema first: a wrong enum value never reaches the plugin.
    result = await api.call(session, "price", {"order": {"item": "tea"}, "currency": "USD"})
    assert result["is_error"] is True
    assert seen_types == ["Order"]


async def test_the_callback_validates_with_the_functions_own_model(plugin: Plugin, api: Api) -> None:
    url = (await api.listed(plugin.source))["price"]["callback_url"]
    async with httpx.AsyncClient() as client:
        bad = await client.post(url, json={"name": "price", "arguments": {"order": {"quantity": "many"}}, "call_id": "c1"})
        good = await client.post(
            url, json={"name": "price", "arguments": None, "call_id": "c2", "raw_arguments": '{"order": {"item": "x"}}'}
        )
        wrong_token = await client.post(url.replace("/tools/", "x/tools/"), json={})
    assert bad.status_code == 200
    assert bad.json()["is_error"] is True
    assert "order.item" in bad.json()["error"] and "order.quantity" in bad.json()["error"]
    assert good.json() == {"output": {"item": "x", "total": 2.5, "currency": "EUR"}, "is_error": False}
    assert wrong_token.status_code == 404


async def test_exceptions_and_timeouts_reach_the_model_as_errors(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    result = await api.call(session, "explode", {"reason": "testing"})
    assert result["is_error"] is True
    assert "RuntimeError: exploded because testing" in result["output"]
    assert "Traceback" not in result["output"]

    for name in ("slow_async", "slow_sync"):
        result = await api.call(session, name, {})
        assert result["is_error"] is True, result
        assert f"{name} did not finish within its timeout of 0.3 seconds" in result["output"]


async def test_a_restarted_toolgate_gets_the_tools_back(toolgate: Toolgate, api: Api, plugin: Plugin) -> None:
    before = await api.get("/healthz")
    toolgate.kill()
    toolgate.start()
    after = await api.get("/healthz")
    assert after["boot_id"] != before["boot_id"]
    await wait_for("re-registration after a restart", REREGISTER_DEADLINE_SECONDS, lambda: all_listed(api, plugin))
    session = await api.session()
    result = await api.call(session, "greet", {"name": "again"})
    assert result["is_error"] is False, result
    assert result["output"] == "hello again"


async def test_an_evicted_plugin_registers_again_once_it_answers(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    # The plugin's server goes away (as when its process hangs up its socket):
    # three refused connections evict the plugin's origin.
    await plugin._callbacks.close()
    for reason in ("remote_connection_failed", "remote_connection_failed", "remote_plugin_evicted"):
        result = await api.call(session, "greet", {"name": "nobody"})
        assert result["is_error"] is True
        assert result["execution_reason_code"] == reason, result
    assert await api.listed(plugin.source) == {}

    await plugin._callbacks.open()
    await wait_for("re-registration after eviction", REREGISTER_DEADLINE_SECONDS, lambda: all_listed(api, plugin))
    result = await api.call(session, "greet", {"name": "back"})
    assert result["output"] == "hello back"


async def test_stop_clears_the_tools_and_leaves_others(toolgate: Toolgate, api: Api, plugin: Plugin) -> None:
    other = Plugin("other", toolgate_url=toolgate.url)
    other.tool(name="other_tool")(lambda: "x")
    await other.start()
    try:
        await wait_for("the other plugin", REREGISTER_DEADLINE_SECONDS, lambda: all_listed(api, other))
        await plugin.stop()
        assert await api.listed(plugin.source) == {}
        assert set(await api.listed(other.source)) == {"other_tool"}
    finally:
        await other.stop()
    assert await api.listed(other.source) == {}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_clears_the_tools_and_exits(toolgate: Toolgate, api: Api, signum: int) -> None:
    env = {**os.environ, "TOOLGATE_URL": toolgate.url}
    process = subprocess.Popen([sys.executable, str(EXAMPLE)], env=env, stdin=subprocess.DEVNULL)
    try:
        await wait_for(
            "the example's tools",
            REREGISTER_DEADLINE_SECONDS,
            lambda: _listed_names(api, {"get_weather", "compare_weather"}),
        )
        session = await api.session()
        result = await api.call(session, "get_weather", {"location": "Tokyo", "unit": "fahrenheit"})
        assert result["output"] == {"location": "Tokyo", "temperature": 72.5, "unit": "fahrenheit"}
        result = await api.call(session, "compare_weather", {"places": [{"city": "Tokyo"}, {"city": "Shanghai"}]})
        assert [row["city"] for row in result["output"]] == ["Shanghai", "Tokyo"]

        process.send_signal(signum)
        # Raises TimeoutExpired when the plugin is still running after the deadline.
        code = await asyncio.to_thread(process.wait, EXIT_DEADLINE_SECONDS)
        assert code == 0
        assert await api.listed("plugin:weather") == {}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def _listed_names(api: Api, names: set[str]) -> bool:
    return set(await api.listed("plugin:weather")) == names
