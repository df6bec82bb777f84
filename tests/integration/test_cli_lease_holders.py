"""``lease renew``, ``lease list --holder``, ``lease release --holder`` and acquire's ``--exclude``,
``--proxy``, ``--target`` and ``--wait``, against a real discovery service: what a crawler's
operator types after a crash, or to keep a session's IP, and the exit codes a script acts on."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased, LeaseRenewed
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, grant_seq, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_renew_keeps_the_token_and_moves_the_end(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with discovery(nats_server.url, max_lease_ttl=3600) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "--ttl", "60", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        lease = json.loads(got.stdout)
        renewed = await cli("lease", "renew", lease["id"], "--ttl", "30m", "-o", "json", **env)
        assert renewed.exit_code == 0, renewed.output
        answer = json.loads(renewed.stdout)
        assert (answer["id"], answer["fencingToken"]) == (lease["id"], lease["fencingToken"])
        assert datetime.fromisoformat(answer["expiresAt"]) > datetime.fromisoformat(
            lease["expiresAt"]
        )
        table = await cli("lease", "renew", lease["id"], "--ttl", "20m", **env)
        assert table.exit_code == 0, table.output
        rows = dict(line.split(None, 1) for line in table.stdout.splitlines())
        assert rows["lease"].strip() == lease["id"]
        assert rows["ttl"].strip() == "1200s"

        assert (await cli("lease", "release", lease["id"], **env)).exit_code == 0
        gone = await cli("lease", "renew", lease["id"], **env)
        assert gone.exit_code == 7, gone.output
        assert "Traceback" not in gone.output
    history = await jetstream_store.read(subjects.lease("p1"))
    kinds = [type(r.event) for r in history.events]
    assert kinds == [LeaseAcquired, LeaseRenewed, LeaseRenewed, LeaseReleased]


async def test_a_holder_finds_and_frees_its_leases(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid, {"country": "de"})
    async with discovery(nats_server.url) as (_, base):
        env = {"DISCOVERY_URL": base}
        mine = []
        for _ in range(2):
            got = await cli("lease", "acquire", "--holder", "crawler-1", "-o", "json", **env)
            assert got.exit_code == 0, got.output
            mine.append(json.loads(got.stdout)["id"])
        other = await cli("lease", "acquire", "--holder", "crawler-2", "-o", "json", **env)
        assert other.exit_code == 0, other.output

        listed = await cli("lease", "list", "--holder", "crawler-1", "-o", "json", **env)
        assert listed.exit_code == 0, listed.output
        assert [item["id"] for item in json.loads(listed.stdout)["items"]] == mine
        table = await cli("lease", "list", "--holder", "crawler-1", **env)
        assert table.stdout.split()[:4] == ["LEASE", "PROXY", "EXPIRES", "TOKEN"]
        assert all(lease_id in table.stdout for lease_id in mine)

        freed = await cli("lease", "release", "--holder", "crawler-1", "-o", "json", **env)
        assert freed.exit_code == 0, freed.output
        assert json.loads(freed.stdout) == {"holder": "crawler-1", "released": 2}
        empty = await cli("lease", "list", "--holder", "crawler-1", **env)
        assert "no active lease for crawler-1" in empty.stdout
        still = await cli("lease", "list", "--holder", "crawler-2", "-o", "json", **env)
        assert len(json.loads(still.stdout)["items"]) == 1

        both = await cli("lease", "release", "x", "--holder", "crawler-2", **env)
        assert both.exit_code == 2
        assert "one of them" in both.stderr


async def test_exclude_and_a_sticky_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"}, port=3001)
    await ready_proxy(jetstream_store, "p2", {"country": "de"}, port=3002)
    async with discovery(nats_server.url, lease_cooldown=0) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "--exclude", "p1", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        first = json.loads(got.stdout)
        assert first["proxy"]["uid"] == "p2"
        # p2 is leased and p1 excluded: nothing is free, but something could be (503: exit 6).
        busy = await cli("lease", "acquire", "--exclude", "p1", **env)
        assert busy.exit_code == 6, busy.output

        sticky_busy = await cli("lease", "acquire", "--proxy", "p2", **env)
        assert sticky_busy.exit_code == 6, sticky_busy.output
        assert (await cli("lease", "release", first["id"], **env)).exit_code == 0
        sticky = await cli("lease", "acquire", "--proxy", "p2", "-o", "json", **env)
        assert sticky.exit_code == 0, sticky.output
        assert json.loads(sticky.stdout)["proxy"]["uid"] == "p2"

        unknown = await cli("lease", "acquire", "--proxy", "nope", **env)
        assert unknown.exit_code == 2, unknown.output
        assert "Traceback" not in unknown.output


async def test_a_target_skips_blocked_proxies_and_wait_outlasts_a_lease(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with discovery(nats_server.url, lease_cooldown=0) as (service, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "--target", "shop.example", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        lease_id = json.loads(got.stdout)["id"]
        said = ("lease", "report", lease_id, "--outcome", "blocked", "--target", "shop.example")
        assert (await cli(*said, **env)).exit_code == 0
        assert (await cli("lease", "release", lease_id, **env)).exit_code == 0
        blocked = await cli("lease", "acquire", "--target", "https://shop.example/x", **env)
        assert blocked.exit_code == 6, blocked.output
        assert "in back-off for the target" in blocked.stderr
        other = await cli("lease", "acquire", "--target", "other.example", "-o", "json", **env)
        assert other.exit_code == 0, other.output

        assert service.api is not None
        queue = service.api.leases.queue
        waiting = asyncio.create_task(cli("lease", "acquire", "--wait", "30s", "-o", "json", **env))
        await until(lambda: queue.waiting == 1, what="the CLI's request to wait")
        # Released through the API, not a second CLI run: click's runner swaps sys.stdout and
        # os.environ for the whole process, so two runs at once lose the waiting one's output
        # and can leave the other's variables (OTEL_SDK_DISABLED) behind for later tests.
        async with httpx.AsyncClient(base_url=base) as api:
            released = await api.delete(f"/v1/leases/{json.loads(other.stdout)['id']}")
        assert released.status_code == 204, released.text
        waited = await waiting
        assert waited.exit_code == 0, waited.output
        # The third lease on p1: its token is above the second's, and is its grant's sequence.
        token = json.loads(waited.stdout)["fencingToken"]
        assert (
            token
            > json.loads(other.stdout)["fencingToken"]
            > json.loads(got.stdout)["fencingToken"]
        )
        assert token == await grant_seq(jetstream_store, "p1", json.loads(waited.stdout)["id"])

        too_long = await cli("lease", "acquire", "--wait", "61s", **env)
        assert too_long.exit_code == 2
        assert "--wait" in too_long.stderr
