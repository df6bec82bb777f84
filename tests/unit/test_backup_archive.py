"""The bytes a restore sends to JetStream's restore API, without a server: CRC-32C, Go's
varints, the S2 framing and the archive (state, consumers, messages, end). That a real
nats-server takes them is tests/e2e/test_backup.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.cli.pure.backup_archive import (
    ARCHIVE_MAGIC,
    END_OF_ARCHIVE,
    STREAM_IDENTIFIER,
    archive,
    consumer_state,
    crc32c,
    entry,
    masked_crc,
    s2_stream,
    state,
    uvarint,
    varint,
)
from services.cli.pure.backup_manifest import ConsumerEntry, Record, encode_headers

CUT = 1_796_207_030_498_747_206


def a_record(seq: int) -> Record:
    return Record(seq, CUT - 1000, "lease.u1", encode_headers({"Nats-Msg-Id": "m-1"}), b"{}")


def test_crc32c_is_castagnolis() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert masked_crc(b"") == 0xA282EAD8


def test_varints_are_gos() -> None:
    assert uvarint(0) == b"\x00"
    assert uvarint(300) == b"\xac\x02"
    assert varint(1) == b"\x02"
    assert varint(-1) == b"\x01"
    assert varint(-2) == b"\x03"
    with pytest.raises(ValueError, match="negative"):
        uvarint(-1)


def unframe(data: bytes) -> bytes:
    """What an S2 reader makes of ``s2_stream``'s output, checking every chunk's CRC."""
    assert data.startswith(STREAM_IDENTIFIER)
    at, out = len(STREAM_IDENTIFIER), bytearray()
    while at < len(data):
        kind, size = data[at], int.from_bytes(data[at + 1 : at + 4], "little")
        crc, block = data[at + 4 : at + 8], data[at + 8 : at + 4 + size]
        assert kind == 1
        assert int.from_bytes(crc, "little") == masked_crc(block)
        out += block
        at += 4 + size
    return bytes(out)


@given(st.lists(st.binary(max_size=50), max_size=20), st.integers(min_value=1, max_value=64))
def test_s2_framing_gives_back_the_bytes(pieces: list[bytes], block: int) -> None:
    framed = b"".join(s2_stream(pieces, block=block))
    assert unframe(framed) == b"".join(pieces)


def test_an_archive_is_state_then_consumers_then_messages_then_the_end() -> None:
    consumer = ConsumerEntry(
        name="reconciler",
        config={"durable_name": "reconciler"},
        ack_floor_stream_seq=1,
        ack_floor_consumer_seq=1,
    )
    wanted = state(first_seq=1, last_seq=1_000_002, messages=2, size=160, consumers=1)
    records = [a_record(1), a_record(2)]
    data = b"".join(archive(wanted, [consumer], records))
    head = entry("state.json", 0, 0, b"", json.dumps(wanted).encode())
    assert data.startswith(ARCHIVE_MAGIC + head)
    assert data.endswith(
        entry("lease.u1", records[1].ts, 2, records[1].header, records[1].data) + END_OF_ARCHIVE
    )
    assert json.dumps(consumer_state(consumer)).encode() in data
    restored = consumer_state(consumer)["state"]
    assert restored["delivered"] == restored["ack_floor"] == {"consumer_seq": 1, "stream_seq": 1}
    assert END_OF_ARCHIVE == b"\x00" * 5
