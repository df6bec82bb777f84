"""The envelope: how an event becomes a NATS message and back.

One Encoder and one Decoder for the whole union are built once and reused: msgspec compiles the
schema on construction, and rebuilding it per message would cost more than the decode itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from events.schemas import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Event

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


def event_type(event: Event) -> str:
    return type(event).__name__


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


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
