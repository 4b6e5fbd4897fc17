"""One tool: its registration with toolgate and how a call runs it.

A call never raises out of here: whatever the function does, the answer is a
callback-contract body (``{"output": ..., "is_error": false}`` or
``{"error": ..., "is_error": true}``), and the traceback goes to the log only.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
import pydantic_core

from .schema import SchemaError, arguments_model, inline_schema

__all__ = [
    "AsyncCapability",
    "DeliveryMode",
    "SideEffectLevel",
    "Slot",
    "Tool",
    "ToolOptions",
]

SideEffectLevel = Literal["none", "sandbox", "irreversible"]
"""What a call may change: nothing, the session's sandbox, or the world."""
Slot = Literal["director", "memory", "narrator", "verifier"]
"""The model slots of a session that may call tools."""
AsyncCapability = Literal["inline_only", "deferred_ok"]
"""Whether the tool may run as a deferred job."""
DeliveryMode = Literal["inline", "async_job"]
"""How a result reaches the model by default."""

MAX_NAME_CHARS = 64
MAX_TIMEOUT_SECONDS = 298.0
# toolgate waits this much longer than the function may run, so that a function
# past its timeout is reported by the plugin (a clear is_error) rather than as
# toolgate's own read timeout; toolgate's limit is 300 s.
TIMEOUT_GRACE_SECONDS = 2.0

_log = logging.getLogger("toolgate_plugin")


@dataclass(frozen=True)
class ToolOptions:
    """What ``@plugin.tool(...)`` may set beyond the function itself.

    ``None`` leaves a field to toolgate's default: every character (``role``),
    side-effect level ``none``, every slot, ``inline_only``, ``inline``.
    """

    name: str | None = None
    description: str | None = None
    role: str | None = None
    timeout_seconds: float = 30.0
    side_effect_level: SideEffectLevel | None = None
    allowed_slots: tuple[Slot, ...] | None = None
    async_capability: AsyncCapability | None = None
    default_delivery_mode: DeliveryMode | None = None


@dataclass
class Tool:
    """A function made a tool: what toolgate is told and how a call reaches it."""

    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    parameters: dict[str, Any]
    options: ToolOptions
    _threads: threading.BoundedSemaphore = field(repr=False, default_factory=lambda: threading.BoundedSemaphore(32))

    @classmethod
    def from_function(cls, function: Callable[..., Any], options: ToolOptions) -> Tool:
        """Derives name, description and schema; refuses what toolgate would."""
        name = options.name or function.__name__
        if not 1 <= len(name) <= MAX_NAME_CHARS:
            raise SchemaError(f"tool name must be 1-{MAX_NAME_CHARS} characters: {name!r}")
        if not 0 < options.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise SchemaError(
                f"{name}: timeout_seconds must be greater than 0 and at most {MAX_TIMEOUT_SECONDS}"
            )
        if options.default_delivery_mode == "async_job" and options.async_capability != "deferred_ok":
            raise SchemaError(f"{name}: default_delivery_mode async_job needs async_capability deferred_ok")
        arguments = arguments_model(function, f"{name}_arguments")
        description = options.description
        if description is None:
            description = inspect.getdoc(function) or ""
        return cls(
            name=name,
            description=description,
            function=function,
            arguments=arguments,
            parameters=inline_schema(arguments),
            options=options,
        )

    def registration(self, callback_url: str, source: str) -> dict[str, Any]:
        """The body of ``POST /api/tools/register`` for this tool."""
        body: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "callback_url": callback_url,
            "role": self.options.role,
            "source": source,
            "timeout_seconds": min(300.0, self.options.timeout_seconds + TIMEOUT_GRACE_SECONDS),
        }
        optional = {
            "side_effect_level": self.options.side_effect_level,
            "allowed_slots": list(self.options.allowed_slots) if self.options.allowed_slots is not None else None,
            "async_capability": self.options.async_capability,
            "default_delivery_mode": self.options.default_delivery_mode,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return body

    async def answer(self, arguments: Any, call_id: Any) -> dict[str, Any]:
        """Runs one call and returns its callback-contract body."""
        try:
            validated = self.arguments.model_validate(arguments)
        except pydantic.ValidationError as exc:
            # The summary names fields and rules, not the values: arguments come
            # from the conversation and stay out of the log.
            summary = _summary(exc)
            _log.info("tool %s: call %r had invalid arguments: %s", self.name, call_id, summary)
            return _error(f"invalid arguments: {summary}")
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        try:
            result = await asyncio.wait_for(self._run(kwargs), self.options.timeout_seconds)
        except asyncio.TimeoutError:
            _log.warning("tool %s: call %r ran past its %ss timeout", self.name, call_id, self.options.timeout_seconds)
            return _error(f"{self.name} did not finish within its timeout of {self.options.timeout_seconds:g} seconds")
        except Exception as exc:
            _log.exception("tool %s: call %r raised", self.name, call_id)
            return _error(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        try:
            output = pydantic_core.to_jsonable_python(result)
        except pydantic_core.PydanticSerializationError as exc:
            _log.error("tool %s: call %r returned a value that is not JSON: %s", self.name, call_id, exc)
            return _error(f"{self.name} returned a {type(result).__name__}, which is not JSON")
        return {"output": output, "is_error": False}

    async def _run(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self.function(**kwargs)
        result = await _in_daemon_thread(self.function, kwargs, self._threads)
        if inspect.isawaitable(result):  # a sync wrapper returning a coroutine
            return await result
        return result


def _error(message: str) -> dict[str, Any]:
    return {"error": message, "is_error": True}


def _summary(error: pydantic.ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


async def _in_daemon_thread(
    function: Callable[..., Any], kwargs: dict[str, Any], slots: threading.BoundedSemaphore
) -> Any:
    """Runs a blocking function off the event loop, in a daemon thread.

    Not the loop's default executor: its threads are joined at exit, so one
    function stuck past its timeout would keep the plugin from stopping. A
    stuck thread keeps its slot until it returns, which bounds how many can pile up.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # the caller gave up (timeout, cancellation)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = context.run(function, **kwargs)
        except BaseException as exc:  # handed to the awaiting side, not lost
            error = exc
        finally:
            slots.release()
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop closed while the function ran: nobody waits for it

    if not slots.acquire(blocking=False):
        raise RuntimeError("too many calls of blocking tools are still running")
    threading.Thread(target=work, name="toolgate-tool", daemon=True).start()
    return await done
