"""The backup's own format and the restore's checks, without a server: stream file records, the
manifest, the checks each refused directory must fail, and ``restore --check``. The bytes a
restore sends are tests/unit/test_backup_archive.py; the round trip through a real nats-server is
tests/e2e/test_backup.py."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from services.cli.backup.streamio import differences_from
from services.cli.main import main
from services.cli.pure.backup_manifest import (
    END,
    FORMAT,
    FORMAT_VERSION,
    MAGIC,
    MANIFEST,
    RECORD,
    BackupDamaged,
    Manifest,
    Record,
    RecordReader,
    StreamCheck,
    StreamEntry,
    check_file,
    decode_manifest,
    encode_headers,
    encode_manifest,
    encode_record,
    format_ns,
    lease_last_seq,
    parse_rfc3339_ns,
    records_of,
    reply_timestamp_ns,
    stored_size,
    stream_file,
    subject_matches,
)
from services.runtime.eventlog.streams import STREAMS

CUT = 1_796_207_030_498_747_206
DECLARED = {spec.name: spec.subjects for spec in STREAMS}
HEADERS = {"Egress-Event-Type": "LeaseAcquired", "Nats-Msg-Id": "m-1"}


def a_record(seq: int, subject: str = "lease.u1", ts: int = CUT - 1000) -> Record:
    return Record(seq, ts, subject, encode_headers(HEADERS), b'{"lease_id":"l"}')


def content(records: list[Record]) -> bytes:
    return MAGIC + b"".join(encode_record(r) for r in records) + END


def an_entry(name: str, records: list[Record], **changes: object) -> StreamEntry:
    fields: dict[str, object] = {
        "name": name,
        "file": stream_file(name),
        "sha256": "0" * 64,
        "size": 0,
        "messages": len(records),
        "bytes": sum(stored_size(r) for r in records),
        "first_seq": records[0].seq if records else 0,
        "last_seq": records[-1].seq if records else 0,
        "observed_last_seq": records[-1].seq if records else 0,
        "config": {"name": name},
    }
    return StreamEntry(**(fields | changes))  # type: ignore[arg-type]


def a_manifest(streams: list[StreamEntry]) -> Manifest:
    return Manifest(
        format=FORMAT,
        version=FORMAT_VERSION,
        product_version="0.1.0",
        server_version="2.15.1",
        cut=format_ns(CUT),
        cut_ns=CUT,
        created="2026-12-02T10:23:50+00:00",
        seconds=0.1,
        streams=streams,
    )


def every_stream(**lease_changes: object) -> list[StreamEntry]:
    lease = [a_record(1), a_record(2)]
    return [
        an_entry(name, lease, **lease_changes) if name == "LEASE" else an_entry(name, [])
        for name in DECLARED
    ]


# -- stream file records ------------------------------------------------------------------------


@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=20),
)
def test_records_come_back_whole_however_the_bytes_are_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    records = [
        Record(
            i + 1,
            CUT - 10 + i,
            f"proxy.u{i}.declared",
            encode_headers(HEADERS) if i % 2 else b"",
            p,
        )
        for i, p in enumerate(payloads)
    ]
    data, pieces, at = content(records), [], 0
    for size in cuts * (len(content(records)) // sum(cuts) + 1):
        pieces.append(data[at : at + size])
        at += size
    assert list(records_of(pieces, "PROXY.events.gz")) == records


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (content([a_record(1)])[:-1], "truncated"),
        (MAGIC + encode_record(a_record(1)), "truncated"),
        (b"", "truncated"),
        (b"not a backup" + b"\0" * 40, "does not start as one"),
        (content([a_record(1)]) + encode_record(a_record(2)), "after its end record"),
        (MAGIC + END[:-1] + b"\x01", "without a sequence"),
        (MAGIC + RECORD.pack(1, CUT, 8, 2**31, 0), "impossible"),
        (MAGIC + RECORD.pack(1, CUT, 2, 0, 0) + b"\xff\xfe" + END, "not text"),
    ],
)
def test_a_damaged_stream_file_is_refused_naming_it(data: bytes, problem: str) -> None:
    with pytest.raises(BackupDamaged, match=problem) as refused:
        list(records_of([data], "LEASE.events.gz"))
    assert refused.value.file == "LEASE.events.gz"
    assert str(refused.value).startswith("LEASE.events.gz: ")


def test_a_record_longer_than_any_nats_message_is_refused_before_it_is_read() -> None:
    reader = RecordReader("GC.events.gz")
    with pytest.raises(BackupDamaged, match="impossible lengths"):
        reader.feed(MAGIC + RECORD.pack(1, CUT, 8, 0, 64 * 1024 * 1024 + 1))


def test_headers_are_written_as_nats_clients_write_them() -> None:
    assert encode_headers(None) == b""
    assert encode_headers({}) == b""
    assert encode_headers({"A": "1", "B-c": "x y"}) == b"NATS/1.0\r\nA: 1\r\nB-c: x y\r\n\r\n"


def test_stored_size_is_the_servers_count() -> None:
    # Measured on nats-server 2.15.1: five such messages made a stream of 400 bytes.
    record = Record(1, CUT, "lease.u0", encode_headers({"Nats-Msg-Id": "id0", "X": "y"}), b"m0")
    assert stored_size(record) == 80
    assert stored_size(Record(1, CUT, "gc.local", b"", b"{}")) == 22 + 8 + 2 + 8


# -- the manifest -------------------------------------------------------------------------------


def test_a_manifest_round_trips() -> None:
    manifest = a_manifest(every_stream())
    assert decode_manifest(encode_manifest(manifest), DECLARED) == manifest


def damaged_manifests() -> list[tuple[bytes, str]]:
    good = json.loads(encode_manifest(a_manifest(every_stream())))

    def edited(path: str, value: object) -> bytes:
        copy = json.loads(json.dumps(good))
        target, keys = copy, path.split("/")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = value
        return json.dumps(copy).encode()

    lease = next(i for i, s in enumerate(good["streams"]) if s["name"] == "LEASE")
    without_lease = dict(good, streams=[s for s in good["streams"] if s["name"] != "LEASE"])
    return [
        (b"{", "not a backup manifest"),
        (b"[]", "not a backup manifest"),
        (edited("format", "tarball"), "format 'tarball'"),
        (edited("version", 2), "format version 2"),
        (edited("surprise", 1), "unknown field `surprise`"),
        (edited(f"streams/{lease}/messages", "2"), r"\$.streams\[1\].messages"),
        (edited(f"streams/{lease}/messages", -1), "messages"),
        (edited(f"streams/{lease}/file", "../../etc/passwd"), "LEASE.events.gz"),
        (edited(f"streams/{lease}/sha256", "abc"), "sha256"),
        (edited(f"streams/{lease}/messages", 5), "5 messages do not fit sequences 1..2"),
        (edited(f"streams/{lease}/observed_last_seq", 1), "observed_last_seq"),
        # Restored, 2^63 - 1 plus the headroom wrapped; fencing tokens began again after a restart.
        (
            edited(f"streams/{lease}/observed_last_seq", 2**63 - 1),
            r"streams\[1\].observed_last_seq",
        ),
        (edited(f"streams/{lease}/observed_last_seq", 2 + 10**9), "past last_seq 2"),
        (edited(f"streams/{lease}/last_seq", 2**60), r"streams\[1\].last_seq"),
        (edited(f"streams/{lease}/name", "OTHER"), "holds streams"),
        (edited("cut", "yesterday"), "cut"),
        (json.dumps(without_lease).encode(), "holds streams"),
        (
            edited(
                f"streams/{lease}/consumers",
                [
                    {
                        "name": "c",
                        "config": {},
                        "ack_floor_stream_seq": 9,
                        "ack_floor_consumer_seq": 9,
                    }
                ],
            ),
            "acknowledged up to 9",
        ),
    ]


@pytest.mark.parametrize(("data", "problem"), damaged_manifests())
def test_a_damaged_manifest_is_refused_naming_the_field(data: bytes, problem: str) -> None:
    with pytest.raises(BackupDamaged, match=problem) as refused:
        decode_manifest(data, DECLARED)
    assert refused.value.file == MANIFEST


def test_a_stream_file_must_be_the_one_the_manifest_names() -> None:
    entry = an_entry("LEASE", [a_record(1)], size=10, sha256="a" * 64)
    check_file(entry, 10, "a" * 64)
    for size, sha in ((11, "a" * 64), (10, "b" * 64)):
        with pytest.raises(BackupDamaged, match="changed or damaged after the backup"):
            check_file(entry, size, sha)


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([a_record(2), a_record(1)], "sequence 1 comes after 2"),
        ([a_record(1), a_record(1)], "sequence 1 comes after 1"),
        ([a_record(1), a_record(7)], "outside the manifest's 1..2"),
        ([a_record(1), a_record(2, ts=CUT + 1)], "stamped after the backup's cut"),
        ([a_record(1), a_record(2, ts=0)], "stamped after the backup's cut"),
        ([a_record(1), a_record(2, subject="proxy.u1.declared")], "not one the stream takes"),
        ([a_record(1), a_record(2, subject="lease.u1.extra")], "not one the stream takes"),
        ([a_record(1)], "holds 1 messages up to sequence 1; the manifest says 2 up to 2"),
    ],
)
def test_records_are_checked_against_the_manifest(records: list[Record], problem: str) -> None:
    check = StreamCheck(an_entry("LEASE", [a_record(1), a_record(2)]), CUT, DECLARED["LEASE"])

    def read_all() -> None:
        for record in records:
            check.record(record)
        check.finish()

    with pytest.raises(BackupDamaged, match=problem):
        read_all()


def test_records_that_take_other_bytes_than_the_manifest_says_are_refused() -> None:
    records = [a_record(1), a_record(2)]
    check = StreamCheck(an_entry("LEASE", records, bytes=1), CUT, DECLARED["LEASE"])
    for record in records:
        check.record(record)
    with pytest.raises(BackupDamaged, match="take 2"):
        check.finish()


@pytest.mark.parametrize(
    ("subject", "pattern", "matches"),
    [
        ("proxy.u1.declared", "proxy.*.*", True),
        ("proxy.u1", "proxy.*.*", False),
        ("proxy.u1.a.b", "proxy.*.*", False),
        ("deadletter.executor", "deadletter.>", True),
        ("deadletter", "deadletter.>", False),
        ("deadletter.a.b", "deadletter.>", True),
        ("lease.*", "lease.*", False),
        ("lease..x", "lease.>", False),
        ("lease.a b", "lease.*", False),
        ("gc.local", "lease.*", False),
    ],
)
def test_subjects_match_as_nats_matches_them(subject: str, pattern: str, matches: bool) -> None:
    assert subject_matches(subject, pattern) is matches


def test_server_times_keep_their_nanoseconds() -> None:
    text = "2026-12-02T10:23:50.497408539Z"
    assert format_ns(parse_rfc3339_ns(text)) == text
    assert parse_rfc3339_ns("2026-12-02T11:23:50.5+01:00") == parse_rfc3339_ns(
        "2026-12-02T10:23:50.500000000Z"
    )
    assert parse_rfc3339_ns("1970-01-01T00:00:01Z") == 1_000_000_000
    with pytest.raises(ValueError, match="not an RFC 3339 time"):
        parse_rfc3339_ns("2026-12-02 10:23:50")


def test_a_deliverys_timestamp_is_read_from_its_reply_subject() -> None:
    v1 = "$JS.ACK.PROXY.DHAnb0P2F2C8okmpo0HUT4.1.1.1.1796208372085452556.1"
    v2 = "$JS.ACK._.ACCHASH.PROXY.c.1.5.5.1796208372085452557.0.token"
    assert reply_timestamp_ns(v1) == 1796208372085452556
    assert reply_timestamp_ns(v2) == 1796208372085452557
    with pytest.raises(ValueError, match="not a JetStream delivery"):
        reply_timestamp_ns("_INBOX.abc")


def test_lease_continues_past_everything_seen_plus_the_headroom() -> None:
    entry = an_entry("LEASE", [a_record(1), a_record(2)], observed_last_seq=40)
    assert lease_last_seq(entry, existing_last_seq=0, headroom=1000) == 1040
    assert lease_last_seq(entry, existing_last_seq=5000, headroom=1000) == 6000
    assert lease_last_seq(entry, existing_last_seq=0, headroom=0) == 40


# -- `restore --check`: the command's refusals, without a server ----------------------------------


def write_backup(directory: Path, records: list[Record]) -> None:
    streams = []
    for name in DECLARED:
        kept = records if name == "LEASE" else []
        data = gzip.compress(content(kept), mtime=0)
        (directory / stream_file(name)).write_bytes(data)
        streams.append(
            an_entry(name, kept, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        )
    (directory / MANIFEST).write_bytes(encode_manifest(a_manifest(streams)))


def check(directory: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["restore", str(directory), "--check"])
    return result.exit_code, result.output


def test_restore_check_accepts_a_whole_backup(tmp_path: Path) -> None:
    write_backup(tmp_path, [a_record(1), a_record(2)])
    code, output = check(tmp_path)
    assert code == 0, output
    assert "a complete backup" in " ".join(output.split())  # wrapped where the path is long


def test_restore_check_refuses_each_damage_naming_the_file(tmp_path: Path) -> None:
    write_backup(tmp_path, [a_record(1), a_record(2)])
    lease = tmp_path / stream_file("LEASE")
    whole = lease.read_bytes()

    lease.write_bytes(whole[:-9])
    code, output = check(tmp_path)
    assert code == 13
    assert "LEASE.events.gz:" in output

    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0xFF
    lease.write_bytes(bytes(flipped))
    code, output = check(tmp_path)
    assert code == 13
    assert "LEASE.events.gz" in output
    assert "nothing was restored" in output

    lease.unlink()
    code, output = check(tmp_path)
    assert code == 13
    assert "LEASE.events.gz: is missing from the backup" in output

    (tmp_path / MANIFEST).unlink()
    code, output = check(tmp_path)
    assert code == 13
    assert "manifest.json: is missing" in output


def test_a_tampered_file_with_a_matching_checksum_is_refused_by_its_content(
    tmp_path: Path,
) -> None:
    """Someone who rewrote a file and its checksum still cannot smuggle in a message the
    stream would never have taken."""
    write_backup(tmp_path, [a_record(1), a_record(2)])
    forged = gzip.compress(content([a_record(1), a_record(2, subject="proxy.u1.declared")]))
    (tmp_path / stream_file("LEASE")).write_bytes(forged)
    manifest = msgspec.json.decode((tmp_path / MANIFEST).read_bytes())
    for stream in manifest["streams"]:
        if stream["name"] == "LEASE":
            stream["size"], stream["sha256"] = len(forged), hashlib.sha256(forged).hexdigest()
    (tmp_path / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    code, output = check(tmp_path)
    assert code == 13
    assert "LEASE.events.gz: sequence 2: subject 'proxy.u1.declared'" in output


def test_settings_other_than_this_versions_are_named_when_restored() -> None:
    spec = next(s for s in STREAMS if s.name == "LEASE")
    config = spec.config(1).as_dict()
    assert differences_from(spec, an_entry("LEASE", [], config=config), 1) == []
    edited = an_entry("LEASE", [], config=config | {"max_age": 3_600_000_000_000})
    assert differences_from(spec, edited, 1) == ["max_age: 3600.0 -> 604800.0"]
