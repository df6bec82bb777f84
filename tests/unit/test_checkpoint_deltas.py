"""Delta checkpoints (services.runtime.eventlog.pure.delta) and their chains: a delta applied to
its base gives exactly the views it was taken from, whatever changed; a delta, head or chain that
is hostile or does not fit the views raises ``Unusable`` and leaves the views as they were.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from projections.lease import HISTORY, LeaseRecord, LeaseView
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.eventlog.pure import delta

AT = datetime(2026, 3, 1, 12, tzinfo=UTC)
TAG = cp.tag_of(3, LeaseView)
DIFFER = delta.Differ(LeaseView)


def record(uid: str, n: int) -> LeaseRecord:
    return LeaseRecord(
        lease_id=f"{uid}-{n}",
        proxy_uid=uid,
        holder=f"crawler-{n % 5}",
        acquired_at=AT + timedelta(seconds=n),
        expires_at=AT + timedelta(seconds=n + 300),
        ttl_seconds=300.0,
        fencing_token=n + 1,
        selector={"pool": "a"},
    )


def step(rng: random.Random, views: dict[str, LeaseView], n: int) -> None:
    """One change a fold could make: a grant, an end (``recent`` shifts), a new or gone view."""
    uid = f"p{rng.randrange(30):03d}"
    view = views.get(uid)
    kind = rng.random()
    if view is None:
        views[uid] = LeaseView(proxy_uid=uid)
    elif kind < 0.05:
        del views[uid]
    elif view.current is None:
        current = record(uid, n)
        views[uid] = msgspec.structs.replace(
            view, current=current, fencing_token=n + 1, granted=view.granted + 1
        )
    else:
        recent = (*view.recent, view.current)[-HISTORY:]
        views[uid] = msgspec.structs.replace(
            view, current=None, recent=recent, cooldown_until=AT + timedelta(seconds=n)
        )


def roundtrip(changes: delta.Changes) -> tuple[cp.Head, delta.Changes]:
    """Through the bytes a reader gets, and the head that labels them."""
    packed = DIFFER.pack(changes)
    head = delta_head(packed, entries=len(changes))
    return head, DIFFER.unpack(head, packed.data)


def delta_head(packed: cp.Packed, **changes: object) -> cp.Head:
    head = cp.Head(
        format=cp.FORMAT,
        stream="LEASE",
        tag=TAG,
        seq=200,
        subject="lease.p001",
        time_us=cp.micros(AT),
        high_us=cp.micros(AT),
        origin=1,
        views=0,
        raw=packed.raw,
        packed=len(packed.data),
        chunks=len(packed.chunks()),
        digest=packed.digest,
        full=False,
        entries=packed.views,
        base_seq=100,
        base_digest="a" * 64,
        depth=1,
        chain_bytes=len(packed.data),
        full_packed=1000,
    )
    return msgspec.structs.replace(head, **changes)


@pytest.mark.parametrize("seed", range(8))
def test_a_chain_of_deltas_rebuilds_every_state_it_was_taken_from(seed: int) -> None:
    rng = random.Random(seed)
    writer: dict[str, LeaseView] = {}
    base: dict[str, LeaseView] = {}
    reader: dict[str, LeaseView] = {}
    for n in range(400):
        step(rng, writer, n)
        if n % 40 == 39:
            _head, changes = roundtrip(DIFFER.diff(base, writer))
            DIFFER.apply(reader, changes)
            assert reader == writer
            base = dict(writer)


def test_an_ended_lease_is_a_shift_not_the_whole_history() -> None:
    uid = "p001"
    old = LeaseView(
        proxy_uid=uid, current=record(uid, 99), recent=tuple(record(uid, i) for i in range(HISTORY))
    )
    new = msgspec.structs.replace(old, current=None, recent=(*old.recent, old.current)[-HISTORY:])
    changes = DIFFER.diff({uid: old}, {uid: new})
    entry = changes[uid]
    assert entry.whole is None
    assert msgspec.structs.asdict(entry.fields) | {"current": msgspec.UNSET} == dict.fromkeys(
        msgspec.structs.asdict(entry.fields), msgspec.UNSET
    )
    assert entry.shifts.recent[0] == 1
    assert len(entry.shifts.recent[1]) == 1
    assert len(msgspec.msgpack.encode(entry)) < len(msgspec.msgpack.encode(new)) / 5
    views = {uid: old}
    _head, decoded = roundtrip(changes)
    DIFFER.apply(views, decoded)
    assert views == {uid: new}


def test_an_unchanged_view_is_not_in_the_delta() -> None:
    view = LeaseView(proxy_uid="p1", granted=3)
    equal_copy = msgspec.structs.replace(view)
    assert DIFFER.diff({"p1": view}, {"p1": equal_copy}) == {}


def views_of(n: int) -> dict[str, LeaseView]:
    return {f"p{i}": LeaseView(proxy_uid=f"p{i}", granted=i) for i in range(n)}


NEW = LeaseView(proxy_uid="p1")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"zz": None}, "not there"),
        ({"zz": [None, {"granted": 7}, None]}, "not there"),
        ({"p0": None, "p9": [None, {"granted": 1}, None]}, "not there"),
        ({"p1": [NEW, None, None]}, "is there"),
        ({"p1": [NEW, {"granted": 1}, None]}, "is there or is patched"),
        ({"p1": [None, None, None]}, "changes nothing"),
        ({"p1": [None, {}, {}]}, "changes nothing"),
        ({"p1": [None, None, {"recent": [1, []]}]}, "drops 1 of 0"),
        ({"p1": [None, None, {"recent": [-1, []]}]}, "drops -1"),
        ({"p1": [None, {"recent": []}, {"recent": [0, []]}]}, "both set and shifted"),
        ({"p1": [None, {"nope": 7}, None]}, "do not decode"),
        ({"p1": [None, {"granted": "abc"}, None]}, "do not decode"),
        ({"p1": [None, None, {"granted": [0, []]}]}, "do not decode"),
        ({"p1": [None, None, {"recent": [0, [1, 2, 3]]}]}, "do not decode"),
        ({"p1": [None, {"granted": 1}, None, "extra"]}, "do not decode"),
        ({"p0": None, "p2": [None, {"nope": 1}, None]}, "do not decode"),
        ({"p1": 5}, "do not decode"),
        ([1, 2], "do not decode"),
    ],
)
def test_a_change_that_does_not_fit_the_views_is_unusable_and_changes_nothing(
    changes: object, why: str
) -> None:
    views = views_of(3)
    with pytest.raises(cp.Unusable, match=why):
        DIFFER.apply(views, DIFFER.decode(msgspec.msgpack.encode(changes)))
    assert views == views_of(3)


@pytest.mark.parametrize(
    ("changes", "expect"),
    [
        ({"p1": [None, {"granted": 9}, None]}, 2),
        ({"p0": None}, 3),
        ({"p7": [NEW, None, None]}, 3),
    ],
)
def test_a_delta_that_leaves_another_number_of_views_than_its_head_changes_nothing(
    changes: object, expect: int
) -> None:
    """Checked before anything is folded in: a reader then folds events from the point before
    the delta onto the views as they were there."""
    views = views_of(3)
    with pytest.raises(cp.Unusable, match=f"views after the delta, the head says {expect}"):
        DIFFER.apply(views, DIFFER.decode(msgspec.msgpack.encode(changes)), expect=expect)
    assert views == views_of(3)


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x81\xa2p1"])
def test_bytes_that_are_not_changes_are_unusable(raw: bytes) -> None:
    packed = cp.compress(raw, 1)
    with pytest.raises(cp.Unusable, match="do not decode"):
        DIFFER.unpack(delta_head(packed), packed.data)


def test_a_delta_payload_checks_its_head() -> None:
    packed = DIFFER.pack({"p1": None, "p2": None})
    head = delta_head(packed)
    assert DIFFER.unpack(head, packed.data) == {"p1": None, "p2": None}
    with pytest.raises(cp.Unusable, match="2 changes, the head says 3"):
        DIFFER.unpack(msgspec.structs.replace(head, entries=3), packed.data)
    with pytest.raises(cp.Unusable, match="digest"):
        DIFFER.unpack(head, bytes([packed.data[0] ^ 1]) + packed.data[1:])
    with pytest.raises(cp.Unusable, match="not a delta"):
        DIFFER.unpack(msgspec.structs.replace(head, full=True), packed.data)
    with pytest.raises(cp.Unusable, match="not a full checkpoint"):
        cp.Unpacker(LeaseView).unpack(head, packed.data)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"base_seq": 200}, "not before it"),
        ({"base_seq": 0}, "not before it"),
        ({"base_digest": "short"}, "not before it"),
        ({"depth": 0}, "deep"),
        ({"depth": cp.MAX_CHAIN + 1}, "deep"),
        ({"chain_bytes": -1}, "deep"),
        ({"entries": -1}, "entries"),
        ({"full_packed": cp.MAX_PACKED + 1}, "full checkpoint of"),
        ({"full": True}, "entries|names a base"),
    ],
)
def test_a_delta_head_out_of_bounds_is_unusable(changes: dict[str, object], why: str) -> None:
    head = delta_head(DIFFER.pack({"p1": None}), **changes)
    with pytest.raises(cp.Unusable, match=why):
        cp.decode_head(cp.encode_head(head))


def link(seq: int, base: cp.Head | None, digest: str) -> cp.Head:
    packed = DIFFER.pack({})
    if base is None:
        return msgspec.structs.replace(
            delta_head(packed, seq=seq, digest=digest),
            full=True,
            base_seq=0,
            base_digest="",
            depth=0,
            chain_bytes=0,
        )
    return delta_head(
        packed, seq=seq, digest=digest, base_seq=base.seq, base_digest=base.digest,
        depth=base.depth + 1,
    )  # fmt: skip


def test_a_chain_is_followed_link_by_link_to_its_full_one() -> None:
    full = link(100, None, "1" * 64)
    one = link(200, full, "2" * 64)
    two = link(300, one, "3" * 64)
    by_seq = {h.seq: h for h in (full, one, two)}
    assert cp.chain(two, by_seq) == [full, one, two]
    assert cp.chain(full, by_seq) == [full]
    assert cp.chain(two, {300: two, 100: full}) == []  # a link gone
    other = msgspec.structs.replace(one, digest="9" * 64)
    assert cp.chain(two, {**by_seq, 200: other}) == []  # other bytes under its sequence
    deeper = msgspec.structs.replace(one, depth=2)
    assert cp.chain(two, {**by_seq, 200: deeper}) == []  # a depth that does not follow


def test_a_full_one_is_due_once_the_deltas_reach_their_share_of_it() -> None:
    full = msgspec.structs.replace(link(100, None, "1" * 64), full_packed=1000)
    assert cp.full_due(None, 1)
    limit = int(cp.FULL_RATIO * 1000)
    assert not cp.full_due(full, limit)
    assert cp.full_due(full, limit + 1)
    deep = msgspec.structs.replace(
        link(200, full, "2" * 64), chain_bytes=limit - 10, full_packed=1000
    )
    assert not cp.full_due(deep, 10)
    assert cp.full_due(deep, 11)
    assert cp.full_due(msgspec.structs.replace(deep, depth=cp.MAX_CHAIN, chain_bytes=0), 1)
