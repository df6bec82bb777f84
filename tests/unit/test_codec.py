"""The envelope: round trips, unknown types, poison payloads, schema evolution, and the write
boundary: what the codec refuses to put into the immutable log."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from events import codec, subjects
from events.schemas import (
    EVENT_TYPES,
    MAX_COOLDOWN_SECONDS,
    MAX_LEASE_SECONDS,
    Event,
    HealthChanged,
    HealthCheck,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import NewEvent
from services.runtime.eventlog.memory import InMemoryEventStore


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


# ------------------------------------------------------------------ the write boundary

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _claim(**changes: Any) -> LeaseAcquired:
    values: dict[str, Any] = {"lease_id": "l1", "proxy_uid": "p1", "ttl_seconds": 60.0}
    values.update(changes)
    return LeaseAcquired(**values)


def _release(**changes: Any) -> LeaseReleased:
    return LeaseReleased(**{"lease_id": "l1", "proxy_uid": "p1", **changes})


def _report(**changes: Any) -> LeaseReported:
    return LeaseReported(**{"lease_id": "l1", "proxy_uid": "p1", "outcome": "success", **changes})


def _expired(**changes: Any) -> LeaseExpired:
    return LeaseExpired(**{"lease_id": "l1", "proxy_uid": "p1", **changes})


def _renewed(**changes: Any) -> LeaseRenewed:
    return LeaseRenewed(**{"lease_id": "l1", "proxy_uid": "p1", "ttl_seconds": 60.0, **changes})


NOT_FINITE = [math.inf, -math.inf, math.nan]
REFUSED: list[tuple[Event, str]] = [
    *((_renewed(ttl_seconds=v), "ttl_seconds") for v in NOT_FINITE),
    (_renewed(ttl_seconds=0), "ttl_seconds"),
    (_renewed(ttl_seconds=MAX_LEASE_SECONDS + 1), "ttl_seconds"),
    (_renewed(ttl_seconds="60"), "ttl_seconds"),
    (_renewed(requested_ttl_seconds=1e12), "requested_ttl_seconds"),
    (_renewed(lease_id=""), "lease_id"),
    (_renewed(proxy_uid=""), "proxy_uid"),
    (_renewed(deadline=datetime(2026, 1, 1)), "deadline"),
    *((_claim(ttl_seconds=v), "ttl_seconds") for v in NOT_FINITE),
    *((_claim(cooldown_seconds=v), "cooldown_seconds") for v in NOT_FINITE),
    *((_claim(requested_ttl_seconds=v), "requested_ttl_seconds") for v in NOT_FINITE),
    *((_release(cooldown_seconds=v), "cooldown_seconds") for v in NOT_FINITE),
    *((HealthChanged(healthy=True, latency_ms=v), "latency_ms") for v in NOT_FINITE),
    (_claim(ttl_seconds=0), "ttl_seconds"),
    (_claim(ttl_seconds=-1), "ttl_seconds"),
    (_claim(ttl_seconds=1e12), "ttl_seconds"),
    (_claim(ttl_seconds=MAX_LEASE_SECONDS + 1), "ttl_seconds"),
    (_claim(cooldown_seconds=-0.5), "cooldown_seconds"),
    (_claim(cooldown_seconds=MAX_COOLDOWN_SECONDS + 1), "cooldown_seconds"),
    (_claim(requested_ttl_seconds=-1), "requested_ttl_seconds"),
    (_claim(requested_ttl_seconds=1e12), "requested_ttl_seconds"),
    (_claim(fencing_token=-1), "fencing_token"),
    (_claim(lease_id=""), "lease_id"),
    (_claim(proxy_uid=""), "proxy_uid"),
    (_claim(deadline=datetime(2026, 1, 1)), "deadline"),  # naive: not comparable with the log's
    (_claim(ttl_seconds="60"), "ttl_seconds"),  # a Struct does not check types; the codec does
    (_release(cooldown_seconds=1e12), "cooldown_seconds"),
    (_release(cooldown_seconds=-1), "cooldown_seconds"),
    (_release(deadline=datetime(2026, 1, 1)), "deadline"),
    (_report(deadline=datetime(2026, 1, 1)), "deadline"),
    (_report(lease_id=""), "lease_id"),
    (_expired(lease_id=""), "lease_id"),
]


@pytest.mark.parametrize(("event", "field"), REFUSED)
def test_the_codec_refuses_what_no_reader_or_fold_could_use(event: Event, field: str) -> None:
    with pytest.raises(codec.InvalidEvent) as info:
        codec.encode(event)
    assert f"{type(event).__name__}" in str(info.value)
    assert field in str(info.value)
    assert isinstance(info.value, codec.CodecError)


def test_a_nested_infinity_is_refused_too() -> None:
    spec = ProxySpec(health_check=HealthCheck(interval_seconds=math.inf))
    with pytest.raises(codec.InvalidEvent, match="intervalSeconds"):
        codec.encode(ProxyDeclared(uid="u1", namespace="ns", name="p", spec=spec))


@pytest.mark.parametrize(
    "event",
    [
        _claim(ttl_seconds=MAX_LEASE_SECONDS, cooldown_seconds=MAX_COOLDOWN_SECONDS),
        _claim(ttl_seconds=0.001, requested_ttl_seconds=MAX_LEASE_SECONDS),
        _claim(ttl_seconds=300, fencing_token=7, deadline=NOW),
        _release(cooldown_seconds=0, deadline=NOW + timedelta(seconds=2.5)),
        _report(outcome="blocked", target="shop.example", deadline=NOW),
        _expired(),
    ],
)
def test_the_bounds_keep_every_lease_event_discovery_writes(event: Event) -> None:
    assert codec.decode(codec.encode(event)) == event


def test_an_event_without_a_deadline_is_written_and_read_as_before() -> None:
    """Schema evolution both ways: no ``deadline`` key when unset, and old payloads decode."""
    payload = msgspec.json.decode(codec.encode(_claim()))
    assert "deadline" not in payload
    old = b'{"type":"LeaseReleased","lease_id":"l1","proxy_uid":"p1","cooldown_seconds":5}'
    decoded = codec.decode(old)
    assert isinstance(decoded, LeaseReleased)
    assert decoded.deadline is msgspec.UNSET


def test_the_deadline_round_trips_in_utc() -> None:
    event = _claim(deadline=NOW + timedelta(seconds=2.5))
    assert msgspec.json.decode(codec.encode(event))["deadline"] == "2026-01-01T00:00:02.500000Z"
    assert codec.decode(codec.encode(event)) == event


def test_reading_stays_as_lenient_as_the_types() -> None:
    """Bounds are checked on the way out only: an old or foreign event with a value out of them
    still decodes, and the lease fold decides what it can use."""
    event = codec.decode(
        b'{"type":"LeaseAcquired","lease_id":"l1","proxy_uid":"p1","ttl_seconds":1e12}'
    )
    assert isinstance(event, LeaseAcquired)
    assert event.ttl_seconds == 1e12


async def test_no_store_can_write_a_refused_event() -> None:
    store = InMemoryEventStore()
    with pytest.raises(codec.InvalidEvent):
        await store.append(subjects.lease("p1"), [NewEvent(_claim(ttl_seconds=math.inf), "m1")])
    assert (await store.read(subjects.lease("p1"))).last_seq == 0
