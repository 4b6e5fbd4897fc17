"""Keeping a plugin's tools registered while toolgate restarts and evicts.

Registrations are runtime state in toolgate: a restart drops them, and three
refused connections to the plugin's callback origin evict them. The watcher
polls ``/healthz`` (cheap) for the boot id, which changes at every start of
toolgate, and every few polls reads ``/api/tools`` to see whether its tools are
still there. Either way it registers everything again. Failures are logged and
backed off, never raised: a plugin outlives any number of toolgate restarts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from .client import RegistrationRefused, ToolgateClient
from .tools import Tool

__all__ = ["Registrar", "WatchTiming"]

_log = logging.getLogger("toolgate_plugin")


@dataclass(frozen=True)
class WatchTiming:
    """How often the watcher looks, and how it backs off.

    With the defaults a restart is noticed within about 2 s of toolgate being
    back and an eviction within about 3 s, well inside the promised 10 s.
    """

    poll_seconds: float = 1.0
    listing_every_polls: int = 3
    backoff_first_seconds: float = 0.25
    backoff_max_seconds: float = 2.0


class Registrar:
    """Registers a plugin's tools and keeps them registered."""

    def __init__(
        self,
        client: ToolgateClient,
        tools: Mapping[str, Tool],
        source: str,
        callback_url: Callable[[Tool], str],
        can_answer: Callable[[], bool],
        timing: WatchTiming,
    ) -> None:
        self._client = client
        self._tools = tools
        self._source = source
        self._callback_url = callback_url
        self._can_answer = can_answer
        self._timing = timing
        self._boot_id: str | None = None
        self._registered = False

    @property
    def registered(self) -> bool:
        """Whether the last registration round went through for every tool."""
        return self._registered

    async def register_all(self) -> None:
        """Registers every tool with the boot id toolgate has now.

        Raises ``httpx.HTTPError`` or ``RegistrationRefused``; the watcher catches them."""
        self._registered = False
        boot_id = await self._client.boot_id()
        for tool in self._tools.values():
            answer = await self._client.register(tool.registration(self._callback_url(tool), self._source))
            if not answer.get("ok", False):
                _log.warning("toolgate took %s in no role: %s", tool.name, answer.get("failed_roles"))
        self._boot_id = boot_id
        self._registered = True
        _log.info("registered %d tools as %s (toolgate boot %s)", len(self._tools), self._source, boot_id)

    async def watch(self) -> None:
        """Runs until cancelled: notices restarts and evictions and registers again."""
        backoff = self._timing.backoff_first_seconds
        polls = 0
        outage_logged = False
        while True:
            try:
                polls += 1
                await self._check(listing=polls % self._timing.listing_every_polls == 0)
            except (httpx.HTTPError, ValueError) as exc:
                if not outage_logged:
                    _log.warning("toolgate unreachable (%s); retrying with backoff", _describe(exc))
                    outage_logged = True
                else:
                    _log.debug("toolgate still unreachable: %s", _describe(exc))
                self._registered = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._timing.backoff_max_seconds)
                continue
            except RegistrationRefused as exc:
                _log.error("%s", exc)
                self._registered = False
                await asyncio.sleep(self._timing.backoff_max_seconds)
                continue
            except Exception:  # an answer of an unexpected shape: the watcher lives on
                _log.exception("keeping the tools registered failed; retrying")
                self._registered = False
                await asyncio.sleep(self._timing.backoff_max_seconds)
                continue
            if outage_logged:
                _log.info("toolgate reachable again")
                outage_logged = False
            backoff = self._timing.backoff_first_seconds
            await asyncio.sleep(self._timing.poll_seconds)

    async def _check(self, listing: bool) -> None:
        if not self._can_answer():
            # Registering callbacks nobody answers would only get them evicted again.
            return
        if not self._registered:
            await self.register_all()
            return
        boot_id = await self._client.boot_id()
        if boot_id != self._boot_id:
            _log.warning("toolgate restarted (boot %s, was %s); registering again", boot_id, self._boot_id)
            await self.register_all()
            return
        if listing:
            _, names = await self._client.registered_names(self._source)
            missing = set(self._tools) - names
            if missing:
                _log.warning("tools %s are no longer registered (evicted?); registering again", sorted(missing))
                await self.register_all()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
