"""The real toolgate binary, started for each test on its own port and data dir.

The binary is ``$TOOLGATE_BIN`` (set by the Rust test ``tests/python_sdk.rs``),
else ``target/debug/toolgate`` of this repository; without one the suite fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
ADMIN_TOKEN = "tg_sdk_test_admin_token_0123456789abcdef"
START_DEADLINE_SECONDS = 60.0


def toolgate_binary() -> Path:
    given = os.environ.get("TOOLGATE_BIN")
    binary = Path(given) if given else REPO / "target" / "debug" / "toolgate"
    if not binary.is_file():
        pytest.fail(
            f"toolgate binary not found at {binary}: build it (cargo build) or set TOOLGATE_BIN",
            pytrace=False,
        )
    return binary


class Toolgate:
    """One toolgate server process; ``kill`` and ``start`` again keep port and data."""

    def __init__(self, binary: Path, data_dir: Path, log_path: Path, args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.args = args
        """More ``serve`` flags (an operator's settings, such as a lower limit)."""
        self.listen = "127.0.0.1:0"
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLGATE_")}
        env.pop("ENABLE_UNSAFE_SCRIPT_HANDLER", None)
        env.update(TOOLGATE_ADMIN_TOKEN=ADMIN_TOKEN, RUST_LOG="info,sqlx=warn")
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "serve", "--listen", self.listen, "--data-dir", str(self.data_dir), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
            )
        address = self._read_address()
        # Later starts reuse the port, so the plugin's toolgate_url stays right.
        self.listen = address
        self.url = f"http://{address}"

    def _read_address(self) -> str:
        """Reads stdout until the listening line, within a deadline, then keeps draining it."""
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            for line in stdout:
                if not found and line.startswith("toolgate listening on http://"):
                    found.append(line.strip().removeprefix("toolgate listening on http://"))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(START_DEADLINE_SECONDS) or not found:
            raise AssertionError(f"toolgate did not start listening; see {self.log_path}")
        return found[0]

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_size_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK takes its tool size limit from ``TOOLGATE_MAX_TOOL_SCHEMA_BYTES``: one
    set where the suite runs would change every size check (toolgate itself is
    started without any ``TOOLGATE_`` variable of the suite's environment)."""
    monkeypatch.delenv("TOOLGATE_MAX_TOOL_SCHEMA_BYTES", raising=False)


@pytest.fixture
def toolgate(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Toolgate]:
    """A toolgate with its defaults; a test parametrized with ``indirect=["toolgate"]``
    gives it more ``serve`` flags."""
    args = tuple(getattr(request, "param", ()))
    server = Toolgate(toolgate_binary(), tmp_path / "data", tmp_path / "toolgate.log", args)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Api:
    """An async client of one toolgate: the platform API (with the key) and /api/tools."""

    def __init__(self, server: Toolgate) -> None:
        self.server = server
        self.http = httpx.AsyncClient(timeout=30.0, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    async def get(self, path: str) -> Any:
        response = await self.http.get(self.server.url + path)
        assert response.status_code == 200, response.text
        return response.json()

    async def post(self, path: str, body: Any) -> Any:
        response = await self.http.post(self.server.url + path, json=body)
        assert response.status_code in (200, 201), response.text
        return response.json()

    async def session(self) -> str:
        return (await self.post("/sessions", {"character": "Lanlan"}))["data"]["id"]

    async def call(self, session: str, name: str, arguments: Any) -> dict[str, Any]:
        """A tool call exactly as the session's model makes it; its result."""
        reply = await self.post(f"/sessions/{session}/tool-calls", {"name": name, "arguments": arguments})
        return reply["data"]

    async def listed(self, source: str) -> dict[str, dict[str, Any]]:
        """Registrations of ``source`` in role Lanlan, by name (none while toolgate is down)."""
        try:
            listing = await self.get("/api/tools?role=Lanlan")
        except httpx.TransportError:
            return {}
        return {t["name"]: t for t in listing["tools_by_role"]["Lanlan"] if t["source"] == source}


@pytest.fixture
async def api(toolgate: Toolgate) -> Any:
    client = Api(toolgate)
    try:
        yield client
    finally:
        await client.http.aclose()


async def wait_for(what: str, deadline_seconds: float, check: Callable[[], Awaitable[bool]]) -> None:
    """Polls ``check`` until true; fails naming ``what`` once the deadline passed."""
    deadline = time.monotonic() + deadline_seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_seconds}s waiting for {what}")
        await anyio.sleep(0.05)


async def all_listed(api: Api, plugin: Any) -> bool:
    """Whether toolgate lists every tool of ``plugin`` under its source."""
    return set(await api.listed(plugin.source)) == set(plugin.tools)


@contextlib.asynccontextmanager
async def serving(plugin: Any, api: Api, deadline_seconds: float, release: threading.Event) -> AsyncIterator[Any]:
    """``plugin`` started and every tool of it listed; on the way out ``release``
    lets blocked tool calls end, then the plugin stops."""
    await plugin.start()
    try:
        await wait_for("the plugin's tools", deadline_seconds, lambda: all_listed(api, plugin))
        yield plugin
    finally:
        release.set()
        await plugin.stop()
        release.clear()
