"""The clouds' catalogue cache (services/providers/cloud/pure/expiring.py): an answer is believed
for its time and no longer, the cache holds at most its size, and a clock gone back believes
nothing."""

from __future__ import annotations

from services.providers.cloud.pure.expiring import Expiring


def test_an_answer_expires_after_its_time_and_is_dropped() -> None:
    kept: Expiring[str, frozenset[str]] = Expiring(ttl=3600.0, size=4)
    kept.put("t3.nano", frozenset({"a"}), now=100.0)
    assert kept.get("t3.nano", now=3699.9) == frozenset({"a"})
    assert kept.get("t3.nano", now=3700.0) is None
    assert len(kept) == 0  # an expired answer is dropped, not kept beside the new one


def test_answers_are_bounded_in_number_the_oldest_going_first() -> None:
    kept: Expiring[str, int] = Expiring(ttl=3600.0, size=2)
    kept.put("a", 1, now=0.0)
    kept.put("b", 2, now=1.0)
    kept.put("a", 3, now=2.0)  # written again: now the newest
    kept.put("c", 4, now=3.0)
    assert (kept.get("a", 3.0), kept.get("b", 3.0), kept.get("c", 3.0)) == (3, None, 4)
    kept.forget("a")
    assert kept.get("a", 3.0) is None
    assert len(kept) == 1


def test_a_clock_gone_back_believes_nothing() -> None:
    kept: Expiring[str, int] = Expiring(ttl=10.0, size=2)
    kept.put("c", 3, now=2.0)
    assert kept.get("c", now=1.0) is None
