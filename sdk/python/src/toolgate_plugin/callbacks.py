"""The loopback HTTP server that toolgate calls when a model calls a tool.

It follows the callback contract of ``runtime-tools-api.txt``: toolgate posts
``{"name", "arguments", "call_id", "raw_arguments"}`` and gets back
``{"output": ..., "is_error": false}`` or ``{"error": ..., "is_error": true}``.

Each callback URL carries a random path segment, so a program cannot call the
plugin's functions by finding its port alone. The segment is no secret from the
machine's other programs: toolgate lists callback URLs to any loopback client
(``GET /api/tools``). What the server does keep out is a web page: toolgate never
sends an ``Origin`` header, a browser always does on a POST, and a page's
"simple" requests (forms, ``text/plain``) are refused as not JSON.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

import pydantic_core
from aiohttp import web

from .context import CallContext
from .tools import Tool

__all__ = ["CallbackServer", "bind_host", "check_loopback"]

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
        self._host = bind_host(host)
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
        """The callback URL of ``tool`` (the server must have opened once).

        The name is percent-encoded whole: toolgate accepts names with ``?``, ``#``,
        ``/`` or ``%``, which would otherwise end or split the path."""
        return f"http://{_url_host(self._host)}:{self._port}/{self._token}/tools/{quote(tool.name, safe='')}"

    def redact(self, text: str) -> str:
        """``text`` (toolgate's answer, which may echo a callback URL) without the token."""
        return text.replace(self._token, "<token>")

    async def open(self) -> None:
        """Starts listening (again, on the same port)."""
        if self._runner is not None:
            return
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        # Every path: the tool's name is taken from the raw path, percent-decoded
        # once, whatever the router would make of an encoded "/". Not ".*": the
        # router matches the decoded path, and "." stops at a newline (%0A), which
        # a name toolgate takes may hold.
        app.router.add_post(r"/{path:[\s\S]*}", self._handle)
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
        _log.info("callback server listening on %s:%s", _url_host(self._host), self._port)

    async def close(self) -> None:
        """Stops listening and closes every open connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        refusal = _refuse_browsers(request)
        if refusal is not None:
            return refusal
        tool = self._tool_of(request.rel_url.raw_path)
        if tool is None:
            return _answer({"error": "no such callback", "is_error": True}, status=404)
        try:
            body = pydantic_core.from_json(await request.read(), allow_inf_nan=False)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
            return _answer({"error": "the callback body is not JSON (or nests too deeply)", "is_error": True}, status=400)
        if not isinstance(body, dict):
            return _answer({"error": "the callback body is not an object", "is_error": True}, status=400)
        answer = await tool.answer(_arguments(body), _context(request, body))
        return _answer(answer)

    def _tool_of(self, raw_path: str) -> Tool | None:
        """The tool a ``/<token>/tools/<encoded name>`` path names; ``None`` for any other."""
        parts = raw_path.split("/")
        if len(parts) != 4 or parts[0] != "" or parts[2] != "tools":
            return None
        if not secrets.compare_digest(parts[1].encode(), self._token.encode()):
            return None
        try:
            name = unquote(parts[3], errors="strict")
        except UnicodeDecodeError:  # no name of ours encodes so
            return None
        return self._tools.get(name)


def bind_host(host: str) -> str:
    """The one address the server binds and the callback URLs name, for ``host``.

    ``localhost`` is ``127.0.0.1``: resolved, it is often both ``::1`` and
    ``127.0.0.1``, and with port 0 each would get a port of its own while the URLs
    name one. An IPv4-mapped address (``::ffff:127.0.0.1``) is its IPv4 address:
    an IPv6 socket cannot be bound to it."""
    check_loopback(host)
    if host.lower() == "localhost":
        return "127.0.0.1"
    address = ipaddress.ip_address(host)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return str(mapped) if mapped is not None else host


def check_loopback(host: str) -> None:
    """Refuses a host other than loopback: the callback server must not listen on
    the network, and toolgate refuses non-loopback callback URLs anyway."""
    if host.lower() == "localhost":
        return
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"host must be localhost or a loopback address (127.0.0.1, ::1), not {host!r}") from None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    if not (address.is_loopback or (mapped is not None and mapped.is_loopback)):
        raise ValueError(
            f"host {host!r} is not loopback: the callback server would take calls from the network; "
            "use 127.0.0.1, ::1 or localhost"
        )


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def _refuse_browsers(request: web.Request) -> web.Response | None:
    """A refusal for a request toolgate would never send: one with an ``Origin``
    (a web page's) or a body not declared JSON (a form's, ``text/plain``)."""
    if "Origin" in request.headers:
        return _answer({"error": "requests from web pages are refused", "is_error": True}, status=403)
    if request.content_type != "application/json":
        return _answer({"error": "the callback body must be application/json", "is_error": True}, status=415)
    return None


def _context(request: web.Request, body: dict[str, Any]) -> CallContext:
    call_id = body.get("call_id")
    attempt = request.headers.get("X-Toolgate-Attempt", "")
    return CallContext(
        call_id=call_id if isinstance(call_id, str) else None,
        idempotency_key=request.headers.get("Idempotency-Key"),
        attempt=int(attempt) if attempt.isdecimal() and len(attempt) < 10 else None,
    )


def _arguments(body: dict[str, Any]) -> Any:
    """The call's arguments: the parsed object, else ``raw_arguments`` parsed here
    (the model may have sent text that toolgate passed on as it was)."""
    arguments = body.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    raw = body.get("raw_arguments")
    if isinstance(raw, str):
        try:
            return pydantic_core.from_json(raw, allow_inf_nan=False)
        except (ValueError, RecursionError):
            return raw
    return arguments


def _answer(body: dict[str, Any], status: int = 200) -> web.Response:
    # pydantic's encoder would write inf and nan as Infinity and NaN, which are no
    # JSON; no body has them: Tool.answer answers a result holding one as an error.
    return web.Response(body=pydantic_core.to_json(body), status=status, content_type="application/json")
