"""Calls against the real toolgate: what a tool raises or returns, names in URLs,
browser requests, delivery facts, strict arguments, a full thread pool."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from conftest import Api, Toolgate, all_listed, serving, wait_for
from toolgate_plugin import CallContext, Plugin

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 10.0
NAMES = ["q?x", "h#x", "s/x", "pct%41", "a b", "ünï", "<lambda>", "get.weather"]

contexts: list[CallContext] = []
release = threading.Event()


def make_plugin(toolgate: Toolgate) -> Plugin:
    plugin = Plugin("calls", toolgate_url=toolgate.url)

    @plugin.tool()
    def uses_argparse(flag: str = "--nope") -> str:
        argparse.ArgumentParser(exit_on_error=False).parse_args([flag])
        return "parsed"

    @plugin.tool()
    async def exits() -> str:
        sys.exit(4)

    @plugin.tool()
    def interrupted() -> str:
        raise KeyboardInterrupt

    @plugin.tool()
    def lazy() -> Any:
        def rows() -> Iterator[int]:
            yield 1
            raise ValueError("lazy failure")

        return rows()

    @plugin.tool(replay_safety="safe")
    def delivered(row: str, call: CallContext) -> str:
        contexts.append(call)
        return row

    @plugin.tool()
    def typed(n: int, flag: bool = False, scores: dict[int, str] | None = None) -> dict[str, Any]:
        return {"n": n, "flag": flag}

    @plugin.tool(timeout_seconds=10)
    def blocking(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @plugin.tool(timeout_seconds=1)
    def held() -> str:
        release.wait(30)
        return "released"

    for name in NAMES:
        plugin.tool(name=name)(lambda: "reached")
    return plugin


@pytest.fixture
async def plugin(toolgate: Toolgate, api: Api) -> AsyncIterator[Plugin]:
    async with serving(make_plugin(toolgate), api, DEADLINE_SECONDS, release) as plugin:
        yield plugin


async def callback_url(api: Api, plugin: Plugin, name: str) -> str:
    url: str = (await api.listed(plugin.source))[name]["callback_url"]
    return url


async def test_system_exit_and_keyboard_interrupt_are_tool_errors(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    for name, message in [
        ("uses_argparse", "SystemExit: 2"),
        ("exits", "SystemExit: 4"),
        ("interrupted", "KeyboardInterrupt"),
        ("lazy", "ValueError: lazy failure"),
    ]:
        result = await api.call(session, name, {})
        assert result["is_error"] is True, result
        assert result["execution_reason_code"] == "remote_tool_error", result
        assert result["output"] == message
    # The plugin lives on.
    result = await api.call(session, "typed", {"n": 1})
    assert result["output"] == {"n": 1, "flag": False}, result


async def test_any_name_toolgate_takes_is_callable(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    for name in NAMES:
        result = await api.call(session, name, {})
        assert result["output"] == "reached", (name, result)


async def test_the_tool_sees_the_calls_idempotency_key_and_attempt(api: Api, plugin: Plugin) -> None:
    listed = (await api.listed(plugin.source))["delivered"]
    assert listed["replay_safety"] == "safe"
    assert "call" not in listed["parameters"]["properties"]
    contexts.clear()
    session = await api.session()
    result = await api.call(session, "delivered", {"row": "r1"})
    assert result["output"] == "r1", result
    (context,) = contexts
    assert context.idempotency_key == result["execution_id"]
    assert context.attempt == 1
    assert context.call_id == result["call_id"]


async def test_browser_requests_and_non_json_bodies_are_refused(plugin: Plugin, api: Api) -> None:
    url = await callback_url(api, plugin, "typed")
    body = '{"name": "typed", "arguments": {"n": 1}}'
    async with httpx.AsyncClient() as client:
        from_page = await client.post(url, content=body, headers={"content-type": "application/json", "origin": "http://evil.example"})
        as_text = await client.post(url, content=body, headers={"content-type": "text/plain"})
        as_form = await client.post(url, content=body, headers={"content-type": "application/x-www-form-urlencoded"})
        plain = await client.post(url, content=body, headers={"content-type": "application/json"})
    assert from_page.status_code == 403 and from_page.json()["is_error"] is True
    assert as_text.status_code == 415 and as_form.status_code == 415
    assert plain.json() == {"output": {"n": 1, "flag": False}, "is_error": False}


async def test_direct_calls_are_validated_strictly_and_logged_without_data(
    plugin: Plugin, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    url = await callback_url(api, plugin, "typed")
    async with httpx.AsyncClient() as client:
        lax = await client.post(url, json={"arguments": {"n": "7", "flag": "yes"}})
    assert lax.json()["is_error"] is True
    assert "n:" in lax.json()["error"] and "flag:" in lax.json()["error"]

    session = await api.session()
    result = await api.call(session, "typed", {"n": 1, "scores": {"alice@example.com": "A"}})
    assert result["is_error"] is True
    # The model is told which key; the log is not.
    assert "alice@example.com" in result["output"]
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "scores.*.[key] (int_parsing)" in logged
    assert "alice" not in logged


async def test_deep_json_is_a_clear_400_not_a_500(plugin: Plugin, api: Api) -> None:
    url = await callback_url(api, plugin, "typed")
    deep = "[" * 100_000 + "]" * 100_000
    async with httpx.AsyncClient(timeout=30) as client:
        body = await client.post(url, content=deep, headers={"content-type": "application/json"})
        nested = await client.post(
            url, content='{"arguments": {"n": 1, "x": ' + deep + "}}", headers={"content-type": "application/json"}
        )
        raw = await client.post(url, json={"arguments": None, "raw_arguments": deep})
    assert body.status_code == 400 and nested.status_code == 400
    assert raw.status_code == 200 and raw.json()["is_error"] is True


async def test_calls_past_the_thread_limit_wait_for_a_thread(
    plugin: Plugin, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    # Two threads stand for the 32: four calls of 0.5 s wait their turn.
    plugin.tools["blocking"]._threads = threading.BoundedSemaphore(2)
    sessions = [await api.session() for _ in range(4)]
    results = await asyncio.gather(*(api.call(session, "blocking", {"seconds": 0.5}) for session in sessions))
    assert [result["output"] for result in results] == [0.5] * 4, results
    assert not [record for record in caplog.records if record.exc_info]


async def test_a_call_that_finds_no_thread_in_time_is_a_clear_error(
    plugin: Plugin, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    plugin.tools["held"]._threads = threading.BoundedSemaphore(1)
    first, second = await api.session(), await api.session()
    results = await asyncio.gather(api.call(first, "held", {}), api.call(second, "held", {}))
    outputs = sorted(result["output"] for result in results)
    assert outputs[0] == "held did not finish within its timeout of 1 seconds"
    assert outputs[1].startswith("held did not start within its timeout of 1 seconds")
    assert not [record for record in caplog.records if record.exc_info]


async def test_a_job_handed_over_again_comes_with_the_same_key(toolgate: Toolgate, api: Api) -> None:
    seen: list[CallContext] = []
    applied: set[str | None] = set()
    effects: list[str] = []
    plugin = Plugin("jobs", toolgate_url=toolgate.url)

    @plugin.tool(side_effect_level="sandbox", async_capability="deferred_ok", default_delivery_mode="async_job")
    async def append_row(row: str, call: CallContext) -> str:
        seen.append(call)
        if call.idempotency_key not in applied:  # as the README shows
            applied.add(call.idempotency_key)
            effects.append(row)
        await asyncio.sleep(3)  # long enough to be cut off by the restart
        return "appended"

    await plugin.start()
    try:
        await wait_for("the job tool", DEADLINE_SECONDS, lambda: all_listed(api, plugin))
        session = await api.session()
        receipt = await api.call(session, "append_row", {"row": "order 1"})
        assert receipt["status"] == "queued", receipt
        await wait_for("the first hand-over", DEADLINE_SECONDS, lambda: _at_least(seen, 1))
        toolgate.kill()  # the worker is lost with its process
        toolgate.start()
        await wait_for("the second hand-over", 30.0, lambda: _at_least(seen, 2))
        assert [call.attempt for call in seen[:2]] == [1, 2]
        assert seen[0].idempotency_key == seen[1].idempotency_key == receipt["execution_id"]
        assert effects == ["order 1"]
    finally:
        await plugin.stop()


async def _at_least(items: list[Any], count: int) -> bool:
    return len(items) >= count
