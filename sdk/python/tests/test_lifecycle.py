"""Starting and stopping against the real toolgate: stop and signals win over a
slow start, and the callback server listens on loopback only."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from conftest import Api, Toolgate, wait_for
from toolgate_plugin import Plugin

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 10.0
# stop() and signals: the process is gone within 5 s, toolgate hung or not.
EXIT_DEADLINE_SECONDS = 5.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "weather.py"


@contextmanager
def hung(toolgate: Toolgate) -> Iterator[None]:
    """toolgate stopped (SIGSTOP): connections are taken, nothing is answered."""
    assert toolgate.process is not None
    os.kill(toolgate.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(toolgate.process.pid, signal.SIGCONT)


async def test_sigterm_during_a_hung_start_exits_promptly(toolgate: Toolgate) -> None:
    env = {**os.environ, "TOOLGATE_URL": toolgate.url}
    with hung(toolgate):
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE)], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            assert process.stderr is not None
            # The start has begun (its server is open) and waits for toolgate.
            line = ""
            while "callback server listening" not in line:
                line = await asyncio.wait_for(asyncio.to_thread(process.stderr.readline), DEADLINE_SECONDS)
                assert line, "the example ended before it started"
            await asyncio.sleep(0.5)
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(process.wait, EXIT_DEADLINE_SECONDS)
            assert code == 0
            assert time.monotonic() - began < EXIT_DEADLINE_SECONDS
            # Said as it happens: before the stopping start's clear, not after it.
            said = process.stderr.read()
            assert said.index("signalled; stopping") < said.index("could not clear"), said
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


async def test_stop_during_a_hung_start_wins(toolgate: Toolgate) -> None:
    plugin = Plugin("racing", toolgate_url=toolgate.url)
    plugin.tool(name="r")(lambda: 1)
    with hung(toolgate):
        starting = asyncio.create_task(plugin.start())
        await wait_for("the start to open its server", DEADLINE_SECONDS, lambda: _is(plugin._callbacks.serving))
        began = time.monotonic()
        await plugin.stop()
        assert time.monotonic() - began < EXIT_DEADLINE_SECONDS
        await asyncio.wait_for(starting, EXIT_DEADLINE_SECONDS)  # returns, raises nothing
        await asyncio.sleep(0.5)
        assert plugin._watcher is None
        assert not plugin._callbacks.serving
        assert not plugin.registered


def heavy(
    a: Annotated[str, Field(description="x" * 30_000)] = "",
    b: Annotated[str, Field(description="y" * 30_000)] = "",
) -> None:
    """A schema toolgate takes some milliseconds to check: a stop may come in the middle."""


async def test_stop_right_after_start_leaves_nothing_running(toolgate: Toolgate, api: Api) -> None:
    plugin = Plugin("quick", toolgate_url=toolgate.url)
    for name in ("q1", "q2", "q3"):
        plugin.tool(name=name)(heavy)
    for step in range(20):  # stops at every stage of the start: 0 to 95 ms in
        starting = asyncio.create_task(plugin.start())
        await asyncio.sleep(step * 0.005)
        await plugin.stop()
        await starting
        await asyncio.sleep(0.1)
        assert plugin._watcher is None, step
        assert not plugin._callbacks.serving, step
        # Not even a registration the stop cut off on its way.
        assert await api.listed(plugin.source) == {}, step
    # And it can still start for real afterwards.
    await plugin.start()
    try:
        await wait_for("the tools", DEADLINE_SECONDS, lambda: _listed(api, plugin))
    finally:
        await plugin.stop()


async def test_an_ipv6_loopback_host_gets_a_bracketed_url(toolgate: Toolgate, api: Api) -> None:
    plugin = Plugin("six", toolgate_url=toolgate.url, host="::1")
    plugin.tool(name="over_six")(lambda: "via ::1")
    await plugin.start()
    try:
        await wait_for("the tool", DEADLINE_SECONDS, lambda: _listed(api, plugin))
        url = (await api.listed(plugin.source))["over_six"]["callback_url"]
        assert url.startswith(f"http://[::1]:{plugin.callback_port}/")
        session = await api.session()
        assert (await api.call(session, "over_six", {}))["output"] == "via ::1"
    finally:
        await plugin.stop()


@pytest.mark.parametrize("host", ["localhost", "LocalHost", "::ffff:127.0.0.1"])
async def test_other_spellings_of_loopback_bind_one_address_the_url_names(
    toolgate: Toolgate, api: Api, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve = socket.getaddrinfo

    def both_families(name: Any, *args: Any, **kwargs: Any) -> Any:
        """localhost as many systems resolve it: ::1 and 127.0.0.1."""
        if str(name).lower() == "localhost":
            return resolve("::1", *args, **kwargs) + resolve("127.0.0.1", *args, **kwargs)
        return resolve(name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", both_families)
    plugin = Plugin("spelled", toolgate_url=toolgate.url, host=host)
    plugin.tool(name="spelled")(lambda: "reached")
    await plugin.start()
    try:
        assert plugin._callbacks._runner is not None
        assert plugin._callbacks._runner.addresses == [("127.0.0.1", plugin.callback_port)]
        await wait_for("the tool", DEADLINE_SECONDS, lambda: _listed(api, plugin))
        url = (await api.listed(plugin.source))["spelled"]["callback_url"]
        assert url.startswith(f"http://127.0.0.1:{plugin.callback_port}/")
        session = await api.session()
        assert (await api.call(session, "spelled", {}))["output"] == "reached"
    finally:
        await plugin.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com", ""])
def test_a_host_that_is_not_loopback_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        Plugin("open", host=host)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", "::ffff:127.0.0.1"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    Plugin("closed", host=host)


async def _listed(api: Api, plugin: Plugin) -> bool:
    return set(await api.listed(plugin.source)) == set(plugin.tools)


async def _is(value: bool) -> bool:
    return value
