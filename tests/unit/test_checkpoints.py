"""What a reader trusts of a full checkpoint (services.runtime.eventlog.pure.checkpoint): the
same views pack to the same bytes, and a head or payload that is garbage, oversized, or labelled
for another stream, fold or place raises ``Unusable`` (the reader then replays), never anything
else. Deltas and chains: tests/unit/test_checkpoint_deltas.py.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from projections.lease import LeaseRecord, LeaseView
from services.runtime.eventlog.pure import checkpoint as cp

AT = datetime(2026, 3, 1, 12, tzinfo=UTC)
TAG = cp.tag_of(3, LeaseView)


def views(n: int) -> dict[str, LeaseView]:
    out = {}
    for i in range(n):
        uid = f"p{i:05d}"
        record = LeaseRecord(
            lease_id=f"l{i}",
            proxy_uid=uid,
            holder="crawler",
            acquired_at=AT,
            expires_at=AT + timedelta(minutes=5),
            ttl_seconds=300.0,
            fencing_token=i + 1,
            selector={"pool": "a", "zone": str(i % 3)},
        )
        out[uid] = LeaseView(proxy_uid=uid, current=record, fencing_token=i + 1, granted=i)
    return out


def head_for(done: cp.Packed, seq: int = 100, **changes: object) -> cp.Head:
    packed = done
    head = cp.Head(
        format=cp.FORMAT,
        stream="LEASE",
        tag=TAG,
        seq=seq,
        subject="lease.p00001",
        time_us=cp.micros(AT),
        high_us=cp.micros(AT),
        origin=1,
        views=packed.views,
        raw=packed.raw,
        packed=len(packed.data),
        chunks=len(packed.chunks()),
        digest=packed.digest,
        entries=packed.views,
        full_packed=len(packed.data),
    )
    return msgspec.structs.replace(head, **changes)


def test_the_same_views_in_any_order_pack_to_the_same_bytes() -> None:
    some = views(50)
    shuffled = list(some.items())
    random.Random(4).shuffle(shuffled)
    assert cp.pack(some) == cp.pack(dict(shuffled))


def test_a_packed_checkpoint_unpacks_to_equal_views_through_its_head() -> None:
    some = views(300)
    packed = cp.pack(some)
    head = cp.decode_head(cp.encode_head(head_for(packed)))
    assert cp.Unpacker(LeaseView).unpack(head, b"".join(packed.chunks())) == some


def test_chunks_are_at_most_a_chunk_and_rejoin() -> None:
    data = bytes(random.Random(1).getrandbits(8) for _ in range(cp.CHUNK * 2 + 5))
    packed = cp.Packed(len(data), 0, data, "")
    chunks = packed.chunks()
    assert [len(c) for c in chunks] == [cp.CHUNK, cp.CHUNK, 5]
    assert b"".join(chunks) == data


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"", "does not decode"),
        (b"\xc1", "does not decode"),
        (b"x" * (cp.MAX_HEAD + 1), "bytes"),
        (msgspec.msgpack.encode({"format": 1}), "does not decode"),
    ],
)
def test_a_head_that_is_not_one_is_unusable(value: bytes, why: str) -> None:
    with pytest.raises(cp.Unusable, match=why):
        cp.decode_head(value)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"format": cp.FORMAT + 1}, "format"),
        ({"raw": cp.MAX_RAW + 1}, "out of bounds"),
        ({"packed": cp.MAX_PACKED + 1}, "out of bounds"),
        ({"packed": -1}, "out of bounds"),
        ({"chunks": 7}, "chunk count"),
        ({"views": -1}, "view count"),
        ({"digest": "abc"}, "digest"),
        ({"origin": 0}, "origin"),
        ({"origin": 101}, "origin"),
    ],
)
def test_a_head_out_of_bounds_is_unusable(changes: dict[str, object], why: str) -> None:
    head = head_for(cp.pack(views(3)), 100, **changes)
    with pytest.raises(cp.Unusable, match=why):
        cp.decode_head(cp.encode_head(head))


def test_a_label_must_fit_the_stream() -> None:
    head = head_for(cp.pack(views(3)), seq=100)

    def why(**kw: object) -> str:
        args: dict[str, object] = {
            "stream": "LEASE",
            "tag": TAG,
            "key_seq": 100,
            "last": 500,
        }
        return cp.fits(head, **{**args, **kw})  # type: ignore[arg-type]

    assert why() == ""
    assert "wanted PROXY" in why(stream="PROXY")
    assert "wanted" in why(tag=cp.tag_of(4, LeaseView))
    assert "under the key of 99" in why(key_seq=99)
    assert "beyond the stream's last" in why(last=99)


def test_the_nearest_usable_covers_nothing_after_the_instant_and_needs_later_events() -> None:
    packed = cp.pack(views(1))
    heads = [
        head_for(packed, seq=s, high_us=cp.micros(AT + timedelta(seconds=s)))
        for s in (100, 200, 300)
    ]
    at = cp.micros(AT + timedelta(seconds=250))
    assert [h.seq for h in cp.usable(heads, at_us=at, first=1, last=300)] == [200, 100]
    assert [h.seq for h in cp.usable(heads, at_us=at, first=150, last=300)] == [200]
    assert [h.seq for h in cp.usable(heads, at_us=None, first=1, last=250)] == [200, 100]
    assert cp.usable(heads, at_us=cp.micros(AT), first=1, last=300) == []
    exactly = cp.micros(AT + timedelta(seconds=300))
    assert cp.usable(heads, at_us=exactly, first=1, last=300)[0].seq == 300


def test_a_payload_that_does_not_match_its_head_is_unusable() -> None:
    some = views(20)
    packed = cp.pack(some)
    head = head_for(packed)
    unpack = cp.Unpacker(LeaseView).unpack
    with pytest.raises(cp.Unusable, match="bytes stored"):
        unpack(head, packed.data[:-1])
    flipped = bytes([packed.data[0] ^ 1]) + packed.data[1:]
    with pytest.raises(cp.Unusable, match="digest"):
        unpack(head, flipped)
    with pytest.raises(cp.Unusable, match="views, the head says"):
        unpack(msgspec.structs.replace(head, views=21), packed.data)


def _consistent(raw: bytes, views_count: int = 1) -> tuple[cp.Head, bytes]:
    """A head that matches ``raw`` compressed in every figure it can check before decoding."""
    data = zlib.compress(raw)
    packed = cp.Packed(len(raw), views_count, data, hashlib.sha256(data).hexdigest())
    return head_for(packed), data


def test_a_bomb_is_not_inflated_past_what_its_head_says() -> None:
    raw = b"\x00" * (8 * 1024 * 1024)
    head, data = _consistent(raw)
    lying = msgspec.structs.replace(head, raw=1000)
    with pytest.raises(cp.Unusable, match="is not 1000 bytes"):
        cp.Unpacker(LeaseView).unpack(lying, data)


@pytest.mark.parametrize(
    "raw",
    [
        msgspec.msgpack.encode({"p1": {"proxy_uid": 5}}),
        msgspec.msgpack.encode([1, 2, 3]),
        b"\xc1\xc1",
    ],
)
def test_views_that_do_not_decode_are_unusable(raw: bytes) -> None:
    head, data = _consistent(raw)
    with pytest.raises(cp.Unusable, match="do not decode"):
        cp.Unpacker(LeaseView).unpack(head, data)


def test_keys_name_their_sequence_and_only_heads_have_one() -> None:
    assert cp.seq_of_key(f"$KV.b.{cp.head_key(TAG, 42)}") == 42
    assert cp.seq_of_key(cp.head_key(TAG, 42)) == 42
    assert cp.seq_of_key(f"h.{TAG}.42") == -1
    assert cp.seq_of_key(f"h.{TAG}.abcdefghijkl") == -1
    digest = "ab" * 32
    assert cp.chunk_key(TAG, 7, digest, 2) == f"c.{TAG}.{7:012d}.{digest[:16]}.2"


def test_a_view_of_another_shape_has_another_tag() -> None:
    class Other(msgspec.Struct):
        proxy_uid: str

    assert cp.tag_of(3, LeaseView) != cp.tag_of(3, Other)
    assert cp.tag_of(3, LeaseView) != cp.tag_of(4, LeaseView)


def test_micros_are_exact() -> None:
    moment = datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC)
    assert cp.micros(moment) - cp.micros(moment - timedelta(microseconds=1)) == 1
    assert cp.EPOCH + timedelta(microseconds=cp.micros(moment)) == moment
