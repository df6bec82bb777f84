"""The CLI's time travel against a real nats-server: ``get --at`` and ``events --until``."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from events import subjects
from events.schemas import HealthChanged, LeaseAcquired
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.cli_seed import seed_proxy
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def _instant() -> datetime:
    """A time strictly between what was stored before and what is stored after."""
    await asyncio.sleep(0.05)
    at = datetime.now(UTC)
    await asyncio.sleep(0.05)
    return at


async def test_get_at_shows_the_fleet_as_it_was(
    jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    before_any = await _instant()
    await seed_proxy(jetstream_store, "p1")
    healthy_then = await _instant()
    verdict = HealthChanged(healthy=False, reason="Probe", message="refused")
    await jetstream_store.append(subjects.proxy("p1"), [NewEvent(verdict, "p1-down")])
    acquired = LeaseAcquired(lease_id="l1", proxy_uid="p1", holder="crawler-7", ttl_seconds=600)
    await jetstream_store.append(subjects.lease("p1"), [NewEvent(acquired, "l1")])
    await seed_proxy(jetstream_store, "p2")

    url = ("--nats-url", nats_server.url)
    now = json.loads((await cli("get", "-o", "json", *url)).stdout)["items"]
    assert [(i["uid"], i["healthy"], i["leased"]) for i in now] == [
        ("p1", False, True),
        ("p2", None, False),
    ]
    result = await cli("get", "-o", "json", "--at", healthy_then.isoformat(), *url)
    assert result.exit_code == 0, result.output
    then = json.loads(result.stdout)["items"]
    assert [(i["uid"], i["healthy"], i["leased"]) for i in then] == [("p1", None, False)]
    table = await cli("get", "--at", healthy_then.strftime("%Y-%m-%dT%H:%M:%S.%f"), *url)
    assert "n-p1" in table.stdout
    assert "n-p2" not in table.stdout
    empty = await cli("get", "--at", before_any.isoformat(), *url)
    assert "No proxies at" in empty.stdout

    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    refused = await cli("get", "--at", future, *url)
    assert refused.exit_code == 2
    assert "in the future" in refused.output
    nonsense = await cli("get", "--at", "last tuesday", *url)
    assert nonsense.exit_code == 2
    assert "--at" in nonsense.output
    assert "ISO 8601" in nonsense.output


async def test_events_until_stops_at_the_instant(
    jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    await seed_proxy(jetstream_store, "p1")
    at = await _instant()
    verdict = HealthChanged(healthy=False, reason="Probe", message="refused")
    await jetstream_store.append(subjects.proxy("p1"), [NewEvent(verdict, "p1-down")])

    url = ("--nats-url", nats_server.url)
    every = await cli("events", "--proxy", "p1", "-o", "json", *url)
    upto = await cli("events", "--proxy", "p1", "-o", "json", "--until", at.isoformat(), *url)
    assert upto.exit_code == 0, upto.output
    types = [json.loads(line)["type"] for line in upto.stdout.splitlines()]
    assert types == ["ProxyDeclared", "CreateInstance", "InstanceObserved", "PhaseChanged"]
    assert len(every.stdout.splitlines()) == len(types) + 1
    before = (at - timedelta(hours=1)).isoformat()
    nothing = await cli("events", "--proxy", "p1", "--until", before, *url)
    assert "no events in PROXY for proxy p1 up to" in nothing.output
    both = await cli("events", "--until", at.isoformat(), "--follow", *url)
    assert both.exit_code == 2
    assert "--follow and --until" in both.output
