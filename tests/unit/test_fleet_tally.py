"""The fleet page's counts kept as rows change (``console.pure.tally``): the same figures as
``fleet.counts`` over the rows a filter keeps, for every single-value filter, without a walk."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime

from services.discovery.console.pure.fleet import NO_FILTERS, Filters, Row, counts
from services.discovery.console.pure.tally import FleetTally
from services.discovery.pure.egress_shown import EgressShown

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
PHASES = ("Pending", "Ready", "Failed")
HEALTHS = ("healthy", "unhealthy", "unknown")
PROVIDERS = ("local", "gcp", "")
POOLS = ("crawl/de", "crawl/fr", "")


def _row(rng: random.Random, uid: str) -> Row:
    country = rng.choice(("DE", "FR", ""))
    egress = None
    if rng.random() < 0.7:
        egress = EgressShown(
            country=country,
            not_leasable_because=rng.choice(("", "", "egress_mismatch")),
            shared=("x",) if rng.random() < 0.1 else (),
        )
    return Row(
        uid=uid,
        namespace="crawl",
        name=uid,
        phase=rng.choice(PHASES),
        health=rng.choice(HEALTHS),
        latency_ms=None,
        health_message="",
        provider=rng.choice(PROVIDERS),
        ip="",
        attributes=(("tier", rng.choice(("gold", "std"))),),
        leased=rng.random() < 0.3,
        holder="",
        expires_at=None,
        cooldown_until=T0 if rng.random() < 0.2 else None,
        backoffs=(),
        available=rng.random() < 0.5,
        deleting=False,
        message="",
        pool=rng.choice(POOLS),
        egress=egress,
    )


def _queries() -> list[Filters]:
    out = [NO_FILTERS]
    out += [Filters(phase=p) for p in (*PHASES, "Deleting")]
    out += [Filters(health=h) for h in HEALTHS]
    out += [Filters(provider=p) for p in ("local", "gcp", "nobody")]
    out += [Filters(pool=p) for p in ("crawl/de", "crawl/fr", "crawl/none")]
    out += [Filters(egress_country=c) for c in ("DE", "FR", "unknown", "JP")]
    return out


def test_every_single_value_filter_counts_as_a_walk_would() -> None:
    rng = random.Random(164)
    tally = FleetTally()
    live: dict[str, Row] = {}
    for step in range(600):
        uid = f"u{rng.randrange(60)}"
        old = live.pop(uid, None)
        fresh = None
        if old is None or rng.random() < 0.8:  # else: removed (until drawn again)
            fresh = _row(rng, uid)
            if old is not None and rng.random() < 0.5:
                fresh = replace(old, health=fresh.health, latency_ms=step)  # one figure moves
            live[uid] = fresh
        tally.replace(old, fresh)
        if step % 50 == 0 or step == 599:
            every = sorted(live.values(), key=lambda r: r.uid)
            for wanted in _queries():
                shown = [r for r in every if wanted.matches(r)]
                assert tally.counts(wanted) == counts(shown, every), wanted
                assert tally.keys(wanted) == [(r.namespace, r.name, r.uid) for r in shown]


def test_a_row_changed_twice_counts_once_as_it_is_now() -> None:
    rng = random.Random(1)
    tally = FleetTally()
    first = replace(_row(rng, "a"), health="healthy", provider="local")
    tally.add(first)
    second = replace(first, health="unhealthy")
    tally.remove(first)
    tally.add(second)
    third = replace(second, health="unknown", provider="gcp")
    tally.remove(second)
    tally.add(third)
    got = tally.counts(NO_FILTERS)
    assert got is not None
    assert (got.total, got.healthy, got.unhealthy, got.unknown) == (1, 0, 0, 1)
    assert got.providers == ("gcp",)  # a value no row has any more is no choice
    assert tally.by["provider"].keys() == {"gcp"}
    assert tally.by["health"].keys() == {"unknown"}
    tally.remove(third)
    empty = tally.counts(NO_FILTERS)
    assert empty is not None
    assert (empty.total, empty.shown, empty.providers) == (0, 0, ())
    assert all(not values for values in tally.by.values())


def test_a_query_no_tally_answers_is_left_to_a_walk() -> None:
    tally = FleetTally()
    tally.add(_row(random.Random(2), "a"))
    assert tally.counts(Filters(phase="Ready", health="healthy")) is None
    assert tally.counts(Filters(attributes=(("tier", "gold"),))) is None
    assert tally.counts(Filters(search="crawl")) is None
    assert tally.counts(Filters(provider="local", search="a")) is None
    assert tally.keys(Filters(phase="Ready", health="healthy")) is None
    assert tally.keys(Filters(provider="nobody")) == []
