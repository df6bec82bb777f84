"""The envelope: round trips, unknown types, poison payloads, schema evolution."""

from __future__ import annotations

import msgspec
import pytest

from events import codec
from events.schemas import (
    EVENT_TYPES,
    HealthChanged,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)


def test_round_trip_keeps_type_and_fields() -> None:
    event = ProxyDeclared(
        uid="u1", namespace="ns", name="p", spec=ProxySpec(provider="local", attributes={"a": "b"})
    )
    headers = codec.envelope_headers(event, "mid-1", "cause-1")
    decoded = codec.decode(codec.encode(event), headers)
    assert decoded == event
    assert headers["Egress-Event-Type"] == "ProxyDeclared"
    assert headers["Egress-Schema"] == "1"
    assert headers["Nats-Msg-Id"] == "mid-1"
    assert headers["Egress-Causation-Id"] == "cause-1"


def test_payload_is_readable_json_with_type_tag() -> None:
    payload = msgspec.json.decode(codec.encode(HealthChanged(healthy=False, reason="timeout")))
    assert payload["type"] == "HealthChanged"
    assert payload["healthy"] is False


def test_every_event_type_round_trips_with_its_category() -> None:
    for name, cls in EVENT_TYPES.items():
        assert cls.__name__ == name
        assert cls.category, f"{name} has no subject category"


def test_unknown_type_in_header_is_reported_as_unknown() -> None:
    with pytest.raises(codec.UnknownEventType) as info:
        codec.decode(b"{}", {"Egress-Event-Type": "Newer"})
    assert info.value.event_type == "Newer"


def test_unknown_tag_without_header_is_unknown_not_poison() -> None:
    with pytest.raises(codec.UnknownEventType):
        codec.decode(b'{"type":"Newer","x":1}')


def test_broken_payload_of_known_type_is_undecodable() -> None:
    with pytest.raises(codec.UndecodableEvent) as info:
        codec.decode(
            b'{"type":"HealthChanged","healthy":"yes"}', {"Egress-Event-Type": "HealthChanged"}
        )
    assert "HealthChanged" in str(info.value)
    with pytest.raises(codec.UndecodableEvent):
        codec.decode(b"not json at all")


def test_old_payload_without_new_fields_decodes_with_defaults() -> None:
    """Schema evolution: events written before a field existed still decode."""
    old = b'{"type":"PhaseChanged","phase":"Ready"}'
    event = codec.decode(old)
    assert event == PhaseChanged(phase=Phase.READY)


def test_fields_from_a_newer_writer_are_ignored() -> None:
    newer = b'{"type":"HealthChanged","healthy":true,"jitter_ms":3.5}'
    assert codec.decode(newer) == HealthChanged(healthy=True)


def test_spec_uses_the_custom_resource_field_names() -> None:
    spec = msgspec.json.decode(
        b'{"mode":"Managed","provider":"gcp-eu","placement":{"machineType":"e2-small"},'
        b'"healthCheck":{"intervalSeconds":2,"failureThreshold":5}}',
        type=ProxySpec,
    )
    assert spec.placement.machine_type == "e2-small"
    assert spec.health_check.interval_seconds == 2
    assert spec.health_check.failure_threshold == 5
    assert spec.health_check.timeout_seconds == 5.0
