"""Pools from the CLI against a real nats-server: apply, get pools, get -l, describe, scale and
delete (--wait). No pool controller runs: its decisions and its members are appended here as it
would append them, so what is tested is what lands in the log and how the views show it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from events import subjects
from events.customresource import cli_uid
from events.lease import LeaseAcquired
from events.pool import PoolDecided, PoolDeletionRequested, PoolFigures, PoolMember, PoolRemoved
from events.poolresource import member_name, pool_uid
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import ready_proxy
from tests.support.pool_yaml import manifest, pool, proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


async def members_decided(
    store: JetStreamEventStore, name: str, count: int, message: str = ""
) -> list[PoolMember]:
    """What the pool controller appends for a scale-up, then its members as it declares them
    (Ready and healthy here, as the reconciler and the prober would leave them)."""
    uid = pool_uid("crawl", name)
    added = []
    for ordinal in range(count):
        named = member_name(name, uid, ordinal)
        added.append(
            PoolMember(ordinal=ordinal, name=named, uid=cli_uid("crawl", named), provider="local")
        )
    decided = PoolDecided(
        uid=uid,
        reason="ScaleUp",
        message=message or f"added {count} (0 -> {count} of 3)",
        added=tuple(added),
        figures=PoolFigures(desired=3),
        generation=1,
    )
    await store.append(subjects.pool(uid), [NewEvent(decided, f"decided-{uid}-{count}")])
    for member in added:
        attributes = {"country": "de", "pool": name}
        await ready_proxy(store, member.uid, attributes, name=member.name)
    return added


async def test_a_pool_applied_beside_a_proxy_is_listed_described_and_scaled(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    path = manifest(tmp_path, proxy("solo"), pool())
    applied = await cli("apply", "-f", path, *url)
    assert applied.exit_code == 0, applied.output
    assert "proxy crawl/solo created" in applied.output
    assert "proxypool crawl/de created" in applied.output
    again = await cli("apply", "-f", path, *url)
    assert "proxypool crawl/de unchanged" in again.output
    empty = await cli("get", "pools", *url)
    assert empty.exit_code == 0, empty.output
    header, row = empty.output.splitlines()
    assert header.split() == [
        "NAMESPACE",
        *("NAME", "DESIRED", "MEMBERS", "READY", "HEALTHY", "LEASED", "AGE"),
    ]
    assert row.split()[:7] == ["crawl", "de", "3", "0", "0", "0", "0"]

    first, second = await members_decided(jetstream_store, "de", 2)
    claim = LeaseAcquired(lease_id="lease-1", proxy_uid=first.uid, holder="spider", ttl_seconds=600)
    await jetstream_store.append(subjects.lease(first.uid), [NewEvent(claim, "lease-1")])

    listed = await cli("get", "pools", *url)
    assert listed.output.splitlines()[1].split()[:7] == ["crawl", "de", "3", "2", "2", "2", "1"]
    wide = await cli("get", "pools", "-o", "wide", *url)
    assert "ScaleUp: added 2 (0 -> 2 of 3)" in wide.output
    assert pool_uid("crawl", "de") in wide.output
    items = json.loads((await cli("get", "pools", "-o", "json", *url)).output)["items"]
    [item] = items
    assert item["figures"] == {
        "desired": 3,
        "members": 2,
        "ready": 2,
        "healthy": 2,
        "leased": 1,
        "rotating": 0,
        "waiting": 0,
        "refused": {},
        "unserved": 0,
    }
    assert item["spec"]["maxAgeSeconds"] == 6 * 3600
    assert [m["name"] for m in item["members"]] == [first.name, second.name]
    assert [m["leased"] for m in item["members"]] == [True, False]

    members = await cli("get", "-l", "pool=de", *url)
    assert members.exit_code == 0, members.output
    assert first.name in members.output
    assert second.name in members.output
    assert "solo" not in members.output
    narrowed = await cli("get", "-l", "pool=de,country=fr", *url)
    assert "No proxies matching pool=de,country=fr." in narrowed.output

    described = await cli("describe", "pool", "de", "-n", "crawl", *url)
    assert described.exit_code == 0, described.output
    # NAMESPACE/NAME, as a proxy is named (crawl/solo), says the same.
    same = (await cli("describe", "pool", "crawl/de", *url)).output
    assert re.sub(r"\d+[smhd]\b", "", same) == re.sub(r"\d+[smhd]\b", "", described.output)
    text = described.output
    for said in ("Namespace:", "crawl", "Max age:", "6h", "Attributes:", "country=de"):
        assert said in text
    member_line = next(line for line in text.splitlines() if first.name in line)
    assert member_line.split()[:6] == [first.name, "local", "Ready", "yes", "yes", "yes"]
    assert "Reason:" in text
    assert "ScaleUp" in text
    assert "desired 3, members 2, ready 2, healthy 2, leased 1" in text  # now
    assert "desired 3, members 0, ready 0" in text  # what the decision saw
    assert "Decisions (last 1 of 1):" in text

    before_scale = datetime.now(UTC).isoformat()  # the server's clock is this machine's
    scaled = await cli("scale", "pool", "crawl/de", "--replicas", "5", *url)
    assert scaled.exit_code == 0, scaled.output
    assert "proxypool crawl/de scaled" in scaled.output
    assert (await cli("get", "pools", *url)).output.splitlines()[1].split()[2] == "5"
    before = await cli("get", "pools", "--at", before_scale, *url)
    assert before.exit_code == 0, before.output
    assert before.output.splitlines()[1].split()[:7] == ["crawl", "de", "3", "2", "2", "2", "1"]
    assert (
        "5 (scaled; the spec says 3)"
        in (await cli("describe", "pool", "de", "-n", "crawl", *url)).output
    )


async def test_hostile_input_is_refused_naming_the_flag_and_nothing_lands(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    assert (await cli("apply", "-f", manifest(tmp_path, pool()), *url)).exit_code == 0
    for replicas in ("10001", "-1", "three"):
        refused = await cli("scale", "pool", "de", "-n", "crawl", "--replicas", replicas, *url)
        assert refused.exit_code == 2, refused.output
        assert "--replicas" in refused.output
    long_name = "a" * 60
    scaled = await cli("scale", "pool", long_name, "--replicas", "1", *url)
    assert scaled.exit_code == 2
    assert "1-57 lowercase letters" in scaled.output
    applied = await cli("apply", "-f", manifest(tmp_path, pool(long_name)), *url)
    assert applied.exit_code == 2
    assert "document 1: metadata.name: use 1-57" in applied.output
    assert (await jetstream_store.read(subjects.pool(pool_uid("crawl", long_name)))).events == []
    history = await jetstream_store.read(subjects.pool(pool_uid("crawl", "de")))
    assert len(history.events) == 1  # the declaration alone: no scale landed

    absent = await cli("scale", "pool", "fr", "-n", "crawl", "--replicas", "1", *url)
    assert absent.exit_code == 2
    assert "proxypool crawl/fr: no such pool" in absent.output
    assert (await cli("describe", "pool", "fr", "-n", "crawl", *url)).exit_code == 2
    # A missing pool's error names what exists under that name, in the discovery API's words.
    for command in (("describe", "pool", "de"), ("scale", "pool", "de", "--replicas", "1")):
        wrong = await cli(*command, *url)  # namespace "default"
        assert wrong.exit_code == 2, wrong.output
        assert "proxypool default/de: no such pool; pools named 'de': crawl/de" in wrong.output
    elsewhere = await cli("describe", "pool", "crawl/fr", *url)
    assert "no such pool; the pools are crawl/de" in elsewhere.output
    # Both spellings of a namespace at once must agree.
    clash = await cli("describe", "pool", "crawl/de", "-n", "other", *url)
    assert clash.exit_code == 2
    assert "give one of them" in clash.output
    assert (await cli("describe", "pool", "crawl/de", "-n", "crawl", *url)).exit_code == 0

    # What the log says is shown, never obeyed by the terminal.
    await members_decided(jetstream_store, "de", 1, message="\x1b[2Jwiped\u202e")
    described = await cli("describe", "pool", "de", "-n", "crawl", *url)
    assert "\x1b" not in described.output
    assert "\\x1b[2Jwiped\\u202e" in described.output
    # No line is padded to the width of a pipe: a note is as long as it is.
    assert [line for line in described.output.splitlines() if line != line.rstrip()] == []


async def test_delete_pool_waits_for_its_removal_and_exits_10_when_it_does_not_come(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    path = manifest(tmp_path, pool("de"), pool("fr", replicas=0))
    assert (await cli("apply", "-f", path, *url)).exit_code == 0
    uid = pool_uid("crawl", "de")
    aggregate = subjects.pool(uid)

    waiting = asyncio.create_task(
        cli("delete", "pool", "crawl/de", "--wait", "--timeout", "60", *url)
    )

    async def requested() -> bool:
        events = [r.event for r in (await jetstream_store.read(aggregate)).events]
        return any(isinstance(e, PoolDeletionRequested) for e in events)

    await until(requested, what="the deletion of crawl/de")
    assert not waiting.done()
    await jetstream_store.append(aggregate, [NewEvent(PoolRemoved(uid=uid), f"removed-{uid}")])
    deleted = await waiting
    assert deleted.exit_code == 0, deleted.output
    assert "proxypool crawl/de deleted" in deleted.output
    assert (
        (await cli("delete", "pool", "de", "-n", "crawl", *url))
        .output.strip()
        .endswith("proxypool crawl/de absent")
    )

    clash = await cli("delete", "pool", "crawl/fr", "-n", "other", *url)
    assert clash.exit_code == 2
    assert "give one of them" in clash.output
    stuck = await cli("delete", "pool", "fr", "-n", "crawl", "--wait", "--timeout", "1", *url)
    assert stuck.exit_code == 10, stuck.output
    assert "not removed within 1s: proxypool crawl/fr" in stuck.output
    assert "pool controller running" in stuck.output
    listed = await cli("get", "pools", "-o", "wide", *url)
    assert "Deleting" in listed.output
    assert "crawl/de" not in listed.output
    assert "de " not in listed.output.splitlines()[1]


async def test_apply_wait_ends_once_a_pool_has_its_members_and_delete_f_deletes_pools(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    empty = manifest(tmp_path, pool("idle", replicas=0))
    waited = await cli("apply", "-f", empty, "--wait", "--timeout", "30", *url)
    assert waited.exit_code == 0, waited.output
    short = await cli(
        "apply", "-f", manifest(tmp_path, pool("de")), "--wait", "--timeout", "1", *url
    )
    assert short.exit_code == 10, short.output
    assert "not Ready and healthy within 1s: proxypool crawl/de (0 of 3" in short.output
    deleted = await cli("delete", "-f", empty, *url)
    assert deleted.exit_code == 0, deleted.output
    assert "proxypool crawl/idle deleted" in deleted.output
    everything = await cli("delete", "--all", *url)
    assert "proxypool crawl/de deleted" in everything.output
    assert "proxypool crawl/idle deleting" in everything.output
