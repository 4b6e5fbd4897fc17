"""The loopback HTTP server that toolgate calls when a model calls a tool.

It follows the callback contract of ``runtime-tools-api.txt``: toolgate posts
``{"name", "arguments", "call_id", "raw_arguments"}`` and gets back
``{"output": ..., "is_error": false}`` or ``{"error": ..., "is_error": true}``.
Each callback URL carries a random path segment, so another local program or a
web page cannot call the plugin's functions by guessing the port alone.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import pydantic_core
from aiohttp import web

from .tools import Tool

__all__ = ["CallbackServer"]

_log = logging.getLogger("toolgate_plugin")

# A callback body is the model's arguments; toolgate bounds its own bodies to 1 MiB by default.
MAX_BODY_BYTES = 4 * 1024 * 1024


class CallbackServer:
    """Serves the tools' callbacks on ``host``, on one port for the plugin's life.

    The port is chosen when the server first opens (0: an ephemeral one) and kept
    when it opens again, so the registered callback URLs stay valid.
    """

    def __init__(self, tools: Mapping[str, Tool], host: str, port: int) -> None:
        self._tools = tools
        self._host = host
        self._port = port
        self._token = secrets.token_urlsafe(18)
        self._runner: web.AppRunner | None = None

    @property
    def serving(self) -> bool:
        """Whether the server is listening (and so may be registered)."""
        return self._runner is not None

    @property
    def port(self) -> int:
        """The listening port (0 until the server first opened)."""
        return self._port

    def url_for(self, tool: Tool) -> str:
        """The callback URL of ``tool`` (the server must have opened once)."""
        return f"http://{self._host}:{self._port}/{self._token}/tools/{tool.name}"

    async def open(self) -> None:
        """Starts listening (again, on the same port)."""
        if self._runner is not None:
            return
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/{token}/tools/{name}", self._handle)
        # A short shutdown timeout: stop() must finish within seconds even while
        # a callback still runs.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound = runner.addresses[0]
        self._port = bound[1]
        self._runner = runner
        _log.info("callback server listening on %s:%s", self._host, self._port)

    async def close(self) -> None:
        """Stops listening and closes every open connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not secrets.compare_digest(request.match_info["token"], self._token):
            return _answer({"error": "no such callback", "is_error": True}, status=404)
        tool = self._tools.get(request.match_info["name"])
        if tool is None:
            return _answer({"error": "this plugin has no such tool", "is_error": True}, status=404)
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _answer({"error": "the callback body is not JSON", "is_error": True}, status=400)
        if not isinstance(body, dict):
            return _answer({"error": "the callback body is not an object", "is_error": True}, status=400)
        answer = await tool.answer(_arguments(body), body.get("call_id"))
        return _answer(answer)


def _arguments(body: dict[str, Any]) -> Any:
    """The call's arguments: the parsed object, else ``raw_arguments`` parsed here
    (the model may have sent text that toolgate passed on as it was)."""
    arguments = body.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    raw = body.get("raw_arguments")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return arguments


def _answer(body: dict[str, Any], status: int = 200) -> web.Response:
    # pydantic's encoder writes NaN and infinities as null: the body stays JSON.
    return web.Response(body=pydantic_core.to_json(body), status=status, content_type="application/json")
