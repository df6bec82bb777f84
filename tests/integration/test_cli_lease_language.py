"""The ``lease`` commands speak the CLI's one language
(docs/decisions/0147-the-cli-as-one-language.md): ``acquire --pool NAMESPACE/NAME`` (or ``-n``)
as the API and the client take it, and ``list`` shows each proxy URL whole, however narrow the
terminal."""

from __future__ import annotations

import json

import pytest

from events import subjects
from events.lease import LeaseAcquired
from events.poolresource import pool_uid
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, ready_proxy
from tests.support.discovery_pools import declare_pool, member, member_proxy

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

DE = pool_uid("crawl", "de")
DE_MEMBER = member("de", "crawl", DE, 0, "local")


async def test_acquire_leases_a_member_of_the_pool_named(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await declare_pool(jetstream_store, DE, "crawl", "de", (DE_MEMBER,))
    await member_proxy(jetstream_store, "de", DE_MEMBER)
    # The same attributes in another namespace: never a member of crawl/de.
    await ready_proxy(
        jetstream_store, "stranger", {"country": "de", "pool": "de"}, namespace="other"
    )
    async with discovery(nats_server.url) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "--pool", "crawl/de", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        lease = json.loads(got.stdout)
        assert lease["proxy"]["uid"] == DE_MEMBER.uid

        # NAME with -n names the same pool; its only member is leased, so the answer is the
        # pool's 503 (exit 6), not the proxy of the same attributes in another namespace.
        busy = await cli("lease", "acquire", "--pool", "de", "-n", "crawl", **env)
        assert busy.exit_code == 6, busy.output
        assert "pool" in busy.stderr
        # NAME alone is the namespace default, where there is no such pool: the API's 404 names
        # the pool of that name that exists.
        absent = await cli("lease", "acquire", "--pool", "de", **env)
        assert absent.exit_code != 0
        assert "crawl/de" in absent.stderr, absent.output
        clash = await cli("lease", "acquire", "--pool", "crawl/de", "-n", "other", **env)
        assert clash.exit_code == 2
        assert "give one of them" in clash.stderr
        stray = await cli("lease", "acquire", "-n", "crawl", **env)
        assert stray.exit_code == 2
        assert "--pool" in stray.stderr
        assert (await cli("lease", "release", lease["id"], **env)).exit_code == 0

    history = await jetstream_store.read(subjects.lease(DE_MEMBER.uid))
    claim = history.events[0].event
    assert isinstance(claim, LeaseAcquired)
    assert claim.selector == {"pool": "de"}


async def test_list_shows_each_url_whole_on_a_narrow_terminal(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"}, port=31280)
    async with discovery(nats_server.url) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "--holder", "crawler-1", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        lease = json.loads(got.stdout)
        url = lease["proxy"]["url"]
        table = await cli("lease", "list", "--holder", "crawler-1", COLUMNS="50", **env)
        assert table.exit_code == 0, table.output
        assert set(table.stdout.split()[:4]) <= {"LEASE", "PROXY", "EXPIRES", "TOKEN"}
        assert f"{lease['id']}  {url}" in table.stdout.splitlines()
        assert "…" not in table.stdout
        as_json = await cli("lease", "list", "--holder", "crawler-1", "-o", "json", **env)
        assert json.loads(as_json.stdout)["items"][0]["proxy"]["url"] == url
