"""The envelope: how an event becomes a NATS message and back.

One Encoder and one Decoder for the whole union are built once and reused: msgspec compiles the
schema on construction, and rebuilding it per message would cost more than the decode itself.

Reading honours ``Egress-Schema``: a message of the current schema and a current type name is
decoded straight into its Struct; one of an older schema, or stored under a type's old name, is
decoded to a JSON object, brought to the current shape by the registry of ``events.upcasting``,
and then converted (docs/architecture.md, "Events and the envelope"). The header is untrusted
input like the payload:

- absent: the first schema (``FIRST_SCHEMA``: every writer has stamped the header since);
- ASCII digits within the schemas this build reads: that schema;
- ASCII digits above them, however many: ``NewerSchema``, skipped like an unknown type (a newer
  writer's event; this build cannot know its shape);
- anything else (empty, a sign, a decimal point, non-ASCII digits, below the first schema):
  ``UndecodableEvent``, a poison message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import Meta

from events.meter import UpstreamMetered
from events.meter import problem as meter_problem
from events.schemas import (
    MAX_BLOCK_BACKOFF_SECONDS,
    MAX_COOLDOWN_SECONDS,
    MAX_LEASE_SECONDS,
    MAX_TARGET_LENGTH,
    SCHEMA_VERSION,
    AnyEvent,
    Event,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
    LeaseSwitched,
    RotationRequested,
)
from events.traffic import TrafficRecorded
from events.traffic import problem as traffic_problem
from events.upcasting import MAX_SCHEMA_DIGITS, UPCASTERS, Upcasters

HDR_EVENT_TYPE = "Egress-Event-Type"
HDR_SCHEMA = "Egress-Schema"
HDR_CAUSATION = "Egress-Causation-Id"
HDR_MSG_ID = "Nats-Msg-Id"
HDR_TRACEPARENT = "traceparent"
HDR_TRACESTATE = "tracestate"
HDR_EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
_any_decoder = msgspec.json.Decoder()


class CodecError(Exception):
    """Base of envelope problems; carries what a dead-letter record needs to explain itself."""


class UnknownEventType(CodecError):
    """A type this build does not know: written by a newer version. Skip it, never crash."""

    def __init__(self, event_type: str) -> None:
        super().__init__(f"unknown event type {event_type!r}")
        self.event_type = event_type


class NewerSchema(UnknownEventType):
    """An event stamped with a schema newer than this build reads: a newer writer's, whose shape
    this build cannot know. Skipped and counted like an unknown type (docs/operations.md,
    "Upgrades": readers are upgraded before writers, so a reader rarely meets one)."""

    def __init__(self, event_type: str, schema: str, newest: int) -> None:
        CodecError.__init__(
            self, f"{event_type} of schema {schema}: newer than this build reads ({newest})"
        )
        self.event_type = event_type
        self.schema = schema


class UndecodableEvent(CodecError):
    """A known type whose payload does not match its schema: a poison message."""


class InvalidEvent(CodecError, ValueError):
    """An event refused before it is written: the log is immutable, so an event no reader could
    decode, or whose values no fold can use, would be there for ever. A bug in its writer."""


_ID = Annotated[str, Meta(min_length=1)]
_TTL = Annotated[float, Meta(gt=0, le=MAX_LEASE_SECONDS)]
_REQUESTED_TTL = Annotated[float, Meta(ge=0, le=MAX_LEASE_SECONDS)]
_COOLDOWN = Annotated[float, Meta(ge=0, le=MAX_COOLDOWN_SECONDS)]
_DEADLINE = Annotated[datetime, Meta(tz=True)]

WRITE_BOUNDS: dict[type[Event], dict[str, Any]] = {
    LeaseAcquired: {
        "lease_id": _ID,
        "proxy_uid": _ID,
        "ttl_seconds": _TTL,
        "requested_ttl_seconds": _REQUESTED_TTL,
        "cooldown_seconds": _COOLDOWN,
        "fencing_token": Annotated[int, Meta(ge=0)],
        "deadline": _DEADLINE,
        "target": Annotated[str, Meta(max_length=MAX_TARGET_LENGTH)],
    },
    LeaseReleased: {
        "lease_id": _ID,
        "proxy_uid": _ID,
        "cooldown_seconds": _COOLDOWN,
        "deadline": _DEADLINE,
    },
    LeaseReported: {
        "lease_id": _ID,
        "proxy_uid": _ID,
        "outcome": Literal["success", "blocked", "failed"],
        "deadline": _DEADLINE,
        "backoff_seconds": Annotated[float, Meta(ge=0, le=MAX_BLOCK_BACKOFF_SECONDS)],
    },
    LeaseExpired: {"lease_id": _ID, "proxy_uid": _ID},
    LeaseRenewed: {
        "lease_id": _ID,
        "proxy_uid": _ID,
        "ttl_seconds": _TTL,
        "requested_ttl_seconds": _REQUESTED_TTL,
        "deadline": _DEADLINE,
    },
    RotationRequested: {"uid": _ID, "rotation_id": _ID},
    LeaseSwitched: {"lease_id": _ID, "proxy_uid": _ID, "rotation_id": _ID, "provider_id": _ID},
}
"""What the codec checks before writing, beyond the types. Checked on the way out only: the
reading side stays as lenient as the types, so events written before a bound existed still
decode, and the lease fold judges every value it uses on its own (``projections.lease``)."""


WRITE_CHECKS: dict[type[Event], Callable[[Any], str | None]] = {
    TrafficRecorded: traffic_problem,
    UpstreamMetered: meter_problem,
}
"""Checks beyond field bounds, for events whose rules span fields or nested rows: what makes the
event one its fold would skip, or None. On the way out only, like ``WRITE_BOUNDS``."""


def event_type(event: Event) -> str:
    return type(event).__name__


def encode(event: Event) -> bytes:
    """The payload, once it is certain that every reader can decode it and that its values are
    within the bounds of its type; otherwise ``InvalidEvent``, naming the field.

    JSON has no infinity or NaN (msgspec writes them as ``null``), and nothing else stops a
    writer from building a Struct with a wrong type in it, so the payload is decoded again as a
    reader would decode it.
    """
    name = event_type(event)
    for field in event.__struct_fields__:
        value = getattr(event, field)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidEvent(f"{name}.{field}: {value} is not a finite number")
    try:
        payload = _encoder.encode(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"{name}: cannot be encoded: {exc}") from None
    try:
        _decoder.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidEvent(f"{name}: a reader could not decode it: {exc}") from None
    for field, kind in WRITE_BOUNDS.get(type(event), {}).items():
        value = getattr(event, field)
        if value is msgspec.UNSET:
            continue  # left out of the payload: a reader takes the default
        try:
            msgspec.convert(value, type=kind)
        except msgspec.ValidationError as exc:
            raise InvalidEvent(f"{name}.{field}: {exc}") from None
    check = WRITE_CHECKS.get(type(event))
    why = check(event) if check is not None else None
    if why is not None:
        raise InvalidEvent(f"{name}: {why}")
    return payload


def envelope_headers(event: Event, msg_id: str, causation_id: str = "") -> dict[str, str]:
    headers = {
        HDR_EVENT_TYPE: event_type(event),
        HDR_SCHEMA: str(SCHEMA_VERSION),
        HDR_MSG_ID: msg_id,
    }
    if causation_id:
        headers[HDR_CAUSATION] = causation_id
    return headers


MAX_SEQ_DIGITS = 20
"""A stream sequence is a uint64: at most 20 decimal digits."""


def expected_last(headers: Mapping[str, str] | None, filter_subject: str) -> int | None:
    """The aggregate's last sequence before this event, when its append expected one and the
    server checked it: an event stored with ``Nats-Expected-Last-Subject-Sequence`` (scoped to
    ``filter_subject``) was only accepted if that was the aggregate's last sequence then. None
    for an event appended without the check, scoped otherwise, or with a value that is not a
    sequence (a hand-written header the server would have refused is never trusted)."""
    found = headers or {}
    text = found.get(HDR_EXPECTED_SEQ)
    if text is None or found.get(HDR_EXPECTED_SUBJECT) != filter_subject:
        return None
    if not (0 < len(text) <= MAX_SEQ_DIGITS and text.isascii() and text.isdigit()):
        return None
    return int(text)


def decode(
    data: bytes, headers: Mapping[str, str] | None = None, *, upcasters: Upcasters = UPCASTERS
) -> AnyEvent:
    """Decode a payload, telling an unknown type apart from a broken payload, in the current
    shape whatever schema it was written in (``upcasters``: the registry; tests pass their own).

    The header is consulted first so a type from a newer writer is reported as unknown even when
    its payload would also fail to decode here.
    """
    headers = headers or {}
    declared = headers.get(HDR_EVENT_TYPE)
    if headers.get(HDR_SCHEMA) == upcasters.current_text and (
        declared is None or declared in upcasters.types
    ):
        try:
            return _decoder.decode(data)  # the fast path: today's writers, no JSON object step
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            pass  # the general path below says what is wrong with it
    if declared is not None and not upcasters.knows(declared):
        raise UnknownEventType(declared)
    schema = _schema(headers.get(HDR_SCHEMA), declared, data, upcasters)
    if schema == upcasters.current and declared not in upcasters.renames:
        return _decode_current(data, declared, upcasters)
    return _upcast(data, declared, schema, upcasters)


def _decode_current(data: bytes, declared: str | None, upcasters: Upcasters) -> AnyEvent:
    """Straight into the Struct with the one Decoder; a payload stored under a type's old name
    (a hand-made publish that left the header out) still goes the slow way."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        tag = _peek_type(data)
        if tag is not None and tag in upcasters.renames:
            return _upcast(data, declared, upcasters.current, upcasters)
        if tag is not None and not upcasters.knows(tag):
            raise UnknownEventType(tag) from exc
        raise UndecodableEvent(f"{declared or tag or 'event'}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise UndecodableEvent(f"payload is not valid JSON: {exc}") from exc
    except RecursionError:
        raise UndecodableEvent(f"{declared or 'event'}: {_TOO_DEEP}") from None


_TOO_DEEP = "the payload is nested too deeply to be an event"
"""msgspec raises ``RecursionError`` on about a thousand nested arrays or objects, even in a
field the Struct does not have: a hostile payload, not a reason to stop a reader."""


def _schema(text: str | None, declared: str | None, data: bytes, upcasters: Upcasters) -> int:
    """The schema a message was written in, from its untrusted header (the module's docstring lists
    what each kind of value means)."""
    if text is None:
        return upcasters.oldest
    if text == upcasters.current_text:
        return upcasters.current
    digits = text.strip()
    what = declared or "event"
    if not (digits.isascii() and digits.isdigit()):
        raise UndecodableEvent(
            f"{what}: header {HDR_SCHEMA} {text[:20]!r} is not a schema version "
            f"(a whole number, {upcasters.oldest} or more)"
        )
    if len(digits) > MAX_SCHEMA_DIGITS or int(digits) > upcasters.newest:
        shown = digits if len(digits) <= 20 else digits[:20] + "..."
        raise NewerSchema(declared or _peek_type(data) or "?", shown, upcasters.newest)
    schema = int(digits)
    if schema < upcasters.oldest:
        raise UndecodableEvent(
            f"{what}: header {HDR_SCHEMA} {digits} is older than the first schema "
            f"({upcasters.oldest})"
        )
    return schema


def _upcast(data: bytes, declared: str | None, schema: int, upcasters: Upcasters) -> AnyEvent:
    """The slow path: the payload as a JSON object, brought to the current shape, converted to
    its Struct with the types msgspec compiled for the fast path."""
    what = declared or "event"
    try:
        obj = _any_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise UndecodableEvent(f"payload is not valid JSON: {exc}") from exc
    except RecursionError:
        raise UndecodableEvent(f"{what}: {_TOO_DEEP}") from None
    tag = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(tag, str):
        raise UndecodableEvent(f"{what}: the payload is not an event (an object with a type)")
    name = upcasters.current_name(tag)
    if name is None:
        raise UnknownEventType(tag)
    try:
        shaped = upcasters.shape(name, schema, obj)
    except Exception as exc:  # a step on untrusted input: whatever it raises, the message is poison
        raise UndecodableEvent(
            f"{name} of schema {schema}: its upcaster failed: {type(exc).__name__}: {exc}"[:500]
        ) from exc
    try:
        return cast(AnyEvent, msgspec.convert(shaped, type=upcasters.types[name]))
    except msgspec.ValidationError as exc:
        raise UndecodableEvent(f"{name} of schema {schema}: {exc}") from exc


class _TagOnly(msgspec.Struct):
    type: str | None = None


_tag_decoder = msgspec.json.Decoder(_TagOnly)


def _peek_type(data: bytes) -> str | None:
    try:
        return _tag_decoder.decode(data).type
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


def to_builtins(event: Event) -> dict[str, object]:
    """A JSON-ready dict, for `events -o json` and the API."""
    result = msgspec.to_builtins(event)
    assert isinstance(result, dict)
    return result
