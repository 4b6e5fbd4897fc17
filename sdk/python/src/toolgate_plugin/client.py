"""The plugin's side of toolgate's loopback Runtime Tools API (``/api/tools``)."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["RegistrationRefused", "ToolgateClient"]


class RegistrationRefused(Exception):
    """toolgate answered a registration with a client error (4xx): retrying the
    same request will not help until the plugin or toolgate changes."""

    def __init__(self, tool: str, status: int, body: str) -> None:
        super().__init__(f"toolgate refused to register {tool!r}: HTTP {status}: {body[:500]}")
        self.tool = tool
        self.status = status


class ToolgateClient:
    """Calls toolgate's health check and ``/api/tools``; every request is bounded in time."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_seconds)

    async def boot_id(self) -> str | None:
        """The boot id of the running toolgate (``None`` for one too old to send it).

        Raises ``httpx.HTTPError`` when toolgate cannot be reached or fails."""
        response = await self._http.get("/healthz")
        response.raise_for_status()
        boot_id = response.json().get("boot_id")
        return boot_id if isinstance(boot_id, str) else None

    async def register(self, body: dict[str, Any]) -> dict[str, Any]:
        """Registers one tool; returns toolgate's answer.

        Raises ``RegistrationRefused`` on a 4xx and ``httpx.HTTPError`` otherwise."""
        response = await self._http.post("/api/tools/register", json=body)
        if 400 <= response.status_code < 500:
            raise RegistrationRefused(body["name"], response.status_code, response.text)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    async def registered_names(self, source: str) -> tuple[str | None, set[str]]:
        """The boot id and the names registered with ``source`` in any role."""
        response = await self._http.get("/api/tools")
        response.raise_for_status()
        listing = response.json()
        names = {
            tool["name"]
            for tools in listing.get("tools_by_role", {}).values()
            for tool in tools
            if tool.get("source") == source
        }
        return listing.get("boot_id"), names

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
