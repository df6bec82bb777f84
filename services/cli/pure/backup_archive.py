"""The bytes a restore sends: a stream backup in the form JetStream's restore API reads.

``$JS.API.STREAM.RESTORE.<stream>`` takes a snapshot as nats-server 2.15 writes one: an S2 stream
(the framing of the ``klauspost/compress/s2`` package) around an archive that starts with
``NATSARC1``, then ``state.json`` (the stream's sequences), one ``consumers/<name>`` entry per
consumer (its settings and acknowledged floor), one entry per message (subject, JetStream
timestamp, sequence, header block and payload) and an entry of zeros that marks the end. The
server stores each message under its own sequence and timestamp, skips the sequences between, and
pads the stream to ``state.json``'s last sequence: that is how a restored LEASE stream continues
past every fencing token granted before (``backup_manifest.lease_last_seq``).

The S2 frames here are uncompressed chunks, which every S2 reader takes, so no compression
library is needed; each chunk carries the CRC-32C of its bytes, which the reader checks.

Pure: records in, bytes out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from services.cli.pure.backup_manifest import ConsumerEntry, Record

ARCHIVE_MAGIC = b"NATSARC1"
STREAM_IDENTIFIER = b"\xff\x06\x00\x00S2sTwO"
UNCOMPRESSED_CHUNK = 0x01
BLOCK = 1 << 20
"""Bytes per S2 chunk (its readers take up to 4 MiB)."""


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), the checksum of S2 and Snappy frames."""
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """The framing format's masked checksum (a CRC of data that holds CRCs is weak otherwise)."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def s2_chunk(block: bytes) -> bytes:
    """One uncompressed S2 chunk: type, 3-byte length, masked CRC, the bytes."""
    if len(block) > BLOCK:
        raise ValueError(f"an S2 chunk holds at most {BLOCK} bytes, not {len(block)}")
    size = (len(block) + 4).to_bytes(3, "little")
    return bytes([UNCOMPRESSED_CHUNK]) + size + masked_crc(block).to_bytes(4, "little") + block


def s2_stream(pieces: Iterable[bytes], block: int = BLOCK) -> Iterator[bytes]:
    """``pieces`` joined and framed as an S2 stream, a chunk at a time."""
    yield STREAM_IDENTIFIER
    pending = bytearray()
    for piece in pieces:
        pending += piece
        while len(pending) >= block:
            yield s2_chunk(bytes(pending[:block]))
            del pending[:block]
    if pending:
        yield s2_chunk(bytes(pending))


def uvarint(value: int) -> bytes:
    """Go's ``binary.PutUvarint``."""
    if value < 0:
        raise ValueError(f"{value} is negative")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value: int) -> bytes:
    """Go's ``binary.PutVarint`` (zig-zag)."""
    return uvarint(value << 1 if value >= 0 else (~value << 1) | 1)


def entry(name: str, timestamp: int, sequence: int, header: bytes, payload: bytes) -> bytes:
    """One archive entry: the name's length, timestamp, sequence, the header block's and the
    payload's lengths, the name, then the header block and the payload."""
    encoded = name.encode()
    return b"".join(
        (
            uvarint(len(encoded)),
            varint(timestamp),
            uvarint(sequence),
            uvarint(len(header)),
            uvarint(len(payload)),
            encoded,
            header,
            payload,
        )
    )


END_OF_ARCHIVE = entry("", 0, 0, b"", b"")


def state(
    *, first_seq: int, last_seq: int, messages: int, size: int, consumers: int
) -> dict[str, Any]:
    """``state.json``: the sequences the restored stream starts at and ends at (the server pads
    to ``last_seq``), its size for the account's limits, and how many consumer entries follow."""
    return {
        "messages": messages,
        "bytes": size,
        "first_seq": first_seq,
        "last_seq": last_seq,
        "consumer_count": consumers,
    }


def consumer_state(consumer: ConsumerEntry) -> dict[str, Any]:
    """A durable restored at its acknowledged floor with nothing in flight: whatever it had
    delivered but not seen acknowledged is delivered again (handlers are idempotent,
    docs/architecture.md "The consumer loop"), and nothing acknowledged is."""
    floor = {
        "consumer_seq": consumer.ack_floor_consumer_seq,
        "stream_seq": consumer.ack_floor_stream_seq,
    }
    return {"config": consumer.config, "state": {"delivered": floor, "ack_floor": floor}}


def archive(
    stream_state: dict[str, Any], consumers: Iterable[ConsumerEntry], records: Iterable[Record]
) -> Iterator[bytes]:
    """The archive's entries, in the order the server reads them."""
    yield ARCHIVE_MAGIC
    yield entry("state.json", 0, 0, b"", json.dumps(stream_state).encode())
    for consumer in consumers:
        body = json.dumps(consumer_state(consumer)).encode()
        yield entry(f"consumers/{consumer.name}", 0, 0, b"", body)
    for record in records:
        yield entry(record.subject, record.ts, record.seq, record.header, record.data)
    yield END_OF_ARCHIVE
