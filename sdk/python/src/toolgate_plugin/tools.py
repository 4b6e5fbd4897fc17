"""One tool: its registration with toolgate and how a call runs it.

A call never raises out of here: whatever the function does, the answer is a
callback-contract body (``{"output": ..., "is_error": false}`` or
``{"error": ..., "is_error": true}``), and the traceback goes to the log only.
That holds for ``SystemExit`` and ``KeyboardInterrupt`` raised by a function too
(argparse exits on bad input), and for a ``CancelledError`` of the function's
own: only the cancellation of the call itself (the server shutting down) ends
it without an answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
import pydantic_core

from .context import CallContext
from .schema import (
    DEFAULT_SIZE_LIMIT,
    SchemaError,
    SizeLimit,
    arguments_model,
    check_registrable,
    check_size,
    check_text,
    context_parameter,
    inline_schema,
    integers_as_schema_reads,
)

__all__ = [
    "AsyncCapability",
    "DeliveryMode",
    "ReplaySafety",
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
ReplaySafety = Literal["safe", "confirm_on_replay", "never_auto_replay", "uncertain"]
"""Whether a call may run again: on a regenerated floor, and for a deferred job whose
worker was lost (only ``safe`` is handed over again, under the same idempotency key)."""

MAX_NAME_CHARS = 64
# toolgate refuses a longer description (src/tools/remote/mod.rs MAX_DESCRIPTION_BYTES).
MAX_DESCRIPTION_BYTES = 16 * 1024
MAX_TIMEOUT_SECONDS = 298.0
# toolgate waits this much longer than the function may run, so that a function
# past its timeout is reported by the plugin (a clear is_error) rather than as
# toolgate's own read timeout; toolgate's limit is 300 s.
TIMEOUT_GRACE_SECONDS = 2.0
# Blocking calls of one tool running at once; more wait for a thread within their timeout.
MAX_THREADS_PER_TOOL = 32
# How often a call waiting for a thread looks again (see _take_slot).
SLOT_POLL_SECONDS = 0.05
# A URL path resolves these as "here" and "up": no callback URL can name them.
_UNROUTABLE_NAMES = frozenset({".", ".."})

_log = logging.getLogger("toolgate_plugin")


@dataclass(frozen=True)
class ToolOptions:
    """What ``@plugin.tool(...)`` may set beyond the function itself.

    ``None`` leaves a field to toolgate's default: every character (``role``),
    side-effect level ``none``, every slot, ``inline_only``, ``inline``, and a
    replay safety inferred from the side-effect level.
    """

    name: str | None = None
    description: str | None = None
    role: str | None = None
    timeout_seconds: float = 30.0
    side_effect_level: SideEffectLevel | None = None
    allowed_slots: tuple[Slot, ...] | None = None
    async_capability: AsyncCapability | None = None
    default_delivery_mode: DeliveryMode | None = None
    replay_safety: ReplaySafety | None = None


@dataclass
class Tool:
    """A function made a tool: what toolgate is told and how a call reaches it."""

    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    parameters: dict[str, Any]
    options: ToolOptions
    context_parameter: str | None = None
    """The parameter that gets the call's ``CallContext``, if the function has one."""
    _threads: threading.BoundedSemaphore = field(
        repr=False, default_factory=lambda: threading.BoundedSemaphore(MAX_THREADS_PER_TOOL)
    )
    _running: dict[str, _Running] = field(repr=False, default_factory=dict)
    """The calls running now, by idempotency key (see ``answer``)."""

    @classmethod
    def from_function(
        cls, function: Callable[..., Any], options: ToolOptions, *, size_limit: SizeLimit = DEFAULT_SIZE_LIMIT
    ) -> Tool:
        """Derives name, description and schema; refuses what toolgate would.

        The size is checked against ``size_limit``: a plugin passes its own (see
        ``Plugin(max_tool_schema_bytes=...)``), a caller without one gets toolgate's
        default ``--max-tool-schema-bytes``. A toolgate set lower than that still
        refuses the registration, which the plugin logs, naming the tool."""
        _check_callable(function)
        name = options.name or function.__name__
        _check_options(name, options)
        description = options.description
        if description is None:
            description = inspect.getdoc(function) or ""
        check_text(description, f"{name}: the description")
        if len(description.encode()) > MAX_DESCRIPTION_BYTES:
            raise SchemaError(f"{name}: the description must be at most {MAX_DESCRIPTION_BYTES} bytes (UTF-8)")
        arguments = arguments_model(function, f"{name}_arguments")
        parameters = inline_schema(arguments)
        check_registrable(parameters, name)
        check_size(parameters, description, name, size_limit)
        return cls(
            name=name,
            description=description,
            function=function,
            arguments=arguments,
            parameters=parameters,
            options=options,
            context_parameter=context_parameter(function, f"{name}_arguments"),
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
            "replay_safety": self.options.replay_safety,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return body

    async def answer(self, arguments: Any, context: CallContext | None = None) -> dict[str, Any]:
        """Runs one call and returns its callback-contract body.

        toolgate may hand a call over again (same idempotency key) while its first
        delivery still runs here: a restart of toolgate while a deferred job runs.
        That delivery does not run the function a second time: it waits for the
        running one and answers its outcome (when its arguments are the same: a
        request that merely reuses a key is run on its own). Deliveries after the
        first one ended do reach the function, which remembers the keys it applied."""
        context = context or CallContext()
        key = context.idempotency_key
        running = self._running.get(key) if key is not None else None
        if running is not None and running.arguments == arguments:
            _log.info(
                "tool %s: attempt %s of %s came while an earlier delivery still runs; it gets that one's answer",
                self.name,
                context.attempt,
                key,
            )
            return await running.joined()
        if key is None or running is not None:
            return await self._answer(arguments, context)
        call = asyncio.ensure_future(self._answer(arguments, context))
        self._running[key] = _Running(arguments, call)
        try:
            return await call
        finally:
            del self._running[key]

    async def _answer(self, arguments: Any, context: CallContext) -> dict[str, Any]:
        try:
            kwargs = self._kwargs(arguments, context)
        except _Invalid as exc:
            return _error(f"invalid arguments: {exc}")
        return await self._outcome(kwargs, context.call_id)

    async def _outcome(self, kwargs: dict[str, Any], call_id: Any) -> dict[str, Any]:
        """Runs the function within its timeout; whatever it does becomes an answer.

        The function runs in a task of its own, so that a ``CancelledError`` it
        raises itself (a task it cancelled, ``raise CancelledError``) is told apart
        from the cancellation of this call: only the latter propagates."""
        progress = _Progress()
        run = asyncio.ensure_future(self._run(kwargs, progress))
        try:
            done, _ = await asyncio.wait({run}, timeout=self.options.timeout_seconds)
        except asyncio.CancelledError:  # this call is cancelled (the server shuts down)
            _abandon(run)
            raise
        if not done:
            _abandon(run)
            return self._timed_out(call_id, progress)
        try:
            return {"output": run.result(), "is_error": False}
        except asyncio.CancelledError as exc:  # the function's own: nothing cancelled the call
            _log.error("tool %s: call %r raised CancelledError of its own", self.name, call_id, exc_info=exc)
            return _error(_describe(exc))
        except _NotJson as exc:
            _log.error("tool %s: call %r returned a value that is not JSON: %s", self.name, call_id, exc.reason)
            return _error(f"{self.name} returned {exc.what}")
        except _Raised as exc:
            _log.error("tool %s: call %r raised", self.name, call_id, exc_info=exc.error)
            return _error(_describe(exc.error))

    def _kwargs(self, arguments: Any, context: CallContext) -> dict[str, Any]:
        """The function's keyword arguments, validated in strict mode from JSON.

        Strict: what the schema says is what passes (no "7" for an integer, no
        "yes" for a boolean), also for a call that did not come through toolgate's
        own schema check; as in the schema, ``7.0`` is an integer (an ``int`` for the
        function). Raises ``_Invalid`` with the model's message, having
        logged what the log may hold: field paths and rule names, never values nor
        the keys of a mapping (arguments come from the conversation)."""
        non_finite = _non_finite(arguments)
        if non_finite is not None:
            path, number = non_finite
            where = self._log_path(path)
            _log.info("tool %s: call %r had invalid arguments: %s (finite_number)", self.name, context.call_id, where)
            raise _Invalid(f"{_path(path)}: {number} is no JSON number (one out of range, such as 1e400, reads as inf)")
        arguments = integers_as_schema_reads(arguments, self.parameters)
        try:
            validated = self.arguments.model_validate_json(pydantic_core.to_json(arguments), strict=True)
        except pydantic.ValidationError as exc:
            _log.info("tool %s: call %r had invalid arguments: %s", self.name, context.call_id, self._log_summary(exc))
            raise _Invalid(_summary(exc)) from None
        except pydantic_core.PydanticSerializationError:  # only from a caller in Python
            raise _Invalid("they are not JSON") from None
        except Exception as exc:  # a validator raising what pydantic does not take for a refusal
            _log.error(
                "tool %s: call %r: a validator of its arguments raised %s (a refusal is a ValueError); "
                "where, without the arguments:\n%s",
                self.name,
                context.call_id,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
            )
            raise _Invalid(f"checking them raised {_describe(exc)}") from None
        # From __dict__, not getattr: a field may shadow a BaseModel attribute (json, copy).
        kwargs = {name: validated.__dict__[name] for name in type(validated).model_fields}
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = context
        return kwargs

    def _log_summary(self, error: pydantic.ValidationError) -> str:
        parts = []
        for item in error.errors(include_url=False, include_input=False, include_context=False):
            parts.append(f"{self._log_path(item['loc'])} ({item['type']})")
        return "; ".join(parts)

    def _log_path(self, path: tuple[str | int, ...]) -> str:
        """``path`` as the log may show it: indices and schema property names only."""
        known = _property_names(self.parameters)
        return ".".join(_loggable(part, known) for part in path) or "arguments"

    def _timed_out(self, call_id: Any, progress: _Progress) -> dict[str, Any]:
        timeout = self.options.timeout_seconds
        if not progress.started:
            _log.warning("tool %s: call %r found no free thread within its %ss timeout", self.name, call_id, timeout)
            return _error(
                f"{self.name} did not start within its timeout of {timeout:g} seconds: "
                f"{MAX_THREADS_PER_TOOL} earlier calls of it were still running"
            )
        _log.warning("tool %s: call %r ran past its %ss timeout", self.name, call_id, timeout)
        return _error(f"{self.name} did not finish within its timeout of {timeout:g} seconds")

    async def _run(self, kwargs: dict[str, Any], progress: _Progress) -> Any:
        """The function's result as JSON-able data; what it raises comes out as ``_Raised``.

        Whatever it raises, ``BaseException``s included: a ``SystemExit`` leaving
        a task would be re-raised by asyncio out of the event loop and end the
        plugin. Serialising is part of the call, since a generator runs only then.
        A ``CancelledError`` stays one (see ``_outcome``)."""
        try:
            return await self._call(kwargs, progress)
        except (asyncio.CancelledError, _NotJson, _Raised):
            raise
        except BaseException as exc:
            raise _Raised(exc) from None

    async def _call(self, kwargs: dict[str, Any], progress: _Progress) -> Any:
        if inspect.iscoroutinefunction(self.function):
            progress.started = True
            return _jsonable(await self.function(**kwargs))
        result = await _in_daemon_thread(self.function, kwargs, self._threads, progress, self.name)
        if inspect.isawaitable(result):  # a sync wrapper returning a coroutine
            return _jsonable(await result)
        return result


@dataclass
class _Progress:
    """How far one call got: whether its function started (a thread was free)."""

    started: bool = False


@dataclass
class _Running:
    """A call running now under an idempotency key: later deliveries of it join it."""

    arguments: Any
    answer: asyncio.Future[dict[str, Any]]

    async def joined(self) -> dict[str, Any]:
        """The running call's answer; waiting is cancelled with the caller, the call is not."""
        await asyncio.wait({self.answer})
        if self.answer.cancelled():
            return _error("the earlier delivery of this call, which this one waited for, was cancelled")
        return self.answer.result()


class _Invalid(Exception):
    """Arguments the function cannot be called with; the text is for the model."""


class _Raised(Exception):
    """What a tool raised, carried as an ``Exception`` (see ``Tool._run``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(_describe(error))
        self.error = error


class _NotJson(Exception):
    """A tool's return value that cannot be written as JSON.

    ``what`` completes "<tool> returned ..." for the model; ``reason`` is for the log."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(reason)
        self.what = what
        self.reason = reason


def _check_callable(function: Callable[..., Any]) -> None:
    """Only functions and bound methods: a ``functools.partial`` or a callable object
    has no name and no hints of its own that can be read reliably."""
    if not (inspect.isfunction(function) or inspect.ismethod(function)):
        raise SchemaError(
            f"a tool must be a function (def or async def) or a bound method, not {type(function).__name__}: "
            "wrap it in a def with type hints"
        )


def _check_options(name: str, options: ToolOptions) -> None:
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        raise SchemaError(f"tool name must be 1-{MAX_NAME_CHARS} characters: {name!r}")
    if name in _UNROUTABLE_NAMES:
        raise SchemaError(f"tool name {name!r} cannot be a callback URL's path segment")
    check_text(name, f"tool name {name!r}")
    if options.role is not None:
        check_text(options.role, f"{name}: role {options.role!r}")
    if not 0 < options.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise SchemaError(f"{name}: timeout_seconds must be greater than 0 and at most {MAX_TIMEOUT_SECONDS}")
    if options.default_delivery_mode == "async_job" and options.async_capability != "deferred_ok":
        raise SchemaError(f"{name}: default_delivery_mode async_job needs async_capability deferred_ok")


def _error(message: str) -> dict[str, Any]:
    return {"error": message, "is_error": True}


def _describe(error: BaseException) -> str:
    """``Type: text``, or the type alone; also for an exception whose ``__str__`` fails."""
    try:
        text = str(error)
    except Exception:
        text = "(its message could not be read)"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _summary(error: pydantic.ValidationError) -> str:
    """For the model: paths and messages, so it can fix its call."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        parts.append(f"{_path(item['loc'])}: {item['msg']}")
    return "; ".join(parts)


def _path(path: tuple[str | int, ...]) -> str:
    """For the model: where in the arguments, as pydantic's messages say it."""
    return ".".join(str(part) for part in path) or "arguments"


def _loggable(part: str | int, known: frozenset[str]) -> str:
    """A path element as the log may show it: indices and schema property names;
    anything else (a mapping's key, an unknown argument's name) is data."""
    if isinstance(part, int) or part in known or part == "[key]":
        return str(part)
    return "*"


def _property_names(schema: Any) -> frozenset[str]:
    names: set[str] = set()
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            properties = value.get("properties")
            if isinstance(properties, dict):
                names.update(properties)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return frozenset(names)


def _jsonable(value: Any) -> Any:
    """``value`` as JSON data, refusing what JSON cannot hold: an unknown type, and
    inf or nan (a tool error rather than ``null``, which would change the data
    unseen; pydantic would write ``Infinity``, which is no JSON)."""
    try:
        data = pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise _NotJson(f"a {type(value).__name__}, which is not JSON", str(exc)) from None
    non_finite = _non_finite(data)
    if non_finite is not None:
        path, number = non_finite
        where = f" at {_path(path)}" if path else ""
        raise _NotJson(f"{number}{where}, a number JSON cannot hold (it has no inf or nan)", "inf or nan in the result")
    return data


def _non_finite(data: Any) -> tuple[tuple[str | int, ...], float] | None:
    """The first inf or nan in JSON data, with its path; ``None`` when there is none."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return path, value
        elif isinstance(value, dict):
            stack.extend((item, (*path, key)) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
    return None


def _abandon(run: asyncio.Future[Any]) -> None:
    """Cancels a call's run that nobody waits for any more; whatever it ends with
    later is taken, so asyncio does not report it as never retrieved."""
    run.cancel()
    run.add_done_callback(lambda done: done.cancelled() or done.exception())


def _serialised_call(function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Runs in the tool's thread: a lazy result (a generator) is worked off there too."""
    result = function(**kwargs)
    return result if inspect.isawaitable(result) else _jsonable(result)


async def _take_slot(slots: threading.BoundedSemaphore, name: str) -> None:
    """Waits for one of the tool's threads, within the caller's timeout.

    Polls: slots are given back by worker threads, and a plain semaphore works
    with whatever event loop the plugin runs in (an asyncio one is bound to one)."""
    if slots.acquire(blocking=False):
        return
    _log.info("tool %s: %d calls are running; a call waits for one to end", name, MAX_THREADS_PER_TOOL)
    while not slots.acquire(blocking=False):
        await asyncio.sleep(SLOT_POLL_SECONDS)


async def _in_daemon_thread(
    function: Callable[..., Any],
    kwargs: dict[str, Any],
    slots: threading.BoundedSemaphore,
    progress: _Progress,
    name: str,
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
            result = context.run(_serialised_call, function, kwargs)
        except _NotJson as exc:
            error = exc
        except BaseException as exc:  # handed to the awaiting side, not lost
            # Wrapped: a future refuses a StopIteration (the loop's callback would
            # fail and the call hang until its timeout), and a CancelledError
            # raised by the function is no cancellation of the call.
            error = _Raised(exc)
        finally:
            slots.release()
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop closed while the function ran: nobody waits for it

    await _take_slot(slots, name)
    # No await between taking the slot and starting the thread, which gives it back.
    try:
        threading.Thread(target=work, name="toolgate-tool", daemon=True).start()
    except BaseException:  # no thread to be had: the slot is not taken after all
        slots.release()
        raise
    progress.started = True
    return await done
