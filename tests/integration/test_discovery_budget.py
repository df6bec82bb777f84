"""An upstream provider's daily budget through a real discovery replica, as its own NATS user, on
a real nats-server (docs/decisions/0162-upstream-budgets.md): meter records appended for one
provider until its bytes of today reach its budget make its proxies unleasable with the reason,
another provider's stay leasable, a lease held before is not revoked, and the next UTC day (the
budget's clock moved) leases them again. ``GET /v1/proxies`` and the console's proxy page show
each proxy's bytes of today and the budget's condition."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from events import subjects
from events.meter import UpstreamMetered
from events.store import EventStore, NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import restore_logging_after
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

BUDGET = 1000


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


async def meter(
    store: EventStore,
    provider: str,
    proxy_uid: str,
    moved: tuple[int, int],
    *,
    n: int,
    named: str = "",
) -> None:
    """One interval's record of ``proxy_uid`` under its provider's budget, as the executor's
    meter appends it on ``meter.<provider>``; ``named``: another provider the record names."""
    event = UpstreamMetered(
        provider=named or provider,
        lease_id="lease-x",
        budget_bytes_per_day=BUDGET,
        replica="executor-1",
        start=datetime.now(UTC),
        interval_seconds=10.0,
        proxy_uid=proxy_uid,
        requests=1,
        bytes_up=moved[0],
        bytes_down=moved[1],
    )
    await store.append(subjects.meter(provider), [NewEvent(event, f"meter-{provider}-{n}")])


async def listed(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await client.get("/v1/proxies")
    assert response.status_code == 200, response.text
    return {p["uid"]: p for p in response.json()["items"]}


async def test_a_spent_budget_stops_leasing_its_providers_proxies_until_the_next_utc_day(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    store = jetstream_store
    await ready_proxy(store, "de1", {"country": "de"}, port=3001, provider="resi-de")
    await ready_proxy(store, "de2", {"country": "de"}, port=3002, provider="resi-de")
    await ready_proxy(store, "fr1", {"country": "fr"}, port=3003, provider="resi-fr")
    today = [datetime.now(UTC)]
    async with (
        discovery(nats_server.url_for("discovery"), budget_clock=lambda: today[0]) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        await meter(store, "resi-de", "de1", (100, 500), n=1)
        await meter(store, "resi-fr", "fr1", (10, 20), n=2)
        # A record naming another provider than its subject's is the log's fault: left out.
        await meter(store, "resi-de", "de1", (10**9, 0), n=3, named="resi-fr")

        async def shown() -> bool:
            return "bytes" in (await listed(client))["de1"]

        await until(shown, what="de1's bytes of today")
        proxies = await listed(client)
        assert proxies["de1"]["bytes"] == {"up": 100, "down": 500}
        assert proxies["fr1"]["bytes"] == {"up": 10, "down": 20}
        assert "bytes" not in proxies["de2"]
        assert "budget" not in proxies["de1"]
        assert proxies["de1"]["available"] is True  # 600 of 1000

        held = await client.post("/v1/leases", json={"selector": {"country": "de"}})
        assert held.status_code == 201, held.text
        held_id = held.json()["id"]

        await meter(store, "resi-de", "de2", (150, 250), n=4)  # 1000 of 1000: spent

        async def spent() -> bool:
            return "budget" in (await listed(client))["de2"]

        await until(spent, what="resi-de's budget spent")
        proxies = await listed(client)
        for uid in ("de1", "de2"):
            budget = proxies[uid]["budget"]
            assert budget["notLeasableBecause"] == "budget_spent"
            assert (budget["provider"], budget["usedToday"], budget["bytesPerDay"]) == (
                "resi-de",
                1000,
                BUDGET,
            )
            midnight = (today[0] + timedelta(days=1)).date().isoformat()
            assert budget["resetsAt"] == f"{midnight}T00:00:00Z"
            assert proxies[uid]["available"] is False
        assert "budget" not in proxies["fr1"]
        assert proxies["fr1"]["available"] is True

        # The console's proxy page shows the bytes of today and the budget's condition.
        page = (await client.get("/ui/proxies/de1")).text
        assert "100 B up · 500 B down" in page
        assert "budget spent" in page
        assert "not leased: provider &#39;resi-de&#39; moved 1000 bytes today" in page
        assert "available" not in page.split("Lease</dt>")[1].split("</dd>")[0]
        assert "budget spent" not in (await client.get("/ui/proxies/fr1")).text

        refused = await client.post("/v1/leases", json={"selector": {"country": "de"}})
        assert refused.status_code == 503, refused.text
        message = refused.json()["message"]
        assert "budget_spent (provider 'resi-de' moved 1000 bytes today" in message
        assert "its budget is 1000 bytes a day" in message
        assert f"leasable again at {midnight}T00:00:00Z" in message
        wait = int(refused.headers["Retry-After"])
        assert 0 < wait <= 24 * 3600
        sticky = await client.post(
            "/v1/leases", json={"selector": {"country": "de"}, "proxyUid": "de2"}
        )
        assert sticky.status_code == 503, sticky.text
        assert "budget_spent" in sticky.json()["message"]
        other = await client.post("/v1/leases", json={"selector": {"country": "fr"}})
        assert other.status_code == 201, other.text
        assert other.json()["proxy"]["uid"] == "fr1"
        # The lease held before the budget was spent is not revoked.
        kept = await client.get(f"/v1/leases/{held_id}")
        assert kept.status_code == 200, kept.text

        # A new UTC day: its bytes start from nothing, and the proxies are leased again.
        today[0] += timedelta(days=1)
        proxies = await listed(client)
        assert "budget" not in proxies["de2"]
        assert "bytes" not in proxies["de1"]
        assert "Bytes today" not in (await client.get("/ui/proxies/de1")).text
        again = await client.post("/v1/leases", json={"selector": {"country": "de"}})
        assert again.status_code == 201, again.text
        assert again.json()["proxy"]["uid"] != held.json()["proxy"]["uid"]


async def test_a_replica_started_later_knows_the_spent_budget_from_the_snapshots(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    """The meter views are kept as snapshots like the proxy and lease views: a replica that
    starts after the budget was spent restores them and refuses from its first answer."""
    store = jetstream_store
    await ready_proxy(store, "de1", {"country": "de"}, port=3001, provider="resi-de")
    url = nats_server.url_for("discovery")
    async with discovery(url, snapshot_interval=0.2) as (first, _):
        await meter(store, "resi-de", "de1", (600, 600), n=1)
        assert first.api is not None
        views = first.api.views
        await until(lambda: "resi-de" in views.spent_providers(), what="the budget spent")
        await until(lambda: not views.meter.changed, what="a snapshot pass")
    async with (
        discovery(url) as (second, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        assert second.api is not None
        assert second.api.views.meter.restored_views == 1
        refused = await client.post("/v1/leases", json={"selector": {"country": "de"}})
        assert refused.status_code == 503, refused.text
        assert "budget_spent" in refused.json()["message"]
