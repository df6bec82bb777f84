"""A client's allowed pool is bound to its namespace (D139): the clients file writes it
``NAMESPACE/NAME`` (``NAME`` alone: the namespace ``default``), anything else stops the service
naming the field, and a lease request is checked against the pool it leases from, so a pool of
the same name in another namespace, or the bare attribute sent as a selector, is not allowed."""

from __future__ import annotations

import pytest

from services.discovery.pure.pools import bound_selector
from services.runtime.pure.clients import ClientsError, hash_token, parse_clients
from services.runtime.pure.poolref import PoolRef

TOKEN = hash_token("t" * 40)


def _client(selectors: str) -> str:
    return f"clients:\n  - {{name: c, token: '{TOKEN}', scopes: [lease], selectors: {selectors}}}\n"


def test_a_pool_is_written_with_its_namespace_or_is_in_default() -> None:
    table = parse_clients(_client("[{pool: crawl/depool}, {pool: solo, country: de}]"), "f")
    (client,) = table.by_hash.values()
    assert client.selectors == ({"pool": "crawl/depool"}, {"pool": "default/solo", "country": "de"})


@pytest.mark.parametrize(
    "pool", ["Crawl/depool", "a/b/c", "/depool", "crawl/", "crawl/de_pool", "x" * 70]
)
def test_a_pool_that_names_none_stops_the_service_naming_the_field(pool: str) -> None:
    with pytest.raises(ClientsError, match=r"f: clients\[0\]\.selectors\[0\]\.pool: "):
        parse_clients(_client(f"[{{pool: '{pool}'}}]"), "f")


def test_a_request_is_checked_against_the_pool_it_leases_from() -> None:
    (client,) = parse_clients(_client("[{pool: crawl/depool}]"), "f").by_hash.values()
    crawl = bound_selector({"pool": "depool"}, PoolRef("crawl", "depool"))
    other = bound_selector({"pool": "depool"}, PoolRef("other", "depool"))
    assert client.allows_selector(crawl)
    assert not client.allows_selector(other)
    # The attribute alone matches members of every namespace: no binding allows it.
    assert not client.allows_selector(bound_selector({"pool": "depool"}, None))
    assert not client.allows_selector(bound_selector({"pool": "crawl/depool"}, None))
    assert bound_selector({"country": "de"}, None) == {"country": "de"}


def test_a_binding_without_a_namespace_is_the_default_one_only() -> None:
    (client,) = parse_clients(_client("[{pool: depool}]"), "f").by_hash.values()
    assert client.allows_selector(bound_selector({}, PoolRef("default", "depool")))
    assert not client.allows_selector(bound_selector({}, PoolRef("crawl", "depool")))
