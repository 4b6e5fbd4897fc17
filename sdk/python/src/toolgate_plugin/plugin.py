"""``Plugin``: a named set of tools, served and kept registered with toolgate."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import httpx

from .callbacks import CallbackServer
from .client import ToolgateClient
from .registrar import Registrar, WatchTiming
from .tools import AsyncCapability, DeliveryMode, SideEffectLevel, Slot, Tool, ToolOptions

__all__ = ["Plugin"]

_log = logging.getLogger("toolgate_plugin")

F = TypeVar("F", bound=Callable[..., Any])

# stop() must let the process exit within 5 s: the clear request gets this much,
# the callback server's shutdown the rest.
CLEAR_TIMEOUT_SECONDS = 2.0


class Plugin:
    """A plugin of toolgate: its tools are registered with ``source: "plugin:<name>"``.

    ``plugin.run()`` serves until SIGINT or SIGTERM; inside an asyncio program use
    ``await plugin.start()`` and ``await plugin.stop()``. Between the two, the
    tools stay registered across toolgate restarts and evictions.
    """

    def __init__(
        self,
        name: str,
        toolgate_url: str = "http://127.0.0.1:8700",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timing: WatchTiming | None = None,
    ) -> None:
        if not name:
            raise ValueError("a plugin needs a name")
        self.name = name
        self.source = f"plugin:{name}"
        self.toolgate_url = toolgate_url
        self._tools: dict[str, Tool] = {}
        self._callbacks = CallbackServer(self._tools, host, port)
        self._timing = timing or WatchTiming()
        self._client: ToolgateClient | None = None
        self._registrar: Registrar | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def tools(self) -> dict[str, Tool]:
        """The plugin's tools by name (a copy)."""
        return dict(self._tools)

    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        role: str | None = None,
        timeout_seconds: float = 30.0,
        side_effect_level: SideEffectLevel | None = None,
        allowed_slots: Iterable[Slot] | None = None,
        async_capability: AsyncCapability | None = None,
        default_delivery_mode: DeliveryMode | None = None,
    ) -> Callable[[F], F]:
        """Makes a sync or async function a tool: ``@plugin.tool()`` or ``@plugin.tool(...)``.

        Name from the function (or ``name``), description from its docstring (or
        ``description``), parameters from its type hints. Raises ``SchemaError``
        for a function that cannot be described, ``ValueError`` for a second tool
        of the same name. The function itself is returned unchanged.
        """
        settings = ToolOptions(
            name=name,
            description=description,
            role=role,
            timeout_seconds=timeout_seconds,
            side_effect_level=side_effect_level,
            allowed_slots=tuple(allowed_slots) if allowed_slots is not None else None,
            async_capability=async_capability,
            default_delivery_mode=default_delivery_mode,
        )

        def add(fn: F) -> F:
            tool = Tool.from_function(fn, settings)
            if tool.name in self._tools:
                raise ValueError(f"plugin {self.name} already has a tool named {tool.name!r}")
            if self._registrar is not None:
                raise RuntimeError("add tools before the plugin starts")
            self._tools[tool.name] = tool
            return fn

        return add

    async def start(self) -> None:
        """Opens the callback server, registers every tool and starts watching.

        toolgate need not be up: a failed first registration is logged and retried."""
        if self._watcher is not None:
            return
        await self._callbacks.open()
        self._client = ToolgateClient(self.toolgate_url)
        self._registrar = Registrar(
            self._client,
            self._tools,
            self.source,
            self._callbacks.url_for,
            lambda: self._callbacks.serving,
            self._timing,
        )
        try:
            await self._registrar.register_all()
        except Exception as exc:  # httpx errors, refusals: the watcher retries
            _log.warning("first registration failed (%s: %s); will retry", type(exc).__name__, exc)
        self._watcher = asyncio.create_task(self._registrar.watch(), name=f"toolgate-plugin-{self.name}")

    @property
    def registered(self) -> bool:
        """Whether every tool is registered, as far as the plugin last saw."""
        return self._registrar is not None and self._registrar.registered

    @property
    def callback_port(self) -> int:
        """The port the callback server listens on (once started)."""
        return self._callbacks.port

    async def stop(self) -> None:
        """Stops watching, clears the plugin's tools from toolgate and closes the server.

        Bounded: it returns within a few seconds even when toolgate is gone."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        client, self._client = self._client, None
        self._registrar = None
        if client is not None:
            try:
                removed = await client.clear(self.source, CLEAR_TIMEOUT_SECONDS)
                _log.info("cleared %d registrations of %s", removed, self.source)
            except (httpx.HTTPError, ValueError) as exc:
                _log.warning("could not clear %s from toolgate: %s: %s", self.source, type(exc).__name__, exc)
            await client.close()
        await self._callbacks.close()

    def run(self) -> None:
        """Serves until SIGINT or SIGTERM, then stops (tools cleared) and returns."""
        asyncio.run(self._serve_until_signalled())

    async def _serve_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        try:
            await self.start()
            await stopping.wait()
            _log.info("signalled; stopping")
        finally:
            await self.stop()
