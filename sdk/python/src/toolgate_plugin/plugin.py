"""``Plugin``: a named set of tools, served and kept registered with toolgate."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import httpx

from .callbacks import CallbackServer
from .client import ToolgateClient
from .registrar import Registrar, WatchTiming
from .schema import DEFAULT_SIZE_LIMIT, SchemaError, SizeLimit, check_text
from .tools import AsyncCapability, DeliveryMode, ReplaySafety, SideEffectLevel, Slot, Tool, ToolOptions

__all__ = ["Plugin"]

_log = logging.getLogger("toolgate_plugin")

F = TypeVar("F", bound=Callable[..., Any])

# stop() must let the process exit within 5 s: the clear request gets this much,
# the callback server's shutdown the rest.
CLEAR_TIMEOUT_SECONDS = 2.0
# toolgate refuses a source of more characters (src/tools/remote/mod.rs MAX_SOURCE_CHARS).
MAX_SOURCE_CHARS = 128
SOURCE_PREFIX = "plugin:"
# The variable toolgate reads its --max-tool-schema-bytes from: a plugin started in
# toolgate's environment checks its tools against the limit toolgate applies.
MAX_TOOL_SCHEMA_BYTES_ENV = "TOOLGATE_MAX_TOOL_SCHEMA_BYTES"
# What toolgate's flag parser (Rust's usize) takes: ASCII digits, an optional plus sign.
_RUST_UNSIGNED = re.compile(r"\+?[0-9]+")


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
        max_tool_schema_bytes: int | None = None,
    ) -> None:
        """Raises ``ValueError`` for a name toolgate would refuse in ``source`` (empty,
        too long, NUL), for a ``host`` that is not loopback (``0.0.0.0`` would
        take calls from the network) and for a size limit that is no positive integer.

        ``max_tool_schema_bytes`` is toolgate's ``--max-tool-schema-bytes``, which
        each tool is checked against when declared; ``None`` takes it from
        ``TOOLGATE_MAX_TOOL_SCHEMA_BYTES`` as toolgate does, else toolgate's default
        (256 KiB)."""
        _check_name(name)
        self._size_limit = _size_limit(max_tool_schema_bytes)
        self.name = name
        self.source = f"{SOURCE_PREFIX}{name}"
        self.toolgate_url = toolgate_url
        self._tools: dict[str, Tool] = {}
        self._callbacks = CallbackServer(self._tools, host, port)
        self._timing = timing or WatchTiming()
        self._client: ToolgateClient | None = None
        self._registrar: Registrar | None = None
        self._starting: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def max_tool_schema_bytes(self) -> int:
        """The size limit the plugin's tools are checked against (see ``__init__``)."""
        return self._size_limit.bytes

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
        replay_safety: ReplaySafety | None = None,
    ) -> Callable[[F], F]:
        """Makes a sync or async function a tool: ``@plugin.tool()`` or ``@plugin.tool(...)``.

        Name from the function (or ``name``), description from its docstring (or
        ``description``), parameters from its type hints (a ``CallContext``
        parameter excepted). Raises ``SchemaError`` for a function that cannot be
        described, ``ValueError`` for a second tool of the same name. The function
        itself is returned unchanged.
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
            replay_safety=replay_safety,
        )

        def add(fn: F) -> F:
            tool = Tool.from_function(fn, settings, size_limit=self._size_limit)
            if tool.name in self._tools:
                raise ValueError(f"plugin {self.name} already has a tool named {tool.name!r}")
            if self._registrar is not None or self._starting is not None:
                raise RuntimeError("add tools before the plugin starts")
            self._tools[tool.name] = tool
            return fn

        return add

    async def start(self) -> None:
        """Opens the callback server, registers every tool and starts watching.

        toolgate need not be up: a failed first registration is logged and retried.
        A ``stop()`` (or, under ``run()``, a signal) while this runs wins: the start
        is abandoned and this returns with the plugin stopped. Cancelling the
        caller abandons the start too."""
        if self._watcher is not None:
            return
        if self._starting is None:
            self._starting = asyncio.create_task(self._start(), name=f"toolgate-plugin-{self.name}-start")
        starting = self._starting
        try:
            await asyncio.wait({starting})
        except asyncio.CancelledError:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)  # it closes what it opened
            raise
        finally:
            if self._starting is starting and starting.done():
                self._starting = None
        if not starting.cancelled():
            starting.result()  # a failure of the start itself (the port taken, say)

    async def _start(self) -> None:
        """The steps of ``start()``, in a task of their own so that ``stop()`` can
        cancel them; whatever they opened is closed again if they do not finish."""
        try:
            await self._callbacks.open()
            self._client = ToolgateClient(self.toolgate_url, redact=self._callbacks.redact)
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
            except Exception as exc:  # toolgate unreachable or failing: the watcher retries
                # Not a warning: the watcher's first poll, at once, logs the outage's one.
                _log.debug("first registration failed (%s: %s); will retry", type(exc).__name__, exc)
            self._watcher = asyncio.create_task(self._registrar.watch(), name=f"toolgate-plugin-{self.name}")
        except BaseException:
            await self._shut_down()
            raise

    @property
    def registered(self) -> bool:
        """Whether every tool is registered in every role it belongs in, as far as
        the plugin last saw (``False`` while toolgate has no character at all, or a
        tool is refused or held by another source)."""
        return self._registrar is not None and self._registrar.registered

    @property
    def callback_port(self) -> int:
        """The port the callback server listens on (once started)."""
        return self._callbacks.port

    async def stop(self) -> None:
        """Stops watching, clears the plugin's tools from toolgate and closes the server.

        Bounded: it returns within a few seconds even when toolgate is gone or hung,
        and also while ``start()`` is still running, which it ends."""
        starting, self._starting = self._starting, None
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await self._shut_down()

    async def _shut_down(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        client, self._client = self._client, None
        self._registrar = None
        try:
            if client is not None:
                await self._clear(client)
        finally:
            await self._callbacks.close()

    async def _clear(self, client: ToolgateClient) -> None:
        try:
            removed = await client.clear(self.source, CLEAR_TIMEOUT_SECONDS)
            _log.info("cleared %d registrations of %s", removed, self.source)
        except (httpx.HTTPError, ValueError) as exc:
            _log.warning("could not clear %s from toolgate: %s: %s", self.source, type(exc).__name__, exc)
        finally:
            await client.close()

    def run(self) -> None:
        """Serves until SIGINT or SIGTERM, then stops (tools cleared) and returns.

        A signal during the start (toolgate slow or hung) ends the start at once."""
        asyncio.run(self._serve_until_signalled())

    async def _serve_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def signalled() -> None:
            # Said here: a start it cancels clears the tools before this returns.
            _log.info("signalled; stopping")
            stopping.set()
            if self._starting is not None:
                self._starting.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, signalled)
        try:
            if not stopping.is_set():
                await self.start()
            await stopping.wait()
        finally:
            await self.stop()


def _size_limit(argument: int | None) -> SizeLimit:
    """The size limit from the argument, else the environment, else toolgate's default.

    A value that is no positive integer is refused here, naming where it came from,
    rather than turned into a limit no tool fits or quietly ignored."""
    if argument is not None:
        if isinstance(argument, bool) or not isinstance(argument, int) or argument < 1:
            raise ValueError(f"Plugin(max_tool_schema_bytes=...) must be a positive integer (bytes), not {argument!r}")
        return SizeLimit(argument, "set by Plugin(max_tool_schema_bytes=...)")
    raw = os.environ.get(MAX_TOOL_SCHEMA_BYTES_ENV)
    if raw is None:
        return DEFAULT_SIZE_LIMIT
    if not _RUST_UNSIGNED.fullmatch(raw) or int(raw) < 1:
        raise ValueError(
            f"the environment variable {MAX_TOOL_SCHEMA_BYTES_ENV} must be a positive integer (bytes), not {raw!r}"
        )
    return SizeLimit(int(raw), f"set by the environment variable {MAX_TOOL_SCHEMA_BYTES_ENV}")


def _check_name(name: str) -> None:
    """Refuses a name whose ``source`` toolgate would refuse at every registration."""
    if not name:
        raise ValueError("a plugin needs a name")
    longest = MAX_SOURCE_CHARS - len(SOURCE_PREFIX)
    if len(name) > longest:
        raise ValueError(f"a plugin name may have at most {longest} characters (source limit), not {len(name)}")
    try:
        check_text(name, "a plugin name")
    except SchemaError as exc:
        raise ValueError(str(exc)) from None
