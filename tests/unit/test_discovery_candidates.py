"""The candidate index and the lazy random order, without servers."""

from __future__ import annotations

import random
from typing import Any

from events.schemas import Phase, ProxySpec
from projections.proxy import ProxyView
from services.discovery.pure.candidates import CandidateIndex
from services.discovery.pure.drawing import random_order


def proxy(uid: str, **changes: Any) -> ProxyView:
    values: dict[str, Any] = {
        "uid": uid,
        "phase": Phase.READY,
        "url": "http://127.0.0.1:3128",
        "healthy": True,
        "spec": ProxySpec(attributes={"country": "de", "tier": "gold"}),
    }
    values.update(changes)
    return ProxyView(**values)


def test_the_index_follows_every_new_version_of_a_proxy() -> None:
    index = CandidateIndex()
    index.update(proxy("a"))
    index.update(proxy("b", spec=ProxySpec(attributes={"country": "us", "tier": "gold"})))
    index.update(proxy("c", healthy=None))  # not probed yet
    assert index.matching({}) == ["a", "b"]
    assert index.matching({"tier": "gold"}) == ["a", "b"]
    assert index.matching({"country": "de", "tier": "gold"}) == ["a"]
    assert index.matching({"country": "fr"}) == []
    assert index.matching({"country": "de", "pool": "x"}) == []

    index.update(proxy("a", spec=ProxySpec(attributes={"country": "fr"})))  # a spec change
    assert index.matching({"country": "de"}) == []
    assert index.matching({"country": "fr"}) == ["a"]
    index.update(proxy("b", healthy=False))
    index.update(proxy("c"))  # its first verdict
    assert index.matching({"tier": "gold"}) == ["c"]
    for gone in (proxy("a", deleting=True), proxy("c", phase=Phase.REPLACING)):
        index.update(gone)
    assert index.matching({}) == []
    assert index.by_pair == {}  # nothing left behind


def test_random_order_yields_each_item_once_lazily() -> None:
    items = [f"p{i}" for i in range(50)]
    order = random_order(items, random.Random(7))
    first = next(order)
    assert first in items
    assert sorted([first, *order]) == sorted(items)
    assert items == [f"p{i}" for i in range(50)]  # the caller's list is left alone
    orders = {tuple(random_order(items[:4], random.Random(seed))) for seed in range(200)}
    assert len(orders) == 24  # every permutation of four turns up
    assert list(random_order([], random.Random(1))) == []
