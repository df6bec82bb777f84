"""``GET /v1/proxies`` filtered from the candidate index's sets (D164): every page, token and
``total`` equal what a walk of the fleet with the filter's predicate answers, for dense and
sparse filters, across pages, after removals and changes."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from events.schemas import Event, HealthChanged, Phase, PhaseChanged, ProxyRemoved
from services.discovery.http.queries import (
    Paged,
    ProxyFilter,
    parse_paging,
    parse_proxy_filter,
)
from services.discovery.pure.paging import Key, page_of
from tests.support.hand_views import Fleet

QUERIES: list[list[tuple[str, str]]] = [
    [("phase", "Ready")],
    [("phase", "failed")],
    [("healthy", "true")],
    [("healthy", "false")],
    [("attr.tier", "gold")],
    [("attr.tier", "gold"), ("healthy", "false")],
    [("attr.tier", "none")],
    [("attr.country", "de"), ("attr.tier", "std"), ("phase", "Ready")],
    [("phase", "Pending"), ("healthy", "true")],
]


def _fleet(seed: int, n: int) -> Fleet:
    rng = random.Random(seed)
    fleet = Fleet()
    for i in range(n):
        uid = f"u{rng.randrange(10**6):06d}"
        attributes = {"tier": rng.choice(("gold", "std", "std", "std")), "country": "de"}
        events: list[Event] = []
        if rng.random() < 0.2:
            events.append(HealthChanged(healthy=False))
        if rng.random() < 0.1:
            events.append(PhaseChanged(phase=rng.choice((Phase.FAILED, Phase.PENDING))))
        fleet.proxy(uid, attributes, *events)
        if i % 17 == 0:
            fleet.proxy(uid, attributes, ProxyRemoved(uid=uid))
    return fleet


def _predicate(fleet: Fleet, wanted: ProxyFilter) -> Callable[[Key], bool]:
    """The walk's test of one key: the filter's predicate on the proxy's view."""
    views = fleet.views.proxies.views
    return lambda key: wanted.matches(views[key[2]])


def _pages(fleet: Fleet, query: list[tuple[str, str]], limit: int, indexed: bool) -> list[Paged]:
    views = fleet.views
    out: list[Paged] = []
    token = ""
    for _ in range(1_000):
        sent = [*query, ("limit", str(limit)), *([("continue", token)] if token else [])]
        paging, rest = parse_paging(sent, "proxies", 3)
        wanted = parse_proxy_filter(rest)
        if indexed:
            phase = wanted.phase.value if wanted.phase is not None else None
            found = views.candidates.filtered(phase, wanted.healthy, wanted.attributes)
            got = paging.page_of(views.order, found, views.key_of)
        else:
            got = paging.page(views.order, _predicate(fleet, wanted))
        out.append(got)
        token = got.token
        if not token:
            return out
    raise AssertionError("the listing never ended")


@pytest.mark.parametrize("limit", [1, 7, 1000])
def test_indexed_pages_equal_a_walk_of_the_fleet(limit: int) -> None:
    fleet = _fleet(164, 150)
    for query in QUERIES:
        walked = _pages(fleet, query, limit, indexed=False)
        indexed = _pages(fleet, query, limit, indexed=True)
        assert indexed == walked, query
        assert all(page.total == walked[0].total for page in indexed)


def test_a_change_moves_a_proxy_between_the_sets() -> None:
    fleet = _fleet(7, 40)
    uid = next(iter(fleet.views.order))[2]
    fleet.proxy(uid, {"tier": "gold"}, HealthChanged(healthy=False))
    unhealthy = fleet.views.candidates.filtered(None, False, ())
    assert uid in unhealthy
    fleet.proxy(uid, {"tier": "gold"}, HealthChanged(healthy=True))
    assert uid not in fleet.views.candidates.filtered(None, False, ())
    assert uid in fleet.views.candidates.filtered("Ready", True, [("tier", "gold")])
    fleet.proxy(uid, {"tier": "gold"}, ProxyRemoved(uid=uid))
    assert uid not in fleet.views.candidates.filtered("Ready", None, ())
    for query in QUERIES:
        assert _pages(fleet, query, 5, indexed=True) == _pages(fleet, query, 5, indexed=False)


def test_page_of_walks_dense_matches_and_sorts_sparse_ones() -> None:
    keys = [("ns", f"n{i:03d}", f"u{i:03d}") for i in range(100)]
    key_of = {key[2]: key for key in keys}
    dense = {key[2] for key in keys if int(key[2][1:]) % 2 == 0}
    assert page_of(keys, dense, key_of, None, 3) == (keys[0:6:2], True)
    assert page_of(keys, dense, key_of, keys[94], 3) == ([keys[96], keys[98]], False)
    sparse = {"u005", "u050"}
    assert page_of(keys, sparse, key_of, None, 1) == ([keys[5]], True)
    assert page_of(keys, sparse, key_of, keys[5], 1) == ([keys[50]], False)
    assert page_of(keys, sparse, key_of, keys[99], 1) == ([], False)
    assert page_of(keys, frozenset(), key_of, None, 10) == ([], False)
    assert page_of(keys, dense, key_of, None, None)[0] == sorted(key_of[u] for u in dense)
