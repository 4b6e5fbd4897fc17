"""What toolgate says about one call besides its arguments.

A tool that declares a parameter of type ``CallContext`` (or ``CallContext | None``,
``Optional[CallContext]``, ``Annotated[CallContext, ...]``) gets it; the parameter
is no part of the tool's schema, so the model never sees or fills it. Anywhere
else in a schema (``list[CallContext]``, a field of a model) it is refused: the
model would fill it, and could forge an idempotency key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["CallContext"]


@dataclass(frozen=True)
class CallContext:
    """One call's delivery facts, from toolgate's callback request.

    toolgate may hand a deferred job over again when its worker was lost (only for
    tools that are ``replay_safety: safe``), under the same ``idempotency_key``
    with the next ``attempt``: a tool with an effect outside the call remembers
    the keys it has applied and applies each one once.
    """

    call_id: str | None = None
    """The model's id of the call (the callback body's ``call_id``)."""
    idempotency_key: str | None = None
    """``Idempotency-Key``: the call's execution id (``texec_…``), the same at every
    hand-over of one execution; ``None`` when the request had none (a direct call)."""
    attempt: int | None = None
    """``X-Toolgate-Attempt``: 1 for the first hand-over of the execution, 2 and 3 for
    the next; ``None`` when the request had none."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> NoReturn:
        """Refuses to be part of any pydantic schema: a tool's own ``CallContext``
        parameter is taken out before its schema is made, and anywhere else the
        model would fill the fields, idempotency key included."""
        raise TypeError(
            "CallContext is filled by toolgate, never by the model: it can only be the type of a tool's "
            "own parameter (optionally `| None` or Annotated), not part of another type or of a model"
        )
