"""Rendezvous assignment of proxies to health replicas (the pure part of ``assign``)."""

from __future__ import annotations

import collections

from services.health.assign import owner

UIDS = [f"proxy-{i}" for i in range(2000)]


def test_no_members_no_owner() -> None:
    assert owner("p", []) is None


def test_owner_does_not_depend_on_member_order() -> None:
    for uid in UIDS[:200]:
        assert owner(uid, ["a", "b", "c"]) == owner(uid, ["c", "a", "b"])


def test_shares_are_balanced() -> None:
    counts = collections.Counter(owner(uid, ["a", "b", "c"]) for uid in UIDS)
    assert set(counts) == {"a", "b", "c"}
    assert all(500 < n < 830 for n in counts.values()), counts


def test_a_leaving_member_moves_only_its_own_share() -> None:
    before = {uid: owner(uid, ["a", "b", "c"]) for uid in UIDS}
    after = {uid: owner(uid, ["a", "c"]) for uid in UIDS}
    moved = {uid for uid in UIDS if before[uid] != after[uid]}
    assert moved == {uid for uid in UIDS if before[uid] == "b"}
