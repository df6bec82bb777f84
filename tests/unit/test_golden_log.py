"""The golden logs (tests/golden): every message any version wrote still decodes to a current
type and folds into the same views. A change to an event or a fold that would break old logs
fails here; the fix is a step in events/upcasting.py, not a new expected file
(tests/golden/README.md)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

import msgspec
import pytest

from events import codec
from events.schemas import EVENT_TYPES, SCHEMA_VERSION
from events.subjects import LEASE_STREAM, PROXY_STREAM
from events.upcasting import UPCASTERS, Upcasters
from services.cli.log.reader import FoldCheck, decode_entry
from tests.golden import generate, logs
from tests.golden.logs import Message

DE_1 = "b2c79f38-2408-51b8-8186-1e3563609676"
US_1 = "963d327b-0950-5f32-8018-f99288baff33"


def every_message() -> list[tuple[str, Message]]:
    return [(path.name, m) for path in logs.log_paths() for m in logs.load(path)]


def expected(path: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def test_this_builds_schema_has_a_golden_log_with_every_event_type_it_writes() -> None:
    current = logs.load(logs.log_path(SCHEMA_VERSION))
    assert {m.headers[codec.HDR_EVENT_TYPE] for m in current} == set(EVENT_TYPES)
    assert logs.current_types(current) == set(EVENT_TYPES)
    assert {m.headers[codec.HDR_SCHEMA] for m in current} == {str(SCHEMA_VERSION)}


def test_every_golden_log_is_named_by_its_schema_and_holds_it() -> None:
    paths = logs.log_paths()
    assert paths, "no golden log"
    for path in paths:
        schema = path.stem.removeprefix("schema-")
        assert {m.headers.get(codec.HDR_SCHEMA) for m in logs.load(path)} == {schema}, path.name


def test_every_type_and_schema_in_the_golden_logs_decodes_to_a_current_type() -> None:
    """The registry checked against what versions wrote: each (type, schema) they stored comes
    out as the type's current Struct, and through the one reader with nothing skipped."""
    seen: set[tuple[str, str]] = set()
    for name, m in every_message():
        declared, schema = m.headers[codec.HDR_EVENT_TYPE], m.headers[codec.HDR_SCHEMA]
        seen.add((declared, schema))
        current = UPCASTERS.current_name(declared)
        assert current is not None, f"{name} seq {m.seq}: {declared} is unknown to this build"
        event = codec.decode(m.payload, m.headers)
        assert type(event) is EVENT_TYPES[current], (name, m.stream, m.seq)
        _, skip = m.read()
        assert skip is None, skip
    assert {declared for declared, _ in seen} >= set(EVENT_TYPES)


def test_every_golden_log_is_a_log_the_streams_could_hold() -> None:
    """Sequences run 1, 2, ... per stream, time never goes back, and each message's subject is
    the one its type's category puts it on."""
    for path in logs.log_paths():
        messages = logs.load(path)
        for stream in {m.stream for m in messages}:
            seqs = [m.seq for m in messages if m.stream == stream]
            assert seqs == list(range(1, len(seqs) + 1)), (path.name, stream)
        times = [m.time for m in messages]
        assert times == sorted(times)
        for m in messages:
            event = codec.decode(m.payload, m.headers)
            if m.stream == PROXY_STREAM:
                assert m.subject.endswith("." + event.category), (m.subject, event)
            if m.stream == LEASE_STREAM:
                assert event.category == "lease"


def test_the_golden_messages_decode_to_the_expected_events() -> None:
    want = expected(logs.EXPECTED_EVENTS)
    assert set(want) == {p.name for p in logs.log_paths()}
    for path in logs.log_paths():
        got = logs.decoded(logs.load(path))
        problems = list(logs.mismatches(want[path.name], got, path.name))
        assert not problems, "\n".join(problems[:20])


def test_the_golden_logs_fold_into_the_expected_views() -> None:
    want = expected(logs.EXPECTED_VIEWS)
    assert set(want) == {p.name for p in logs.log_paths()}
    for path in logs.log_paths():
        got = logs.views(logs.load(path))
        problems = list(logs.mismatches(want[path.name], got, path.name))
        assert not problems, "\n".join(problems[:20])


def test_the_golden_log_of_this_schema_tells_the_story_it_claims() -> None:
    """Not compared with a file the generator wrote: what the life in tests/golden/README.md
    must fold into, so a generator gone wrong cannot commit a log that proves nothing."""
    views = logs.views(logs.load(logs.log_path(SCHEMA_VERSION)))
    assert views["skipped"] == []
    de, us = views["proxies"][DE_1], views["proxies"][US_1]
    assert (de["namespace"], de["name"], de["phase"], de["healthy"]) == (
        "golden",
        "de-1",
        "Ready",
        True,
    )
    assert de["url"] == "http://127.0.0.1:20533"  # the replacement took over
    assert de["verdict"]["provider_id"] == de["provider_id"] != de["instance"]["provider_id"]
    assert de["instance"]["state"] == "Gone"  # the retired instance, deleted after the drain
    # The second rotation failed; the third, asked for its egress, is where the log ends.
    assert de["rotation"]["state"] == "requested"
    assert de["egress_replacements"] == 1
    found = de["egress"][-1]
    assert (found["ip"], found["country"], found["changed_from"]) == (
        "198.51.100.7",
        "US",
        "203.0.113.5",
    )
    assert (us["removed"], us["generation"], us["spec"]["placement"]["machineType"]) == (
        True,
        2,
        "e2-micro",
    )
    reconciler = views["reconciler"]
    assert reconciler[DE_1]["pending"] is None
    assert reconciler[DE_1]["replacement"] is None
    assert reconciler[DE_1]["retiring_id"] == ""
    assert reconciler[DE_1]["instance_id"] == de["provider_id"]
    assert reconciler[US_1]["removed"] is True
    lease = views["leases"][DE_1]
    assert (lease["granted"], lease["rejected"], lease["late"], lease["unusable"]) == (2, 0, 0, 0)
    assert [r["end"] for r in lease["recent"]] == ["released", "expired"]
    assert lease["recent"][0]["rotation_id"] != ""  # switched to the replacement
    assert lease["current"] is None
    assert (lease["reports"]["blocked"], lease["reports"]["success"]) == (1, 1)
    traffic = views["traffic"]["crawler-a"]
    hosts = {host: (t["requests"], t["bytes_down"]) for host, t in traffic["hosts"].items()}
    assert hosts == {"shop.example": (2, 5120 + 310), "cdn.example": (1, 40960)}
    assert traffic["proxies"][DE_1]["tunnels"] == 1
    assert (traffic["records"], traffic["unusable"]) == (1, 0)


def test_the_events_command_reads_every_golden_message_and_no_fold_refuses_one() -> None:
    for path in logs.log_paths():
        checks: dict[str, FoldCheck] = {}
        for m in logs.load(path):
            check = checks.setdefault(m.stream, FoldCheck(m.stream))
            entry = check.check(decode_entry(m.seq, m.time, m.subject, m.payload, m.headers))
            assert entry.event is not None, entry
            assert not entry.skipped, entry


def test_every_golden_message_reads_the_same_through_the_upcasting_path() -> None:
    """A registry one schema ahead reads every golden message as an old one (a JSON object,
    then ``msgspec.convert``): the same events as the one Decoder, so a step that changes
    nothing changes nothing."""
    ahead = Upcasters(current=SCHEMA_VERSION + 1)
    for _, m in every_message():
        assert codec.decode(m.payload, m.headers, upcasters=ahead) == codec.decode(
            m.payload, m.headers
        )


def renamed_field(m: Message) -> Message:
    """The message as a build would have stored it had ``HealthChanged.latency_ms`` been called
    ``latency`` (an incompatible change, stamped with the current schema)."""
    if m.headers[codec.HDR_EVENT_TYPE] != "HealthChanged":
        return m
    obj = msgspec.json.decode(m.payload)
    obj["latency"] = obj.pop("latency_ms")
    return Message(m.stream, m.seq, m.subject, m.time, m.headers, msgspec.json.encode(obj))


def test_a_changed_field_without_a_step_fails_the_golden_views() -> None:
    """What these tests are for: a field renamed without a step still decodes (the unknown one
    is ignored, the default fills in) and would go unnoticed anywhere else; the views differ."""
    want = expected(logs.EXPECTED_VIEWS)[logs.log_path(SCHEMA_VERSION).name]
    changed = [renamed_field(m) for m in logs.load(logs.log_path(SCHEMA_VERSION))]
    problems = list(logs.mismatches(want, logs.views(changed)))
    assert any("latency_ms" in p for p in problems), problems
    assert f"$.proxies.{DE_1}.latency_ms: expected 2.7, got None" in problems


@pytest.mark.parametrize(
    ("want", "got", "problem"),
    [
        ({"a": 1}, {"a": 1, "new": 2}, None),  # a key the build added: allowed
        ({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 2, "d": 3}]}}, None),
        ({"a": 1}, {"b": 1}, "$.a: missing"),
        ({"a": 1}, {"a": 2}, "$.a: expected 1, got 2"),
        ({"a": True}, {"a": 1}, "$.a: expected True, got 1"),
        ({"a": [1, 2]}, {"a": [1]}, "$.a: expected [1, 2]"),
        ({"a": {"b": 1}}, {"a": None}, "$.a: expected an object"),
        ({"a": 2.0}, {"a": 2}, None),
    ],
)
def test_the_comparison_allows_new_keys_and_nothing_else(
    want: dict[str, Any], got: dict[str, Any], problem: str | None
) -> None:
    found = list(logs.mismatches(want, got))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1
        assert found[0].startswith(problem), found


def test_the_generator_never_rewrites_a_golden_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It may only append: the story as this build tells it begins with the file (else a line
    that a version stored would have changed), and a story the file holds whole writes nothing."""
    path = logs.log_path(SCHEMA_VERSION)
    before = path.read_bytes()
    generate.main(["log"])
    assert "holds the whole story already" in capsys.readouterr().out
    assert path.read_bytes() == before

    told = generate.golden_log()
    assert told[3].payload != told[4].payload
    changed = dataclasses.replace(told[3], payload=told[4].payload)
    monkeypatch.setattr(generate, "golden_log", lambda: [*told[:3], changed, *told[4:]])
    with pytest.raises(SystemExit, match="never rewritten"):
        generate.main(["log"])
    assert path.read_bytes() == before


def test_a_field_added_since_keeps_the_stored_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A field added with its default makes the story write an old message longer; it reads
    back as the same event, so the stored line is kept, never rewritten."""
    path = logs.log_path(SCHEMA_VERSION)
    before = path.read_bytes()
    told = generate.golden_log()
    longer = json.loads(told[3].payload)
    longer["addedSince"] = None
    changed = dataclasses.replace(told[3], payload=json.dumps(longer).encode())
    monkeypatch.setattr(generate, "golden_log", lambda: [*told[:3], changed, *told[4:]])
    generate.main(["log"])
    assert "holds the whole story already" in capsys.readouterr().out
    assert path.read_bytes() == before


def test_a_golden_line_keeps_the_payload_bytes_and_the_time_exactly() -> None:
    for _, m in every_message()[:5]:
        again = Message.parse(m.line())
        assert again == m
        assert isinstance(again.time, datetime)
        assert again.time.tzinfo is not None
