"""Keeping a plugin's tools registered while toolgate restarts and evicts.

Registrations are runtime state in toolgate: a restart drops them, three
refused connections to the plugin's callback origin evict them, and a
registration for every character (``role: null``) reaches only the characters
that exist when it is made. The watcher polls ``/healthz`` (cheap) for the boot
id, which changes at every start of toolgate, and then registers every tool
again. Every few polls it reads ``/api/tools`` and registers a tool again where
a role it belongs in lacks it: evicted, or a character created since.

Each tool stands on its own. One that toolgate refuses (a 4xx: a schema it will
not take, an unknown role) is reported once and tried again only now and then,
never holding up the others. A name that another source holds in a role is left
to that source, with one warning, until it is free again: two plugins declaring
the same tool must not take it from each other for ever. Failures to reach
toolgate are logged once per outage and backed off, never raised: a plugin
outlives any number of toolgate restarts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
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
    back, and an eviction or a new character within about 3 s, well inside the
    promised 10 s. A tool toolgate refused is offered again every
    ``refused_retry_seconds`` (its role may have been created, a limit raised)
    and after every restart.
    """

    poll_seconds: float = 1.0
    listing_every_polls: int = 3
    backoff_first_seconds: float = 0.25
    backoff_max_seconds: float = 2.0
    refused_retry_seconds: float = 30.0

    def __post_init__(self) -> None:
        """Refuses timings that could not work (a zero listing period divides by
        zero at every poll, a zero poll spins), here rather than at run time."""
        for name in ("poll_seconds", "backoff_first_seconds", "backoff_max_seconds", "refused_retry_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"WatchTiming.{name} must be a finite number of seconds greater than 0, not {value!r}")
        if isinstance(self.listing_every_polls, bool) or not isinstance(self.listing_every_polls, int):
            raise ValueError(f"WatchTiming.listing_every_polls must be an integer, not {self.listing_every_polls!r}")
        if self.listing_every_polls < 1:
            raise ValueError(f"WatchTiming.listing_every_polls must be at least 1, not {self.listing_every_polls}")
        if self.backoff_max_seconds < self.backoff_first_seconds:
            raise ValueError("WatchTiming.backoff_max_seconds must not be less than backoff_first_seconds")


@dataclass
class _Refusal:
    """toolgate's last refusal of one tool, and when to offer it again."""

    text: str
    retry_at: float


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
        # Every tool was offered to the toolgate of _boot_id.
        self._have_round = False
        self._reachable = False
        # Read the listing at the next poll, not only every few (after an outage).
        self._recheck = False
        self._refused: dict[str, _Refusal] = {}
        # Tool name -> {role: the other source holding that name there}.
        self._taken: dict[str, dict[str, str]] = {}
        # Tools lacking from a role they belong in, or in no role at all.
        self._unplaced: set[str] = set()
        self._unplaced_reported: frozenset[str] = frozenset()

    @property
    def registered(self) -> bool:
        """Whether every tool is registered in every role it belongs in, as far as
        the plugin last saw: not while toolgate is unreachable, a tool is refused
        or its name held by another source, nor while toolgate has no character."""
        return self._reachable and self._have_round and not (self._refused or self._taken or self._unplaced)

    async def register_all(self) -> None:
        """Registers every tool, each on its own, with the toolgate running now.

        Raises ``httpx.HTTPError`` when toolgate cannot be reached (the round is
        done again at the next poll); refusals are reported, not raised."""
        await self._register_round(await self._client.boot_id())

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
                self._reachable = False
                self._recheck = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._timing.backoff_max_seconds)
                continue
            except Exception:  # an answer of an unexpected shape: the watcher lives on
                _log.exception("keeping the tools registered failed; retrying")
                self._recheck = True
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
        boot_id = await self._client.boot_id()
        self._reachable = True
        if not self._have_round or boot_id != self._boot_id:
            if self._have_round:
                _log.warning("toolgate restarted (boot %s, was %s); registering again", boot_id, self._boot_id)
            await self._register_round(boot_id)
        elif listing or self._recheck:
            await self._reconcile()
        await self._retry_refused()

    async def _register_round(self, boot_id: str | None) -> None:
        """Offers every tool as declared: after a (re)start nothing holds the names."""
        self._have_round = False
        self._taken.clear()
        unplaced = set()
        for tool in self._tools.values():
            if not await self._register(tool, tool.options.role):
                unplaced.add(tool.name)
        self._boot_id = boot_id
        self._have_round = True
        self._reachable = True
        self._recheck = False
        self._note_unplaced(unplaced - set(self._refused))
        placed = len(self._tools) - len(self._refused) - len(self._unplaced)
        _log.info("registered %d of %d tools as %s (toolgate boot %s)", placed, len(self._tools), self._source, boot_id)

    async def _reconcile(self) -> None:
        """Registers each tool again where a role it belongs in lacks it."""
        holders = await self._client.holders()
        self._recheck = False
        plans = {tool.name: self._plan(tool, holders) for tool in self._tools.values() if tool.name not in self._refused}
        _report_lacking(plans, set(holders))
        unplaced = set()
        for name, (roles, missing) in plans.items():
            placed = bool(roles) and name not in self._taken
            if missing:
                placed = await self._register_in(self._tools[name], missing) and placed
            if not placed:
                unplaced.add(name)
        self._note_unplaced(unplaced - set(self._refused))

    def _plan(self, tool: Tool, holders: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
        """The roles ``tool`` belongs in, and those of them where its name is free."""
        roles = list(holders) if tool.options.role is None else [tool.options.role]
        held = {role: holders.get(role, {}).get(tool.name) for role in roles}
        self._note_taken(tool.name, {role: source for role, source in held.items() if source not in (None, self._source)})
        return roles, [role for role, source in held.items() if source is None]

    async def _register_in(self, tool: Tool, roles: list[str]) -> bool:
        """Registers ``tool`` for ``roles``: as declared (one request) unless another
        source holds its name somewhere, which a ``role: null`` would take over."""
        if tool.name not in self._taken:
            return await self._register(tool, tool.options.role)
        placed = True
        for role in roles:
            placed = await self._register(tool, role) and placed
        return placed

    async def _register(self, tool: Tool, role: str | None) -> bool:
        """One registration; whether some role took it. A refusal is noted, not raised."""
        body = tool.registration(self._callback_url(tool), self._source)
        body["role"] = role
        try:
            answer = await self._client.register(body)
        except RegistrationRefused as exc:
            self._note_refused(tool.name, exc)
            return False
        if self._refused.pop(tool.name, None) is not None:
            _log.info("toolgate took tool %s now", tool.name)
        failed = answer.get("failed_roles") or []
        if failed:
            _log.warning("toolgate could not bring tool %s to the live sessions of %s", tool.name, failed)
        return bool(answer.get("ok", False))

    async def _retry_refused(self) -> None:
        now = time.monotonic()
        for name, refusal in list(self._refused.items()):
            if refusal.retry_at <= now and await self._register(self._tools[name], self._tools[name].options.role):
                self._recheck = True  # the next poll sees where it is

    def _note_refused(self, name: str, refusal: RegistrationRefused) -> None:
        """Reports a refusal once (again only when toolgate's answer changes)."""
        previous = self._refused.get(name)
        text = str(refusal)
        if previous is None or previous.text != text:
            _log.error(
                "%s; the plugin's other tools are not held up, and this one is offered again every %gs "
                "and after toolgate restarts",
                text,
                self._timing.refused_retry_seconds,
            )
        else:
            _log.debug("%s (again)", text)
        self._refused[name] = _Refusal(text, time.monotonic() + self._timing.refused_retry_seconds)

    def _note_taken(self, name: str, taken: dict[str, str]) -> None:
        """Warns when another source takes ``name`` (once per source, not per role);
        notes when it is free again."""
        before = self._taken.get(name, {})
        if set(taken.values()) - set(before.values()):
            _log.warning(
                "tool %s is registered by %s in %s: leaving it to them there, and registering it again "
                "once the name is free",
                name,
                ", ".join(sorted(set(taken.values()))),
                ", ".join(sorted(taken)),
            )
        elif before and not taken:
            _log.info("tool %s is no longer held by another source", name)
        if taken:
            self._taken[name] = taken
        else:
            self._taken.pop(name, None)

    def _note_unplaced(self, unplaced: set[str]) -> None:
        """Reports tools in no role once, not at every poll that still finds them so."""
        self._unplaced = unplaced
        lonely = frozenset(name for name in unplaced if name not in self._taken)
        if lonely and lonely != self._unplaced_reported:
            _log.warning(
                "toolgate holds tools %s in no role (no character yet?); they are registered once one exists",
                sorted(lonely),
            )
        self._unplaced_reported = lonely


def _report_lacking(plans: dict[str, tuple[list[str], list[str]]], roles_now: set[str]) -> None:
    """One line for the tools gone from every role (an eviction), one for those
    lacking from some (characters created since).

    A tool of one role that toolgate no longer has (its character deleted) is not
    said to be evicted: offering it again gets a refusal, which is logged as such."""
    gone = sorted(
        name
        for name, (roles, missing) in plans.items()
        if missing and len(missing) == len(roles) and set(roles) <= roles_now
    )
    if gone:
        _log.warning("tools %s are no longer registered (evicted?); registering again", gone)
    new_roles = {name: missing for name, (roles, missing) in plans.items() if missing and len(missing) < len(roles)}
    if new_roles:
        _log.info(
            "registering tools for roles that lack them (new characters): %s",
            "; ".join(f"{name} in {', '.join(roles)}" for name, roles in sorted(new_roles.items())),
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
