"""What a backup directory holds, and the checks a restore makes before it touches a server.

A backup (docs/operations.md, "Backup and restore") is one file per stream, ``<STREAM>.events.gz``,
and ``manifest.json``, written last. A stream file is gzip over ``MAGIC``, one record per stored
message (``RECORD``: sequence, JetStream timestamp in nanoseconds, the lengths of subject, header
block and payload, then those bytes) and an end record of zeros. The manifest names every file
with its SHA-256 and size, and every stream with its sequences, its settings and the durable
consumers' acknowledged floors, all as of one instant: the cut.

Nothing here trusts the directory. A restore reads every file through these checks before it
sends a byte, and a directory that fails one (a truncated, corrupt or altered file, a manifest a
hand edited) is refused by ``BackupDamaged`` naming the file and what is wrong with it.

Pure: bytes in, values out; the commands (``services.cli.backup.backup_cmd``) do the I/O.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from msgspec import Meta

FORMAT = "egress-proxies-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SUFFIX = ".events.gz"
MAGIC = b"egress-proxies stream backup 1\n"
RECORD = struct.Struct(">QqHII")
"""Sequence, timestamp (ns since the epoch), subject, header and payload lengths."""
END = RECORD.pack(0, 0, 0, 0, 0)
MAX_MESSAGE = 64 * 1024 * 1024
"""No NATS message is larger (the server's largest ``max_payload``): a length beyond it is
damage, refused before anything is allocated for it."""
MAX_SEQ = 2**53
"""JetStream counts in 64 bits, but no log comes near 2^53 (a million events a second for 285
years), the largest integer every JSON reader keeps exact. A manifest's sequence beyond it is
forged: restored, ``2^63 - 1`` plus the headroom wrapped, and fencing tokens started again from
1,000,000 after a restart (docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md)."""
MAX_OBSERVED_AHEAD = 100_000_000
"""How far past the cut a backup may have seen a stream while it read it: the events appended
during the backup. Far more than any backup meets; a gap beyond it is not a backup's, and each
sequence a restore skips costs the server about 40 ns at every start (D102)."""
MAX_NS = 2**63 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
_Ns = Annotated[int, Meta(ge=0, le=MAX_NS)]
_Count = Annotated[int, Meta(ge=0)]
_Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
_Sha = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]


class BackupDamaged(ValueError):
    """A backup that cannot be restored as it is: ``file`` is the one at fault (relative to the
    backup directory), and the message says what is wrong with it."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file


class ConsumerEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A service's durable consumer at the cut: its settings as the server gave them, and the
    floor below which every message had been acknowledged (after its handler's appends)."""

    name: _Name
    config: dict[str, Any]
    ack_floor_stream_seq: _Seq
    ack_floor_consumer_seq: _Seq


class StreamEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: _Name
    file: str
    sha256: _Sha
    size: _Count
    """Bytes of the file (compressed)."""
    messages: _Count
    bytes: _Count
    """What the messages take on the server (its own formula, ``stored_size``)."""
    first_seq: _Seq
    last_seq: _Seq
    """The stream's last sequence at the cut: the restored stream continues after it."""
    observed_last_seq: _Seq
    """The stream's last sequence when the backup read it, the cut's or later."""
    config: dict[str, Any]
    consumers: list[ConsumerEntry] = msgspec.field(default_factory=list)


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    version: int
    product_version: str
    server_version: str
    cut: str
    """The instant the backup is the log as of (RFC 3339, the server's clock, nanoseconds)."""
    cut_ns: _Ns
    created: str
    seconds: Annotated[float, Meta(ge=0)]
    streams: list[StreamEntry]
    left_out: dict[str, str] = msgspec.field(default_factory=dict)
    """Buckets not in the backup, and why (caches rebuilt from the log, live membership)."""

    def stream(self, name: str) -> StreamEntry | None:
        return next((entry for entry in self.streams if entry.name == name), None)


def stream_file(stream: str) -> str:
    return f"{stream}{SUFFIX}"


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def decode_manifest(data: bytes, declared: Mapping[str, Sequence[str]]) -> Manifest:
    """The manifest, if it is one this build can restore: every declared stream present once,
    each under its own file name, its numbers consistent. ``declared``: stream -> subjects."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise BackupDamaged(MANIFEST, f"not a backup manifest ({exc})") from None
    if manifest.format != FORMAT:
        raise BackupDamaged(MANIFEST, f"format {manifest.format!r} is not {FORMAT!r}")
    if manifest.version != FORMAT_VERSION:
        raise BackupDamaged(
            MANIFEST,
            f"format version {manifest.version}: this build restores version {FORMAT_VERSION}; "
            "restore it with the egress-proxies version that wrote it "
            f"({manifest.product_version})",
        )
    names = [entry.name for entry in manifest.streams]
    if sorted(names) != sorted(declared):
        raise BackupDamaged(
            MANIFEST, f"holds streams {sorted(names)}, this build has {sorted(declared)}"
        )
    try:
        parse_rfc3339_ns(manifest.cut)
    except ValueError as exc:
        raise BackupDamaged(MANIFEST, f"cut: {exc}") from None
    for entry in manifest.streams:
        _check_entry(entry)
    return manifest


def _check_entry(entry: StreamEntry) -> None:
    where = f"streams[{entry.name}]"
    if entry.file != stream_file(entry.name):
        # Never a path the manifest chooses: a restore opens nothing outside the directory.
        raise BackupDamaged(
            MANIFEST, f"{where}.file is {entry.file!r}, not {stream_file(entry.name)!r}"
        )
    if entry.messages:
        fits = 1 <= entry.first_seq <= entry.last_seq
        fits = fits and entry.messages <= entry.last_seq - entry.first_seq + 1
    else:
        fits = entry.first_seq <= entry.last_seq + 1
    if not fits:
        raise BackupDamaged(
            MANIFEST,
            f"{where}: {entry.messages} messages do not fit sequences "
            f"{entry.first_seq}..{entry.last_seq}",
        )
    if entry.observed_last_seq < entry.last_seq:
        raise BackupDamaged(MANIFEST, f"{where}: observed_last_seq is below last_seq")
    if entry.observed_last_seq - entry.last_seq > MAX_OBSERVED_AHEAD:
        raise BackupDamaged(
            MANIFEST,
            f"{where}: observed_last_seq {entry.observed_last_seq} is "
            f"{entry.observed_last_seq - entry.last_seq:,} past last_seq {entry.last_seq}; a "
            f"backup sees at most {MAX_OBSERVED_AHEAD:,} events appended while it reads: the "
            "manifest was edited",
        )
    for consumer in entry.consumers:
        if consumer.ack_floor_stream_seq > entry.last_seq:
            raise BackupDamaged(
                MANIFEST,
                f"{where}.consumers[{consumer.name}]: acknowledged up to "
                f"{consumer.ack_floor_stream_seq}, after the stream's last sequence",
            )


@dataclass(frozen=True, slots=True)
class Record:
    """One stored message, exactly as a restore hands it back to the server."""

    seq: int
    ts: int
    subject: str
    header: bytes
    data: bytes


def encode_record(record: Record) -> bytes:
    subject = record.subject.encode()
    head = RECORD.pack(record.seq, record.ts, len(subject), len(record.header), len(record.data))
    return head + subject + record.header + record.data


def encode_headers(headers: Mapping[str, str] | None) -> bytes:
    """A header block as NATS clients write it (``NATS/1.0``, ``Key: value`` lines): the bytes
    the services' client wrote for every event, from the mapping a client reads back."""
    if not headers:
        return b""
    lines = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
    return b"NATS/1.0\r\n" + lines.encode() + b"\r\n"


def stored_size(record: Record) -> int:
    """What the server counts for the message in a stream's ``bytes`` (its file store's
    formula), so a restored stream's size can be compared with the backup's."""
    size = 22 + len(record.subject.encode()) + len(record.data) + 8
    return size + (4 + len(record.header) if record.header else 0)


class RecordReader:
    """Records from a stream file's decompressed bytes, fed in pieces of any size."""

    def __init__(self, file: str) -> None:
        self.file = file
        self._buffer = bytearray()
        self._magic = False
        self.ended = False

    def feed(self, chunk: bytes) -> list[Record]:
        self._buffer += chunk
        found: list[Record] = []
        if not self._magic:
            if len(self._buffer) < len(MAGIC):
                return found
            if bytes(self._buffer[: len(MAGIC)]) != MAGIC:
                raise BackupDamaged(self.file, "not a stream backup (it does not start as one)")
            del self._buffer[: len(MAGIC)]
            self._magic = True
        while len(self._buffer) >= RECORD.size:
            if self.ended:
                raise BackupDamaged(self.file, "holds data after its end record")
            seq, ts, slen, hlen, dlen = RECORD.unpack_from(self._buffer)
            if seq == 0:
                if (ts, slen, hlen, dlen) != (0, 0, 0, 0):
                    raise BackupDamaged(self.file, "a record without a sequence")
                del self._buffer[: RECORD.size]
                self.ended = True
                continue
            if hlen + dlen > MAX_MESSAGE or slen == 0:
                raise BackupDamaged(self.file, f"sequence {seq}: impossible lengths")
            total = RECORD.size + slen + hlen + dlen
            if len(self._buffer) < total:
                break
            view = bytes(self._buffer[RECORD.size : total])
            try:
                subject = view[:slen].decode()
            except UnicodeDecodeError:
                raise BackupDamaged(self.file, f"sequence {seq}: subject is not text") from None
            found.append(Record(seq, ts, subject, view[slen : slen + hlen], view[slen + hlen :]))
            del self._buffer[:total]
        return found

    def close(self) -> None:
        if not self._magic or not self.ended or self._buffer:
            raise BackupDamaged(
                self.file, "ends before its end record: the file is truncated or was cut short"
            )


def check_file(entry: StreamEntry, size: int, sha256: str) -> None:
    """A stream file is the one the backup wrote: its size and SHA-256 are the manifest's."""
    if size != entry.size or sha256 != entry.sha256:
        raise BackupDamaged(
            entry.file,
            f"{size} bytes with SHA-256 {sha256[:12]}…, the manifest says {entry.size} bytes "
            f"with {entry.sha256[:12]}…: the file was changed or damaged after the backup",
        )


@dataclass(slots=True)
class StreamCheck:
    """Every record of one stream file against its manifest entry: sequences rising within the
    entry's range, no message after the cut, subjects the stream takes; then the totals."""

    entry: StreamEntry
    cut_ns: int
    subjects: Sequence[str]
    messages: int = 0
    bytes: int = 0
    last: int = 0
    first_ts: int = 0

    def record(self, record: Record) -> None:
        file, seq = self.entry.file, record.seq
        if seq <= self.last:
            raise BackupDamaged(file, f"sequence {seq} comes after {self.last}: out of order")
        if not self.entry.first_seq <= seq <= self.entry.last_seq:
            raise BackupDamaged(
                file,
                f"sequence {seq} is outside the manifest's "
                f"{self.entry.first_seq}..{self.entry.last_seq}",
            )
        if not 0 < record.ts <= self.cut_ns:
            raise BackupDamaged(file, f"sequence {seq} is stamped after the backup's cut")
        if not any(subject_matches(record.subject, p) for p in self.subjects):
            raise BackupDamaged(
                file, f"sequence {seq}: subject {record.subject!r} is not one the stream takes"
            )
        self.first_ts = self.first_ts or record.ts
        self.last = seq
        self.messages += 1
        self.bytes += stored_size(record)

    def finish(self) -> None:
        entry = self.entry
        if self.messages != entry.messages or (entry.messages and self.last != entry.last_seq):
            raise BackupDamaged(
                entry.file,
                f"holds {self.messages} messages up to sequence {self.last}; the manifest says "
                f"{entry.messages} up to {entry.last_seq}",
            )
        if self.bytes != entry.bytes:
            raise BackupDamaged(
                entry.file, f"its messages take {self.bytes} bytes, the manifest says {entry.bytes}"
            )


def subject_matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` one or more at the end."""
    tokens, wanted = subject.split("."), pattern.split(".")
    if any(not token or re.search(r"[\s*>]", token) for token in tokens):
        return False
    for i, want in enumerate(wanted):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def records_of(chunks: Iterable[bytes], file: str) -> Iterable[Record]:
    """Every record of a stream file's decompressed bytes, checked for a complete file."""
    reader = RecordReader(file)
    for chunk in chunks:
        yield from reader.feed(chunk)
    reader.close()


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)\Z")


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of a server time (``2026-12-02T10:23:50.531628914Z``);
    ``datetime`` alone would drop the last three digits."""
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    whole, fraction, zone = match.groups()
    seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


def format_ns(ns: int) -> str:
    instant = EPOCH + timedelta(seconds=ns // 1_000_000_000)
    whole = instant.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{ns % 1_000_000_000:09d}Z"


def reply_timestamp_ns(reply: str) -> int:
    """The exact JetStream timestamp of a delivered message, from its reply subject (the
    client library's own reading goes through a float and loses the nanoseconds)."""
    tokens = reply.split(".")
    if tokens[:2] != ["$JS", "ACK"] or len(tokens) < 9:
        raise ValueError(f"{reply!r} is not a JetStream delivery")
    return int(tokens[7] if len(tokens) == 9 else tokens[9])


def lease_last_seq(entry: StreamEntry, existing_last_seq: int, headroom: int) -> int:
    """Where the restored LEASE stream's sequence stands, so the next grant's fencing token (its
    stream sequence, docs/decisions/0080-fencing-tokens-are-the-grant-s.md) is above every token
    granted before the restore: the backup saw the stream up to ``observed_last_seq``; the system
    may have granted up to ``headroom`` more before it was lost; a stream the restore replaces
    had ``existing_last_seq``."""
    return max(entry.last_seq, entry.observed_last_seq, existing_last_seq) + headroom
