"""The change index and the heap of due times (``services.discovery.pure.changes``): what a
reader of discovery's views asks to do work in proportion to the changes, not the fleet."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from services.discovery.pure.changes import ChangeIndex, DueTimes

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_reader_gets_each_uid_changed_since_its_version_once() -> None:
    index = ChangeIndex()
    assert index.since(0) == []
    for uid in ("a", "b", "c"):
        index.touch(uid)
    seen = index.version
    assert seen == 3
    index.touch("b")
    index.touch("b")  # changed twice: named once, at its newest version
    index.touch("d")
    assert index.since(seen) == ["d", "b"]
    assert index.since(0) == ["d", "b", "c", "a"]
    assert index.since(index.version) == []
    assert index.version_of("b") == 5
    assert index.version_of("nobody") is None
    assert len(index) == 4


def test_a_uid_removed_and_added_again_is_a_change_each_time() -> None:
    index = ChangeIndex()
    index.touch("a")  # added
    before = index.version
    index.touch("a")  # removed: the reader learns of it by looking the view up
    middle = index.version
    index.touch("a")  # declared again under the same uid
    assert index.since(before) == ["a"]
    assert index.since(middle) == ["a"]


def test_a_token_from_the_future_or_older_than_kept_gets_none() -> None:
    index = ChangeIndex(keep=3)
    for uid in "abcde":
        index.touch(uid)
    assert len(index) == 3
    assert index.floor == 2  # "a" and "b" were dropped: a reader before 2 lost them
    assert index.since(1) is None
    assert index.since(index.version + 1) is None  # another process's, or before a restart
    assert index.since(-1) is None
    assert index.since(2) == ["e", "d", "c"]
    index.touch("c")  # a kept uid touched again moves up, and drops nothing
    assert index.floor == 2
    assert index.since(2) == ["c", "e", "d"]
    index.touch("f")  # a new one drops the oldest kept ("d", at 4)
    assert index.floor == 4
    assert index.since(3) is None
    assert index.since(4) == ["f", "c", "e"]


def test_keep_must_hold_a_uid() -> None:
    with pytest.raises(ValueError, match="keep"):
        ChangeIndex(keep=0)


def test_the_index_agrees_with_a_brute_force_record() -> None:
    rng = random.Random(40)
    index = ChangeIndex(keep=50)
    last: dict[str, int] = {}
    for _ in range(2_000):
        uid = f"u{rng.randrange(80)}"
        last[uid] = index.touch(uid)
        since = rng.randrange(-2, index.version + 3)
        got = index.since(since)
        if since < index.floor or since > index.version:
            assert got is None
        else:
            expected = sorted((u for u, v in last.items() if v > since), key=lambda u: -last[u])
            assert got == expected


def test_due_times_come_out_soonest_first_and_once() -> None:
    due = DueTimes()
    due.set("late", _at(30))
    due.set("soon", _at(10))
    due.set("none", None)
    assert due.pop_due(_at(5)) == []
    assert due.pop_due(_at(10)) == ["soon"]  # an instant reached is due
    assert due.pop_due(_at(10)) == []  # forgotten once given
    assert due.when("late") == _at(30)
    assert due.pop_due(_at(100)) == ["late"]
    assert len(due) == 0


def test_a_newer_instant_replaces_the_older_either_way() -> None:
    due = DueTimes()
    due.set("a", _at(10))
    due.set("a", _at(50))  # a lease renewed: its old end is no longer due
    due.set("b", _at(40))
    due.set("b", _at(20))  # a back-off ending sooner than the lease
    assert due.pop_due(_at(30)) == ["b"]
    due.set("a", None)  # released: no instant at all
    assert due.pop_due(_at(100)) == []


def test_many_replacements_keep_the_heap_small_and_the_answers_right() -> None:
    rng = random.Random(7)
    due = DueTimes()
    truth: dict[str, datetime] = {}
    for _ in range(5_000):
        uid = f"u{rng.randrange(20)}"
        when = _at(rng.randrange(1, 1_000)) if rng.random() > 0.1 else None
        due.set(uid, when)
        if when is None:
            truth.pop(uid, None)
        else:
            truth[uid] = when
    assert len(due._heap) <= 2 * len(truth) + 65
    now = _at(500)
    expected = sorted((w, u) for u, w in truth.items() if w <= now)
    got = due.pop_due(now)
    assert sorted(got) == sorted(u for _, u in expected)
    assert [truth[u] for u in got] == sorted(truth[u] for u in got)
