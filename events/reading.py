"""Turning a stored message into a ``Recorded``, whatever the message holds.

Every reader (aggregate reads of both stores, the projector, the CLI's log reader) goes through
``recorded``, so all of them treat a bad event alike: it becomes an ``Unreadable`` placeholder at
its real sequence, with a ``Skip`` that says why, instead of an exception. What a reader then does
with the placeholder is its own choice: an aggregate read leaves it out of the events but keeps
its sequence; a fold moves past it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TypeVar

from events import codec
from events.schemas import AnyEvent
from events.skips import UNDECODABLE, UNKNOWN_TYPE, UNUSABLE, Skip
from events.store import Recorded, Unreadable

V = TypeVar("V")


def recorded(  # noqa: PLR0917 - the parts of a stored message, in the order every reader has them
    stream: str,
    seq: int,
    subject: str,
    timestamp: datetime,
    data: bytes,
    headers: Mapping[str, str] | None,
) -> tuple[Recorded, Skip | None]:
    headers = headers or {}
    skip: Skip | None = None
    event: AnyEvent | Unreadable
    try:
        event = codec.decode(data, headers)
    except codec.UnknownEventType as exc:
        skip = Skip(stream, subject, seq, exc.event_type, UNKNOWN_TYPE, str(exc))
    except codec.CodecError as exc:
        declared = headers.get(codec.HDR_EVENT_TYPE, "") or "?"
        skip = Skip(stream, subject, seq, declared, UNDECODABLE, str(exc)[:500])
    if skip is not None:
        event = Unreadable(type=skip.event_type, reason=skip.reason, detail=skip.detail)
    return (
        Recorded(
            event=event,
            seq=seq,
            subject=subject,
            timestamp=timestamp,
            msg_id=headers.get(codec.HDR_MSG_ID, ""),
            causation_id=headers.get(codec.HDR_CAUSATION, ""),
        ),
        skip,
    )


def unusable(stream: str, item: Recorded, exc: BaseException) -> tuple[Recorded, Skip]:
    """The placeholder for an event that decoded but that a fold could not apply."""
    event_type = codec.event_type(item.event) if not isinstance(item.event, Unreadable) else "?"
    detail = f"{type(exc).__name__}: {exc}"[:500]
    skip = Skip(stream, item.subject, item.seq, event_type, UNUSABLE, detail)
    placeholder = Unreadable(type=event_type, reason=UNUSABLE, detail=detail)
    return (
        Recorded(
            event=placeholder,
            seq=item.seq,
            subject=item.subject,
            timestamp=item.timestamp,
            msg_id=item.msg_id,
            causation_id=item.causation_id,
        ),
        skip,
    )


FOLD_ERRORS = (ArithmeticError, ValueError, TypeError, KeyError, IndexError, AttributeError)
"""What a fold may raise on an event it cannot apply: never a reason to stop a reader. Anything
else (a MemoryError, a cancellation) is not about the event and propagates."""


def apply_tolerantly(
    apply: Callable[[V | None, Recorded], V],
    view: V | None,
    item: Recorded,
    stream: str,
) -> tuple[V | None, Skip | None]:
    """``apply``, or, when it raises on this event, the view moved past it as unusable."""
    try:
        return apply(view, item), None
    except FOLD_ERRORS as exc:
        placeholder, skip = unusable(stream, item, exc)
    try:
        return apply(view, placeholder), skip
    except FOLD_ERRORS:
        return view, skip
