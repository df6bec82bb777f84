"""What a site sees of each proxy, through a real discovery replica on a real nats-server: the
``egress`` object of ``GET /v1/proxies`` and of a lease, the ``egress.country``/``egress.asn``
filters, the fleet gauges, and the console's columns, filter and proxy card
(docs/decisions/0111-verified-egress.md). The findings are appended as the health service
appends them, on ``proxy.<uid>.egress``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from events import subjects
from events.egress import EgressChanged, EgressObserved
from events.store import EventStore, NewEvent
from projections.egress import EgressPolicy
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

CHECKED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DB = "GeoLite2-ASN 2026-11-28"


GERMAN = ("DE", 3320, "Deutsche Telekom AG")


async def observe(
    store: EventStore, uid: str, ip: str, place: tuple[str, int, str], *, old_ip: str = ""
) -> None:
    """A finding about the instance ``ready_proxy`` gave ``uid``: its (country, asn, org)."""
    country, asn, org = place
    fields = {
        "provider_id": f"local-{uid}",
        "ip": ip,
        "scope": "public",
        "country": country,
        "asn": asn,
        "org": org,
        "db": DB,
        "checked_at": CHECKED,
    }
    event = EgressChanged(**fields, old_ip=old_ip) if old_ip else EgressObserved(**fields)  # type: ignore[arg-type]
    await store.append(subjects.proxy(uid), [NewEvent(event, f"egress-{uid}-{ip}")])


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


async def fleet(store: EventStore) -> None:
    """de1 and twin leave through one address; us1 should leave from Germany and does not."""
    await ready_proxy(store, "de1", {"country": "de"}, port=3001)
    await ready_proxy(store, "twin", {"tier": "silver"}, port=3002, provider="kvm")
    await ready_proxy(store, "us1", {"country": "de"}, port=3003)
    await ready_proxy(store, "new", {"country": "de"}, port=3004)
    await ready_proxy(store, "plain", {"tier": "gold"}, port=3005)
    await observe(store, "de1", "203.0.113.5", GERMAN)
    await observe(store, "twin", "203.0.113.5", GERMAN)
    await observe(store, "us1", "198.51.100.7", ("US", 7922, "Comcast"))


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[tuple[httpx.AsyncClient, JetStreamEventStore]]:
    store = jetstream_store
    await fleet(store)
    policy = EgressPolicy(country_attribute="country")
    async with (
        discovery(nats_server.url, egress=policy) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client, store


async def listed(client: httpx.AsyncClient, **params: str) -> dict[str, dict[str, object]]:
    response = await client.get("/v1/proxies", params=params)
    assert response.status_code == 200, response.text
    return {p["uid"]: p for p in response.json()["items"]}


async def test_the_egress_object_says_what_was_seen_and_what_follows(
    api: tuple[httpx.AsyncClient, JetStreamEventStore],
) -> None:
    client, store = api
    proxies = await listed(client)
    assert proxies["de1"]["egress"] == {
        "ip": "203.0.113.5",
        "scope": "public",
        "country": "DE",
        "asn": 3320,
        "org": "Deutsche Telekom AG",
        "checkedAt": "2026-12-01T12:00:00Z",
        "db": DB,
        "error": "",
        "changedFrom": "",
        "shared": ["twin"],
        "notLeasableBecause": "",
        "seen": "egress 203.0.113.5 is shared with 1 other proxy(ies): twin",
    }
    us1 = proxies["us1"]["egress"]
    assert isinstance(us1, dict)
    assert us1["notLeasableBecause"] == "egress_mismatch"
    assert us1["seen"] == "egress 198.51.100.7: country US, expected DE (spec.attributes.country)"
    assert proxies["us1"]["available"] is False
    assert proxies["de1"]["available"] is True
    # Not checked yet: held back only because it states a country it cannot be seen to keep.
    new = proxies["new"]["egress"]
    assert isinstance(new, dict)
    assert (new["ip"], new["notLeasableBecause"]) == ("", "egress_unchecked")
    assert new["seen"] == "egress not verified: no check has finished yet"
    # Nothing found yet, nothing held against it: no egress at all.
    assert "egress" not in proxies["plain"]
    detail = await client.get("/v1/proxies/us1")
    assert detail.status_code == 200
    assert detail.json()["egress"] == us1

    # A change of address arrives while discovery runs: the old address is named, the clash ends.
    await observe(store, "twin", "192.0.2.44", GERMAN, old_ip="203.0.113.5")

    async def moved() -> bool:
        twin = (await listed(client))["twin"]["egress"]
        return isinstance(twin, dict) and twin["changedFrom"] == "203.0.113.5"

    await until(moved, what="the twin's change of address shown")
    after = await listed(client)
    assert after["twin"]["egress"]["ip"] == "192.0.2.44"  # type: ignore[index]
    assert after["de1"]["egress"]["shared"] == []  # type: ignore[index]


async def test_the_filters_and_a_lease_select_on_what_was_seen(
    api: tuple[httpx.AsyncClient, JetStreamEventStore],
) -> None:
    client, _ = api
    assert sorted(await listed(client, **{"egress.country": "DE"})) == ["de1", "twin"]
    assert sorted(await listed(client, **{"egress.country": "us"})) == ["us1"]
    assert sorted(await listed(client, **{"egress.asn": "AS7922"})) == ["us1"]
    assert sorted(await listed(client, **{"egress.asn": "3320", "attr.tier": "silver"})) == ["twin"]
    for params, named in (
        ({"egress.country": "Germany"}, "egress.country:"),
        ({"egress.asn": "telekom"}, "egress.asn:"),
    ):
        refused = await client.get("/v1/proxies", params=params)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "invalid_request"
        assert refused.json()["message"].startswith(named)

    lease = await client.post(
        "/v1/leases", json={"selector": {"egress.asn": "AS3320", "tier": "silver"}, "holder": "c"}
    )
    assert lease.status_code == 201, lease.text
    proxy = lease.json()["proxy"]
    assert proxy["uid"] == "twin"
    assert (proxy["egress"]["ip"], proxy["egress"]["shared"]) == ("203.0.113.5", ["de1"])
    # The one proxy seen in the US does not match its own expectation: 503, saying why.
    refused = await client.post("/v1/leases", json={"selector": {"egress.country": "US"}})
    assert refused.status_code == 503, refused.text
    assert "egress_mismatch" in refused.json()["message"]
    assert "country US, expected DE" in refused.json()["message"]


async def test_the_gauges_count_mismatches_shared_addresses_and_countries(
    api: tuple[httpx.AsyncClient, JetStreamEventStore],
) -> None:
    client, _ = api
    scraped = await client.get("/metrics")
    assert scraped.status_code == 200
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        assert key in found, f"{name}{labels} is not exported"
        return found[key]

    assert value("egress_proxies_egress_mismatch", provider="local") == 1
    assert value("egress_proxies_egress_mismatch", provider="kvm") == 0
    assert value("egress_proxies_egress_shared", provider="local") == 1
    assert value("egress_proxies_egress_shared", provider="kvm") == 1
    by_country = "egress_proxies_egress_proxies"
    assert value(by_country, country="DE", provider="local") == 1
    assert value(by_country, country="DE", provider="kvm") == 1
    assert value(by_country, country="US", provider="local") == 1
    assert value(by_country, country="unknown", provider="local") == 2
    # The mismatched and the unchecked proxy are healthy, but no lease request would get them.
    assert value("egress_proxies_healthy", provider="local") == 4
    assert value("egress_proxies_available", provider="local") == 2


async def test_the_console_shows_and_filters_by_egress(
    api: tuple[httpx.AsyncClient, JetStreamEventStore],
) -> None:
    client, _ = api
    page = await client.get("/ui", params={"egress_country": "us"})
    assert page.status_code == 200, page.text
    assert 'data-uid="us1"' in page.text
    assert 'data-uid="de1"' not in page.text
    assert ">mismatch</span>" in page.text
    assert "US / AS7922" in page.text
    shared = (await client.get("/ui/live", params={"egress_country": "DE"})).text
    assert 'data-uid="de1"' in shared
    assert 'data-uid="twin"' in shared
    assert ">shared</span>" in shared
    bad = await client.get("/ui", params={"egress_country": "Germany"})
    assert bad.status_code == 400
    card = (await client.get("/ui/proxies/us1")).text
    for text in ("198.51.100.7", "US · AS7922 Comcast", f"placed by {DB}", ">mismatch</span>"):
        assert text in card, text
    assert "country US, expected DE (spec.attributes.country)" in card
    assert 'data-col="egress-replacements">0 ' in card
    assert "same address as" in (await client.get("/ui/proxies/de1")).text


async def test_get_wide_and_json_show_the_egress_read_from_the_log(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await fleet(jetstream_store)
    url = ("--nats-url", nats_server.url, "--egress-country-attribute", "country")
    wide = await cli("get", "-o", "wide", *url)
    assert wide.exit_code == 0, wide.output
    lines = {line.split()[1]: line for line in wide.output.splitlines()[1:] if line.strip()}
    assert "198.51.100.7 !mismatch" in lines["px-us1"]
    assert "US/AS7922" in lines["px-us1"]
    assert "203.0.113.5 !shared" in lines["px-de1"]
    assert "- !unchecked" in lines["px-new"]
    selected = await cli("get", "-l", "egress.country=US", *url)
    assert [line.split()[1] for line in selected.output.splitlines()[1:]] == ["px-us1"]
    dumped = await cli("get", "-o", "json", "--nats-url", nats_server.url)
    items = {i["uid"]: i for i in json.loads(dumped.output)["items"]}
    assert items["twin"]["egress"]["shared"] == ["de1"]
    # Without the flag discovery was given, the attribute sets no expectation.
    assert items["us1"]["egress"]["notLeasableBecause"] == ""
    assert items["plain"]["egress"] is None
