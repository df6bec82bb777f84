"""What a reader trusts of a full checkpoint (services.runtime.eventlog.pure.checkpoint): the
same views pack to the same bytes, and a head or payload that is garbage, oversized, or labelled
for another stream, fold or place raises ``Unusable`` (the reader then replays), never anything
else. Deltas and chains: tests/unit/test_checkpoint_deltas.py.
"""

from __future__ import annotations

import hashlib
import random
import typing
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from projections.lease import LeaseRecord, LeaseView, Outcome
from services.runtime.eventlog.pure import checkpoint as cp

AT = datetime(2026, 3, 1, 12, tzinfo=UTC)
TAG = cp.tag_of(3, LeaseView)
PACKER = cp.Packer(LeaseView)


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
    assert PACKER.pack(some) == PACKER.pack(dict(shuffled))


def test_a_packed_checkpoint_unpacks_to_equal_views_through_its_head() -> None:
    some = views(300)
    packed = PACKER.pack(some)
    head = cp.decode_head(cp.encode_head(head_for(packed)))
    assert cp.Unpacker(LeaseView).unpack(head, b"".join(packed.chunks())) == some


def full_views(n: int) -> dict[str, LeaseView]:
    """Views with every field of the lease types away from its default, and some at it."""
    out = {}
    for i in range(n):
        uid = f"p{i:05d}"
        ended = LeaseRecord(
            lease_id=f"e{i}",
            proxy_uid=uid,
            holder="crawler",
            client=f"client-{i}",
            acquired_at=AT,
            expires_at=AT + timedelta(minutes=5),
            ttl_seconds=300.0,
            requested_ttl_seconds=600.0,
            fencing_token=i + 1,
            selector={"pool": "a"},
            cooldown_seconds=-0.0 if i % 2 else 2.5,
            end="released",
            ended_at=AT + timedelta(seconds=i),
            outcomes=(Outcome(lease_id=f"e{i}", outcome="ok", at=AT, detail="d", target="t"),),
            seq=i + 7,
            renewed_at=AT,
            renewed_seq=i + 3,
            rotation_id="r",
            provider_id="i-1",
            switched_at=AT,
            reason="rotated",
        )
        bare = LeaseRecord(
            lease_id=f"b{i}",
            proxy_uid=uid,
            acquired_at=AT,
            expires_at=AT,
            ttl_seconds=0.0,
            fencing_token=0,
        )
        out[uid] = LeaseView(
            proxy_uid=uid,
            current=bare if i % 3 else None,
            recent=(ended, bare),
            outcomes=ended.outcomes,
            cooldown_until=AT,
            cooldown_client="c",
            cooldown_holder="h",
            granted=i,
            rejected=1,
            unusable=2,
            late=3,
            updated_at=AT,
            last_seq=i,
        )
    return out


@pytest.mark.parametrize("make", [views, full_views])
def test_full_checkpoints_leave_out_defaults_and_read_back_equal(make: Any) -> None:
    some = make(40)
    packed = PACKER.pack(some)
    raw = zlib.decompress(packed.data)
    plain = msgspec.msgpack.encode(dict(sorted(some.items())))
    assert len(raw) < len(plain)
    head = head_for(packed)
    back = cp.Unpacker(LeaseView).unpack(head, packed.data)
    assert back == some
    assert [type(v.current) for v in back.values()] == [type(v.current) for v in some.values()]


def test_a_default_is_not_written_and_a_value_is() -> None:
    raw = PACKER.encode(views(1))
    assert b"rotation_id" not in raw
    assert b"renewed_at" not in raw
    assert b"fencing_token" in raw
    assert b"selector" in raw
    assert b"reason" in PACKER.encode(full_views(1))


def test_a_payload_with_every_field_written_reads_the_same() -> None:
    """What the writers of D163 stored, which a bucket upgraded in place still holds."""
    some = full_views(30) | views(30)
    old = cp.compress(msgspec.msgpack.encode(dict(sorted(some.items()))), len(some))
    assert cp.Unpacker(LeaseView).unpack(head_for(old), old.data) == some


class Tagged(msgspec.Struct, frozen=True, tag=True):
    value: int = 0


class Flat(msgspec.Struct, frozen=True, array_like=True):
    value: int = 0


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    tagged: Tagged | None = None
    flat: tuple[Flat, ...] = ()
    named: dict[str, int] = msgspec.field(default_factory=dict)
    count: int = 0


def test_structs_not_encoded_as_plain_maps_are_kept_as_they_are() -> None:
    compact = cp.compact_type(Holder)
    assert compact is not Holder
    fields = {f.name: f.type for f in msgspec.structs.fields(compact)}
    assert Tagged in typing.get_args(fields["tagged"])
    assert typing.get_args(fields["flat"])[0] is Flat
    packer = cp.Packer(Holder)
    some = {"a": Holder(tagged=Tagged(3), flat=(Flat(1),), named={"x": 1}), "b": Holder()}
    packed = packer.pack(some)
    assert cp.Unpacker(Holder).unpack(head_for(packed), packed.data) == some
    assert zlib.decompress(packed.data) == msgspec.msgpack.encode(
        {"a": {"tagged": {"type": "Tagged", "value": 3}, "flat": [[1]], "named": {"x": 1}}, "b": {}}
    )


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
    head = head_for(PACKER.pack(views(3)), 100, **changes)
    with pytest.raises(cp.Unusable, match=why):
        cp.decode_head(cp.encode_head(head))


def test_a_label_must_fit_the_stream() -> None:
    head = head_for(PACKER.pack(views(3)), seq=100)

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
    packed = PACKER.pack(views(1))
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
    packed = PACKER.pack(some)
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
