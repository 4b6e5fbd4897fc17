"""The plugin's side of toolgate's loopback Runtime Tools API (``/api/tools``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["RegistrationRefused", "ToolgateClient"]

# How long a cancelled registration still waits for toolgate's answer (see register()).
REGISTER_SETTLE_SECONDS = 1.0


class RegistrationRefused(Exception):
    """toolgate answered a registration with a client error (4xx): retrying the
    same request will not help until the plugin or toolgate changes.

    ``code`` and ``message`` are toolgate's (``validation_error``, ``not_found``,
    ``limit_exceeded``, ...) when its answer had them."""

    def __init__(self, tool: str, status: int, body: str) -> None:
        self.tool = tool
        self.status = status
        self.code, self.message = _error_of(body)
        super().__init__(f"toolgate refused to register {tool!r}: HTTP {status} {self.code}: {self.message}")


class ToolgateClient:
    """Calls toolgate's health check and ``/api/tools``; every request is bounded in time.

    ``redact`` is applied to toolgate's refusals before they reach an exception
    (and so the log): they may echo a callback URL, whose token is the plugin's."""

    def __init__(
        self, base_url: str, timeout_seconds: float = 5.0, redact: Callable[[str], str] = lambda text: text
    ) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_seconds)
        self._redact = redact

    async def boot_id(self) -> str | None:
        """The boot id of the running toolgate (``None`` for one too old to send it).

        Raises ``httpx.HTTPError`` when toolgate cannot be reached or fails."""
        response = await self._http.get("/healthz")
        response.raise_for_status()
        boot_id = response.json().get("boot_id")
        return boot_id if isinstance(boot_id, str) else None

    async def register(self, body: dict[str, Any]) -> dict[str, Any]:
        """Registers one tool; returns toolgate's answer.

        Raises ``RegistrationRefused`` on a 4xx and ``httpx.HTTPError`` otherwise.
        toolgate carries a registration it has received to its end even when the
        client goes away, so a cancelled caller (a stop during a start) still waits
        up to ``REGISTER_SETTLE_SECONDS`` for the answer: the clear it sends next
        must not overtake the registration and leave the tool behind."""
        request = asyncio.ensure_future(self._register(body))
        try:
            return await asyncio.shield(request)
        except asyncio.CancelledError:
            await _settle(request, REGISTER_SETTLE_SECONDS)
            raise

    async def _register(self, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._http.post("/api/tools/register", json=body)
        if 400 <= response.status_code < 500:
            raise RegistrationRefused(body["name"], response.status_code, self._redact(response.text))
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    async def holders(self) -> dict[str, dict[str, str]]:
        """Every role toolgate has now, each with the source holding each tool name.

        The listing carries every tool's schema for every role (megabytes with many
        large tools): it is parsed in a thread, off the event loop that answers calls."""
        response = await self._http.get("/api/tools")
        response.raise_for_status()
        return await asyncio.to_thread(_holders_of, response.content)

    async def clear(self, source: str, timeout_seconds: float) -> int:
        """Removes every tool of ``source`` from every role; returns how many."""
        response = await self._http.post(
            "/api/tools/clear", json={"source": source, "role": None}, timeout=timeout_seconds
        )
        response.raise_for_status()
        removed = response.json().get("removed", 0)
        return removed if isinstance(removed, int) else 0

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()


async def _settle(request: asyncio.Future[Any], seconds: float) -> None:
    """Waits up to ``seconds`` for ``request``, then drops it, whatever its outcome."""
    try:
        await asyncio.wait({request}, timeout=seconds)
    finally:
        request.cancel()
        if request.done() and not request.cancelled():
            request.exception()  # seen: asyncio would report it as never retrieved


def _holders_of(listing_json: bytes) -> dict[str, dict[str, str]]:
    listing = json.loads(listing_json)
    return {
        role: {tool["name"]: tool.get("source", "") for tool in tools}
        for role, tools in listing.get("tools_by_role", {}).items()
    }


def _error_of(body: str) -> tuple[str, str]:
    """toolgate's ``{"error": {"code", "message"}}``; the text itself (cut) otherwise."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error.get("code", "error")), error["message"][:500]
    return "error", body[:500]
