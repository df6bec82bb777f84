"""Reading old shapes, old names and hostile schema headers (events/upcasting.py, events/codec.py).

The registry the codec reads with is checked against the golden logs in
tests/unit/test_golden_log.py; here, registries of the tests' own show what a step, a rename
and a read-ahead do, and what every kind of ``Egress-Schema`` value is read as.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from events import codec
from events.reading import recorded
from events.schemas import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    HealthChanged,
    LeaseAcquired,
    ProxyDeclared,
    ProxySpec,
)
from events.skips import UNDECODABLE, UNKNOWN_TYPE
from events.store import Unreadable
from events.upcasting import UPCASTERS, Upcasters

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def json_bytes(obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode(obj)


def headers(event_type: str, schema: str | None) -> dict[str, str]:
    found = {"Egress-Event-Type": event_type, "Nats-Msg-Id": "m1"}
    if schema is not None:
        found["Egress-Schema"] = schema
    return found


# A made-up schema 0 of ``HealthChanged``: ``ok`` instead of ``healthy``, the latency in seconds
# as ``latency``, and the instance as ``instance``.
V0_HEALTH = {"type": "HealthChanged", "ok": False, "latency": 0.25, "instance": "px-1", "why": "x"}


def health_changed_0(obj: dict[str, Any]) -> dict[str, Any]:
    obj["healthy"] = obj.pop("ok")
    obj["latency_ms"] = obj.pop("latency") * 1000.0
    obj["provider_id"] = obj.pop("instance")
    obj["reason"] = obj.pop("why")
    return obj


WITH_V0 = Upcasters(current=1, oldest=0, steps={("HealthChanged", 0): health_changed_0})


def test_a_step_brings_an_old_shape_to_the_current_struct() -> None:
    event = codec.decode(json_bytes(V0_HEALTH), headers("HealthChanged", "0"), upcasters=WITH_V0)
    assert event == HealthChanged(healthy=False, latency_ms=250.0, provider_id="px-1", reason="x")


def test_without_its_step_an_old_shape_is_poison_not_a_wrong_event() -> None:
    """What the golden log guards against: a changed shape with no step for the old one."""
    without = Upcasters(current=1, oldest=0)
    with pytest.raises(codec.UndecodableEvent, match=r"HealthChanged of schema 0: .*healthy"):
        codec.decode(json_bytes(V0_HEALTH), headers("HealthChanged", "0"), upcasters=without)


def test_steps_chain_from_the_stored_schema_to_the_current_one() -> None:
    """Schema 0 -> 1 -> 2 -> 3: each step sees the shape the one before made."""
    seen: list[int] = []

    def step(version: int) -> Any:
        def move(obj: dict[str, Any]) -> dict[str, Any]:
            seen.append(version)
            obj["reason"] = obj.get("reason", "") + str(version)
            return obj

        return move

    chained = Upcasters(
        current=3,
        oldest=0,
        steps={
            ("HealthChanged", 0): health_changed_0,
            **{("HealthChanged", v): step(v) for v in (1, 2)},
        },
    )
    event = codec.decode(json_bytes(V0_HEALTH), headers("HealthChanged", "0"), upcasters=chained)
    assert event == HealthChanged(healthy=False, latency_ms=250.0, provider_id="px-1", reason="x12")
    assert seen == [1, 2]
    seen.clear()
    stored_at_2 = json_bytes({"type": "HealthChanged", "healthy": True, "reason": "r"})
    assert codec.decode(stored_at_2, headers("HealthChanged", "2"), upcasters=chained) == (
        HealthChanged(healthy=True, reason="r2")
    )
    assert seen == [2]


def test_a_type_without_a_step_for_a_schema_is_taken_as_unchanged_by_it() -> None:
    """A new schema changes some types; every other type's old payload decodes as it is, through
    the slow path (and into the same event the fast path makes)."""
    later = Upcasters(current=2, steps={("HealthChanged", 1): health_changed_0})
    event = ProxyDeclared(uid="u", namespace="n", name="p", spec=ProxySpec(provider="local"))
    stored = codec.envelope_headers(event, "m")
    assert stored["Egress-Schema"] == "1"
    assert codec.decode(codec.encode(event), stored, upcasters=later) == event


def test_a_renamed_type_is_read_under_its_new_name() -> None:
    renamed = Upcasters(current=1, renames={"HealthVerdict": "HealthChanged"})
    old = {"type": "HealthVerdict", "healthy": True, "latency_ms": 3.0}
    expected = HealthChanged(healthy=True, latency_ms=3.0)
    # The header names the old type too, or is missing, or names the new one: all read alike.
    for declared in ("HealthVerdict", None, "HealthChanged"):
        stored = {"Egress-Schema": "1"} | ({"Egress-Event-Type": declared} if declared else {})
        assert codec.decode(json_bytes(old), stored, upcasters=renamed) == expected
    # The codec's own registry renames nothing: the old name is a type it does not know.
    with pytest.raises(codec.UnknownEventType):
        codec.decode(json_bytes(old), headers("HealthVerdict", "1"))


def test_renames_chain_and_steps_use_the_current_name() -> None:
    registry = Upcasters(
        current=2,
        oldest=0,
        renames={"Verdict": "HealthVerdict", "HealthVerdict": "HealthChanged"},
        steps={("HealthChanged", 0): health_changed_0},
    )
    old = V0_HEALTH | {"type": "Verdict"}
    event = codec.decode(json_bytes(old), headers("Verdict", "0"), upcasters=registry)
    assert event == HealthChanged(healthy=False, latency_ms=250.0, provider_id="px-1", reason="x")


def test_a_read_ahead_step_reads_the_next_schema_one_release_early() -> None:
    """Readers before writers: a build that writes schema 1 but reads 2, with a step that turns
    schema 2's shape into its own (docs/operations.md, "Upgrades")."""

    def down(obj: dict[str, Any]) -> dict[str, Any]:
        obj["latency_ms"] = obj.pop("latency_seconds") * 1000.0
        return obj

    ahead = Upcasters(current=1, reads_up_to=2, steps={("HealthChanged", 2): down})
    newer = json_bytes({"type": "HealthChanged", "healthy": True, "latency_seconds": 0.5})
    assert codec.decode(newer, headers("HealthChanged", "2"), upcasters=ahead) == (
        HealthChanged(healthy=True, latency_ms=500.0)
    )
    with pytest.raises(codec.NewerSchema):
        codec.decode(newer, headers("HealthChanged", "2"))


def test_a_step_that_fails_on_a_hostile_payload_makes_it_poison() -> None:
    hostile = {"type": "HealthChanged", "ok": True, "latency": "slow", "instance": "i", "why": ""}
    with pytest.raises(codec.UndecodableEvent, match="its upcaster failed: TypeError"):
        codec.decode(json_bytes(hostile), headers("HealthChanged", "0"), upcasters=WITH_V0)
    with pytest.raises(codec.UndecodableEvent, match="its upcaster failed: KeyError"):
        codec.decode(b'{"type":"HealthChanged"}', headers("HealthChanged", "0"), upcasters=WITH_V0)

    def not_a_dict(obj: dict[str, Any]) -> Any:
        return ["not", "an", "object"]

    broken = Upcasters(current=1, oldest=0, steps={("HealthChanged", 0): not_a_dict})
    with pytest.raises(codec.UndecodableEvent):
        codec.decode(json_bytes(V0_HEALTH), headers("HealthChanged", "0"), upcasters=broken)


@pytest.mark.parametrize(
    "payload",
    [b"[1, 2]", b'"HealthChanged"', b"{}", b'{"type": 7}', b"{not json", b"", b"\xff\xfe"],
)
def test_the_slow_path_refuses_what_is_not_an_event(payload: bytes) -> None:
    with pytest.raises(codec.UndecodableEvent):
        codec.decode(payload, headers("HealthChanged", "0"), upcasters=WITH_V0)


def test_the_slow_path_reports_an_unknown_type_as_unknown() -> None:
    with pytest.raises(codec.UnknownEventType) as info:
        codec.decode(b'{"type":"Teleported"}', {"Egress-Schema": "0"}, upcasters=WITH_V0)
    assert info.value.event_type == "Teleported"


# ------------------------------------------------------------------------ the registry's checks


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        (
            {"current": 1, "steps": {("Teleported", 0): health_changed_0}, "oldest": 0},
            "unknown type",
        ),
        ({"current": 2, "steps": {("HealthChanged", 2): health_changed_0}}, "can never run"),
        ({"current": 2, "steps": {("HealthChanged", 0): health_changed_0}}, "can never run"),
        ({"current": 2, "steps": {("HealthChanged", 3): health_changed_0}}, "can never run"),
        ({"current": 1, "renames": {"HealthChanged": "PhaseChanged"}}, "is a current type"),
        ({"current": 1, "renames": {"Old": "Gone"}}, "leads to no current type"),
        ({"current": 1, "renames": {"A": "B", "B": "A"}}, "leads to no current type"),
        ({"current": 2, "oldest": 3}, "oldest <= current"),
        ({"current": 2, "reads_up_to": 1}, "oldest <= current"),
        (
            {
                "current": 2,
                "renames": {"Old": "HealthChanged"},
                "steps": {("Old", 1): health_changed_0},
            },
            "a renamed type's",
        ),
    ],
)
def test_a_registry_that_could_never_work_is_refused_when_built(
    kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        Upcasters(**kwargs)


def test_the_codecs_registry_is_consistent_and_current() -> None:
    assert UPCASTERS.problems() == []
    assert UPCASTERS.current == SCHEMA_VERSION
    assert UPCASTERS.newest >= SCHEMA_VERSION
    assert set(UPCASTERS.types) == set(EVENT_TYPES)


# ------------------------------------------------------------- hostile Egress-Schema headers

GOOD = HealthChanged(healthy=True, reason="ok", latency_ms=4.5)
PAYLOAD = codec.encode(GOOD)


@pytest.mark.parametrize(
    ("schema", "outcome"),
    [
        (None, GOOD),  # missing: the first schema, which is the current one in this build
        (str(SCHEMA_VERSION), GOOD),
        (f" {SCHEMA_VERSION} ", GOOD),  # surrounding blanks: still that number
        (f"0{SCHEMA_VERSION}", GOOD),  # a leading zero: still that number
        ("", codec.UndecodableEvent),
        ("abc", codec.UndecodableEvent),
        ("-1", codec.UndecodableEvent),
        ("+1", codec.UndecodableEvent),
        ("1.0", codec.UndecodableEvent),
        ("1e0", codec.UndecodableEvent),
        ("0x1", codec.UndecodableEvent),
        ("\u0661", codec.UndecodableEvent),  # ARABIC-INDIC DIGIT ONE: int() would take it
        ("１", codec.UndecodableEvent),  # FULLWIDTH DIGIT ONE  # noqa: RUF001 - on purpose
        ("1\x00", codec.UndecodableEvent),
        ("1 2", codec.UndecodableEvent),
        ("0", codec.UndecodableEvent),  # below the first schema
        ("-" + "9" * 5000, codec.UndecodableEvent),
        (str(SCHEMA_VERSION + 1), codec.NewerSchema),
        ("999999999", codec.NewerSchema),
        ("9" * 10, codec.NewerSchema),
        ("9" * 100_000, codec.NewerSchema),  # more digits than int() converts: never converted
    ],
)
def test_every_schema_header_has_one_defined_reading(
    schema: str | None, outcome: HealthChanged | type[codec.CodecError]
) -> None:
    stored = headers("HealthChanged", schema)
    if isinstance(outcome, HealthChanged):
        assert codec.decode(PAYLOAD, stored) == outcome
        return
    with pytest.raises(outcome) as info:
        codec.decode(PAYLOAD, stored)
    assert len(str(info.value)) < 300, "a hostile header is not echoed whole"


def test_a_newer_schema_is_skipped_as_an_unknown_type_and_named() -> None:
    item, skip = recorded("PROXY", 9, "proxy.u1.health", T0, PAYLOAD, headers("HealthChanged", "7"))
    assert skip is not None
    assert (skip.reason, skip.event_type) == (UNKNOWN_TYPE, "HealthChanged")
    assert "schema 7" in skip.detail
    assert isinstance(item.event, Unreadable)
    # Without a type header, the payload's tag names it.
    _, untyped = recorded("PROXY", 9, "proxy.u1.health", T0, PAYLOAD, {"Egress-Schema": "7"})
    assert untyped is not None
    assert untyped.event_type == "HealthChanged"


@pytest.mark.parametrize("schema", ["", "x", "-1", "0", "1.5"])
def test_a_malformed_schema_is_skipped_as_undecodable(schema: str) -> None:
    item, skip = recorded(
        "PROXY", 9, "proxy.u1.health", T0, PAYLOAD, headers("HealthChanged", schema)
    )
    assert skip is not None
    assert (skip.reason, skip.event_type) == (UNDECODABLE, "HealthChanged")
    assert "Egress-Schema" in skip.detail
    assert isinstance(item.event, Unreadable)


def test_an_unknown_type_is_unknown_whatever_its_schema_header() -> None:
    for schema in (None, "1", "abc", "99"):
        with pytest.raises(codec.UnknownEventType) as info:
            codec.decode(b'{"type":"Teleported"}', headers("Teleported", schema))
        assert info.value.event_type == "Teleported"


@pytest.mark.parametrize("schema", [None, "1", "0"])
def test_a_payload_nested_too_deeply_is_poison_not_a_crash(schema: str | None) -> None:
    """msgspec raises RecursionError on ~1000 nested arrays, even in a field no Struct has;
    before, it went through every reader (they catch only the codec's errors)."""
    deep = b'{"type":"HealthChanged","healthy":true,"x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    registry = WITH_V0 if schema == "0" else UPCASTERS
    with pytest.raises(codec.UndecodableEvent, match="nested too deeply"):
        codec.decode(deep, headers("HealthChanged", schema), upcasters=registry)
    _, skip = recorded("PROXY", 3, "proxy.u1.health", T0, deep, headers("HealthChanged", schema))
    assert skip is not None
    assert skip.reason == UNDECODABLE
    bare = b"[" * 5000 + b"]" * 5000
    with pytest.raises(codec.UndecodableEvent):
        codec.decode(bare, {} if schema is None else {"Egress-Schema": schema}, upcasters=registry)


def test_the_fast_path_and_the_slow_path_make_the_same_events() -> None:
    """A registry whose current schema is 2 reads this build's events (stamped 1) through the
    JSON object step and ``msgspec.convert``: it must make what the one Decoder makes."""
    slow = Upcasters(current=2)
    events = [
        GOOD,
        ProxyDeclared(
            uid="u",
            namespace="n",
            name="p",
            spec=ProxySpec(provider="local", attributes={"a": "b"}),
        ),
        LeaseAcquired(
            lease_id="l", proxy_uid="u", ttl_seconds=30, deadline=T0, selector={"a": "b"}
        ),
        LeaseAcquired(lease_id="l", proxy_uid="u", ttl_seconds=30),  # deadline left out
    ]
    for event in events:
        stored = codec.envelope_headers(event, "m")
        assert codec.decode(codec.encode(event), stored, upcasters=slow) == event
