"""Calls against the real toolgate: what a tool raises or returns, names in URLs,
browser requests, delivery facts, strict arguments, a full thread pool, deliveries
of one idempotency key that overlap."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import httpx
import pydantic
import pytest

from conftest import Api, Toolgate, all_listed, serving, wait_for
from toolgate_plugin import CallContext, Plugin

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 10.0
NAMES = ["q?x", "h#x", "s/x", "pct%41", "a b", "ünï", "<lambda>", "get.weather", "new\nline", "cr\rtab\t"]
CITIES = {"sh": "Shanghai"}

contexts: list[CallContext] = []
release = threading.Event()


class Crate(pydantic.BaseModel):
    count: int


class Box(pydantic.BaseModel):
    kind: Literal["box"] = "box"
    size: int


class Bag(pydantic.BaseModel):
    kind: Literal["bag"] = "bag"
    size: float


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


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

    @plugin.tool()
    def integers(
        n: int, more: list[int] | None = None, maybe: int | None = None, crate: Crate | None = None
    ) -> dict[str, Any]:
        values = [n, *(more or []), maybe, crate.count if crate else None]
        return {"values": values, "types": [type(value).__name__ for value in values]}

    @plugin.tool(timeout_seconds=10)
    def blocking(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @plugin.tool(timeout_seconds=1)
    def held() -> str:
        release.wait(30)
        return "released"

    @plugin.tool()
    def ratio(a: float, b: float) -> float:
        return a / b if b else math.inf

    @plugin.tool()
    def stats() -> dict[str, Any]:
        return {"n": 0, "mean": math.nan}

    @plugin.tool()
    def number(v: float) -> float:
        return v

    @plugin.tool(timeout_seconds=10)
    def first_match(prefix: str) -> str:
        return next(name for name in ["alice", "bob"] if name.startswith(prefix))

    @plugin.tool()
    async def cancels_its_own_task() -> str:
        task = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        await task
        return "never"

    @plugin.tool()
    def raises_cancelled() -> str:
        raise asyncio.CancelledError("from a thread")

    @plugin.tool()
    def unprintable() -> str:
        raise Unprintable()

    @plugin.tool()
    def city(code: Annotated[str, pydantic.AfterValidator(lambda code: CITIES[code])]) -> str:
        return code

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


async def test_an_integral_float_for_an_int_is_taken_as_the_schema_takes_it(plugin: Plugin, api: Api) -> None:
    # JSON Schema (toolgate's check) reads 7.0 as an integer: the call reaches the
    # function, with ints, also inside a list, an Optional and a nested model.
    session = await api.session()
    result = await api.call(session, "integers", {"n": 7.0, "more": [1.0, 2], "maybe": -3.0, "crate": {"count": 4.0}})
    assert result["is_error"] is False, result
    assert result["output"] == {"values": [7, 1, 2, -3, 4], "types": ["int"] * 5}
    assert all(type(value) is int for value in result["output"]["values"])
    # A float parameter keeps its float.
    result = await api.call(session, "number", {"v": 7.0})
    assert result["output"] == 7.0 and type(result["output"]) is float, result

    # What the schema does not take as an integer stays refused (toolgate refuses
    # these itself, so they are sent to the callback directly).
    url = await callback_url(api, plugin, "integers")
    async with httpx.AsyncClient() as client:
        for n in [7.5, True, "7", [7.0]]:
            answer = (await client.post(url, json={"arguments": {"n": n}})).json()
            assert answer["is_error"] is True, (n, answer)
            assert answer["error"].startswith("invalid arguments: n: "), (n, answer)


async def test_integral_floats_become_ints_only_where_the_schema_wants_an_integer() -> None:
    plugin = Plugin("integers")

    @plugin.tool()
    def kinds(
        exact: int = 0,
        either: int | float = 0,
        anything: Any = None,
        table: dict[str, int] | None = None,
        pair: tuple[int, float] = (0, 0.0),
        item: Annotated[Box | Bag, pydantic.Field(discriminator="kind")] = Box(size=0),
    ) -> dict[str, Any]:
        table_kinds = [type(value).__name__ for value in (table or {}).values()]
        return {
            "exact": type(exact).__name__,
            "either": type(either).__name__,
            "anything": type(anything).__name__,
            "table": table_kinds,
            "pair": [type(value).__name__ for value in pair],
            "item": type(item.size).__name__,
        }

    tool = plugin.tools["kinds"]
    wholes = {"exact": 1e300, "either": 7.0, "anything": 7.0, "table": {"a": 7.0}, "pair": [7.0, 7.0]}
    answer = await tool.answer({**wholes, "item": {"kind": "box", "size": 7.0}})
    assert answer["output"] == {
        "exact": "int",
        "either": "float",  # pydantic takes 7.0 as the float, as it is
        "anything": "float",
        "table": ["int"],
        "pair": ["int", "float"],
        "item": "int",
    }, answer
    answer = await tool.answer({"item": {"kind": "bag", "size": 7.0}})
    assert answer["output"]["item"] == "float", answer
    for exact in [7.5, -0.5, True]:
        answer = await tool.answer({"exact": exact})
        assert answer["is_error"] is True and answer["error"].startswith("invalid arguments: exact: "), answer


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


async def test_results_and_arguments_json_cannot_hold_are_tool_errors(plugin: Plugin, api: Api) -> None:
    session = await api.session()
    result = await api.call(session, "ratio", {"a": 1, "b": 0})
    assert result["is_error"] is True, result
    assert result["output"] == "ratio returned inf, a number JSON cannot hold (it has no inf or nan)"
    result = await api.call(session, "stats", {})
    assert result["is_error"] is True, result
    assert result["output"].startswith("stats returned nan at mean, ")

    url = await callback_url(api, plugin, "number")
    async with httpx.AsyncClient() as client:
        json_type = {"content-type": "application/json"}
        huge = await client.post(url, content=b'{"arguments": {"v": 1e400}}', headers=json_type)
        fine = await client.post(url, json={"arguments": {"v": 1e300}})
    assert huge.status_code == 200
    assert huge.json()["is_error"] is True
    assert huge.json()["error"].startswith("invalid arguments: v: inf is no JSON number")
    assert fine.json() == {"output": 1e300, "is_error": False}


async def test_a_stop_iteration_is_answered_at_once(
    plugin: Plugin, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    session = await api.session()
    began = time.monotonic()
    result = await api.call(session, "first_match", {"prefix": "zed"})
    assert time.monotonic() - began < 5, "it waited for its timeout"
    assert result["is_error"] is True and result["output"] == "StopIteration", result
    (logged,) = [record for record in caplog.records if "first_match" in record.getMessage()]
    assert logged.exc_info is not None and logged.exc_info[0] is StopIteration


async def test_a_tools_own_cancellation_and_unprintable_exceptions_are_answered(api: Api, plugin: Plugin) -> None:
    session = await api.session()
    for name, message in [
        ("cancels_its_own_task", "CancelledError"),
        ("raises_cancelled", "CancelledError: from a thread"),
        ("unprintable", "Unprintable: (its message could not be read)"),
    ]:
        result = await api.call(session, name, {})
        assert result["execution_reason_code"] == "remote_tool_error", (name, result)
        assert result["output"] == message, (name, result)
    result = await api.call(session, "typed", {"n": 2})
    assert result["output"] == {"n": 2, "flag": False}, result


async def test_a_validator_raising_another_error_is_answered_without_data_in_the_log(
    plugin: Plugin, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    session = await api.session()
    assert (await api.call(session, "city", {"code": "sh"}))["output"] == "Shanghai"
    result = await api.call(session, "city", {"code": "private-code-17"})
    assert result["execution_reason_code"] == "remote_tool_error", result
    assert result["output"] == "invalid arguments: checking them raised KeyError: 'private-code-17'"
    logged = [record for record in caplog.records if record.name in ("toolgate_plugin", "aiohttp.server")]
    assert any("raised KeyError" in record.getMessage() for record in logged)
    assert all("private-code-17" not in record.getMessage() and not record.exc_info for record in logged)


async def test_deliveries_of_one_key_that_overlap_run_the_function_once() -> None:
    runs: list[str] = []
    gate = asyncio.Event()
    plugin = Plugin("overlap")

    @plugin.tool()
    async def append_row(row: str, call: CallContext) -> str:
        runs.append(row)
        await gate.wait()
        return f"appended {row} at attempt {call.attempt}"

    tool = plugin.tools["append_row"]
    first = asyncio.create_task(tool.answer({"row": "r"}, CallContext(idempotency_key="texec_1", attempt=1)))
    await asyncio.sleep(0.05)
    again = asyncio.create_task(tool.answer({"row": "r"}, CallContext(idempotency_key="texec_1", attempt=2)))
    # The same key with other arguments is no hand-over of that call: it runs on its own.
    other = asyncio.create_task(tool.answer({"row": "x"}, CallContext(idempotency_key="texec_1", attempt=2)))
    await asyncio.sleep(0.05)
    gate.set()
    answers = await asyncio.gather(first, again, other)
    assert runs == ["r", "x"]
    assert answers[0] == answers[1] == {"output": "appended r at attempt 1", "is_error": False}
    assert answers[2] == {"output": "appended x at attempt 2", "is_error": False}
    # Once the first has ended, a delivery reaches the function again (it remembers its keys).
    assert await tool.answer({"row": "r"}, CallContext(idempotency_key="texec_1", attempt=3))
    assert runs == ["r", "x", "r"] and tool._running == {}


async def test_a_job_handed_over_after_its_delivery_ended_comes_with_the_same_key(
    toolgate: Toolgate, api: Api
) -> None:
    seen: list[CallContext] = []
    effects: list[str] = []
    lost = asyncio.Event()
    plugin = Plugin("jobs", toolgate_url=toolgate.url)
    readme_example(plugin, effects, seen, lost)

    await plugin.start()
    try:
        receipt = await _first_hand_over(api, plugin, seen, "order 1")
        assert receipt["status"] == "queued", receipt
        toolgate.kill()  # the worker is lost with its process
        lost.set()  # the first delivery ends, its answer lost
        running = plugin.tools["append_row"]._running
        await wait_for("the first delivery's end", DEADLINE_SECONDS, lambda: _is(not running))
        toolgate.start()
        await wait_for("the second hand-over", 30.0, lambda: _at_least(seen, 2))
        assert [call.attempt for call in seen[:2]] == [1, 2]
        assert seen[0].idempotency_key == seen[1].idempotency_key == receipt["execution_id"]
        assert effects == ["order 1"]
    finally:
        await plugin.stop()


async def test_a_hand_over_while_the_first_delivery_runs_gets_its_answer(
    toolgate: Toolgate, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolgate_plugin")
    seen: list[CallContext] = []
    effects: list[str] = []
    finish = asyncio.Event()
    plugin = Plugin("joins", toolgate_url=toolgate.url)
    readme_example(plugin, effects, seen, finish)

    await plugin.start()
    try:
        receipt = await _first_hand_over(api, plugin, seen, "order 2")
        toolgate.kill()  # while the first delivery still runs
        toolgate.start()
        key = receipt["execution_id"]
        joined = f"attempt 2 of {key} came while an earlier delivery still runs"
        await wait_for("the second hand-over", 30.0, lambda: _is(any(joined in r.getMessage() for r in caplog.records)))
        finish.set()

        async def succeeded() -> bool:
            execution = (await api.get(f"/tool-executions/{key}"))["data"]
            return bool(execution["status"] == "success" and execution["result"] == "appended")

        await wait_for("the job's result", DEADLINE_SECONDS, succeeded)
        assert [call.attempt for call in seen] == [1]
        assert effects == ["order 2"]
    finally:
        await plugin.stop()


async def _first_hand_over(api: Api, plugin: Plugin, seen: list[CallContext], row: str) -> dict[str, Any]:
    """Calls the started plugin's ``append_row`` as a job; answers the receipt once
    toolgate handed the job to the plugin."""
    await wait_for("the job tool", DEADLINE_SECONDS, lambda: all_listed(api, plugin))
    session = await api.session()
    receipt = await api.call(session, "append_row", {"row": row})
    await wait_for("the first hand-over", DEADLINE_SECONDS, lambda: _at_least(seen, 1))
    return receipt


def readme_example(plugin: Plugin, sheet: list[str], seen: list[CallContext], done: asyncio.Event) -> None:
    """The README's idempotent tool, which waits for ``done`` before it answers."""
    applied: set[str] = set()
    lock = threading.Lock()

    @plugin.tool(side_effect_level="sandbox", async_capability="deferred_ok", default_delivery_mode="async_job")
    async def append_row(row: str, call: CallContext) -> str:
        """Append a row to the sheet."""
        seen.append(call)
        key = call.idempotency_key
        with lock:  # the check and the effect in one step
            if key is None or key not in applied:
                sheet.append(row)
                if key is not None:
                    applied.add(key)
        await done.wait()
        return "appended"


async def _at_least(items: list[Any], count: int) -> bool:
    return len(items) >= count


async def _is(value: bool) -> bool:
    return value
