"""What the fake proxy service keeps (services/testing/upstream_exits.py): a session keeps its
exit for its lifetime and only then takes another of its country, requests without one get a
fresh exit each, drops and moves change exits as a service's peers do, faults are answered as
many times as asked, traffic is counted per session. The clock is the test's: nothing waits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.testing.upstream_exits import Book, Fault, Refused, parse_countries

DE = tuple(f"127.0.2.{n}" for n in range(1, 5))
FR = ("127.0.3.1", "127.0.3.2")


def book(lifetime: float = 60.0) -> Book:
    return Book({"de": DE, "fr": FR}, lifetime)


def test_a_session_keeps_its_exit_until_its_lifetime_ends() -> None:
    exits = book(lifetime=60)
    first = exits.exit_for("s1", "de", 0.0)
    assert first in DE
    assert exits.exit_for("s1", "de", 59.9) == first
    later = exits.exit_for("s1", "de", 60.0)
    assert later in DE
    assert later != first
    assert exits.exit_for("s1", "de", 61.0) == later


def test_the_login_s_lifetime_shortens_the_service_s() -> None:
    exits = book(lifetime=600)
    first = exits.exit_for("s1", "de", 0.0, asked=60)
    assert exits.exit_for("s1", "de", 59.0, asked=60) == first
    assert exits.exit_for("s1", "de", 60.0, asked=60) != first
    longer = book(lifetime=30)
    kept = longer.exit_for("s2", "de", 0.0, asked=3600)
    assert longer.exit_for("s2", "de", 30.0, asked=3600) != kept


def test_sessions_hold_distinct_exits_of_their_own_country() -> None:
    exits = book()
    held = [exits.exit_for(f"s{n}", "de", 0.0) for n in range(len(DE))]
    assert sorted(held) == sorted(DE)
    assert exits.exit_for("f1", "fr", 0.0) in FR
    with pytest.raises(Refused) as full:
        exits.exit_for("one-more", "de", 0.0)
    assert full.value.status == 502
    assert "no peers" in full.value.reason


def test_requests_without_a_session_get_a_fresh_exit_each_and_avoid_held_ones() -> None:
    exits = book()
    held = exits.exit_for("s1", "de", 0.0)
    seen = [exits.exit_for("", "de", 0.0) for _ in range(6)]
    assert held not in seen
    assert all(a != b for a, b in itertools.pairwise(seen))
    for n in range(2, 5):
        exits.exit_for(f"s{n}", "de", 0.0)
    assert exits.exit_for("", "de", 0.0) in DE  # all held: one of them still serves


def test_a_country_not_offered_is_refused_and_none_means_the_first() -> None:
    exits = book()
    with pytest.raises(Refused) as refused:
        exits.exit_for("s1", "us", 0.0)
    assert refused.value.status == 400
    assert "de, fr" in refused.value.reason
    assert exits.country("") == "de"
    assert exits.country("fr") == "fr"


def test_a_dropped_session_comes_back_on_another_exit() -> None:
    exits = book()
    for _ in range(3):  # the cursor anywhere: the old exit is still avoided
        exits.exit_for("", "de", 0.0)
        first = exits.exit_for("s1", "de", 0.0)
        assert exits.drop("s1") == 1
        assert exits.exit_for("s1", "de", 0.0) != first
        exits.drop("s1")
    assert exits.drop("nobody") == 0


def test_a_moved_session_leaves_from_its_new_exit_at_once() -> None:
    exits = book()
    first = exits.exit_for("s1", "fr", 0.0)
    assert exits.move("s1", 0.0) == [e for e in FR if e != first]
    assert exits.exit_for("s1", "fr", 0.0) != first
    assert exits.move("nobody", 0.0) == []
    exits.exit_for("s2", "fr", 0.0)
    with pytest.raises(Refused) as full:
        exits.move("s1", 0.0)
    assert full.value.status == 409


def test_faults_are_answered_as_many_times_as_asked_and_to_whom() -> None:
    exits = book()
    exits.add_fault(Fault(429, remaining=2, retry_after=7))
    exits.add_fault(Fault(402, remaining=None, session="s9"))
    taken = [exits.fault_for("s1") for _ in range(3)]
    assert [f.status if f else None for f in taken] == [429, 429, None]
    assert taken[0] is not None
    assert taken[0].retry_after == 7
    assert all((f := exits.fault_for("s9")) is not None and f.status == 402 for _ in range(5))
    exits.add_stall(Fault(0, remaining=1))
    assert exits.stall_for("s1")
    assert not exits.stall_for("s1")
    exits.add_stall(Fault(0, remaining=None, session="s2"))
    exits.clear()
    assert exits.fault_for("s9") is None
    assert not exits.stall_for("s2")
    with pytest.raises(ValueError, match="402, 407, 429"):
        exits.add_fault(Fault(500))


def test_traffic_is_counted_per_session_and_outlives_it() -> None:
    exits = book(lifetime=10)
    exits.exit_for("s1", "de", 0.0)
    exits.count_request("s1", "de")
    exits.count("s1", "de", up=100, down=2000)
    exits.count("s1", "de", up=1, down=2)
    exits.count_request("", "de")
    rows = {(r["session"], r["country"]): r for r in exits.report(20.0)}
    assert rows[("s1", "de")] == {
        "session": "s1",
        "country": "de",
        "exit": None,
        "expiresIn": None,
        "requests": 1,
        "bytesUp": 101,
        "bytesDown": 2002,
    }
    assert rows[("", "de")]["requests"] == 1


@pytest.mark.parametrize(
    ("specs", "why"),
    [
        ([], "at least one"),
        (["de"], "country=addresses"),
        (["deu=127.0.2.1"], "country=addresses"),
        (["de=10.0.0.1"], "loopback"),
        (["de=127.0.2.9-127.0.2.1"], "loopback"),
        (["de=127.0.2.1", "DE=127.0.2.2"], "twice"),
        (["de=127.0.2.1", "fr=127.0.2.1"], "already de's"),
        (["de=localhost"], "not an IPv4"),
        (["de=127.0.0.1-127.1.0.0"], "more than"),
        (["de="], "not an IPv4"),
    ],
)
def test_a_country_map_that_cannot_serve_is_refused(specs: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_countries(specs)


def test_a_country_map_reads_ranges_and_lists() -> None:
    assert parse_countries(["DE=127.0.2.1-127.0.2.3", "fr=127.0.3.7,127.0.3.9"]) == {
        "de": ("127.0.2.1", "127.0.2.2", "127.0.2.3"),
        "fr": ("127.0.3.7", "127.0.3.9"),
    }


@settings(max_examples=200)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ask", "drop", "move", "tick"]),
            st.sampled_from(["a", "b", "c", ""]),
            st.sampled_from(["de", "fr"]),
        ),
        max_size=40,
    )
)
def test_no_two_live_sessions_ever_share_an_exit(steps: list[tuple[str, str, str]]) -> None:
    exits = book(lifetime=5)
    now = 0.0
    for action, session, country in steps:
        try:
            if action == "ask":
                assert exits.exit_for(session, country, now) in exits.countries[country]
            elif action == "drop":
                exits.drop(session)
            elif action == "move":
                exits.move(session, now)
            else:
                now += 2.0
        except Refused:
            pass
        live = [s.exit for s in exits.sessions.values()]
        assert len(live) == len(set(live))
        assert all(s.exit in exits.countries[s.country] for s in exits.sessions.values())
