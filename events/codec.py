"""The envelope: how an event becomes a NATS message and back.

One Encoder and one Decoder for the whole union are built once and reused: msgspec compiles the
schema on construction, and rebuilding it per message would cost more than the decode itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from events.schemas import (
    EVENT_TYPES,
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


class CodecError(Exception):
    """Base of envelope problems; carries what a dead-letter record needs to explain itself."""


class UnknownEventType(CodecError):
    """A type this build does not know: written by a newer version. Skip it, never crash."""

    def __init__(self, event_type: str) -> None:
        super().__init__(f"unknown event type {event_type!r}")
        self.event_type = event_type


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


def decode(data: bytes, headers: Mapping[str, str] | None = None) -> AnyEvent:
    """Decode a payload, telling an unknown type apart from a broken payload.

    The header is consulted first so a type from a newer writer is reported as unknown even when
    its payload would also fail to decode here.
    """
    declared = (headers or {}).get(HDR_EVENT_TYPE)
    if declared is not None and declared not in EVENT_TYPES:
        raise UnknownEventType(declared)
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        tag = _peek_type(data)
        if tag is not None and tag not in EVENT_TYPES:
            raise UnknownEventType(tag) from exc
        raise UndecodableEvent(f"{declared or tag or 'event'}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise UndecodableEvent(f"payload is not valid JSON: {exc}") from exc


class _TagOnly(msgspec.Struct):
    type: str | None = None


_tag_decoder = msgspec.json.Decoder(_TagOnly)


def _peek_type(data: bytes) -> str | None:
    try:
        return _tag_decoder.decode(data).type
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def to_builtins(event: Event) -> dict[str, object]:
    """A JSON-ready dict, for `events -o json` and the API."""
    result = msgspec.to_builtins(event)
    assert isinstance(result, dict)
    return result
