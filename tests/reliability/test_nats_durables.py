"""Each service's durable consumer is its own: against a real nats-server, every service user is
refused every call that would change, delete, drain or ack another service's durable, by every
subject the JetStream API offers for it, and each can still read the way the runtime does (its
own durable: tests/reliability/test_nats_auth.py; ephemeral pull and push followers: here).
docs/decisions/0093-each-service-s-durable.md."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats.errors
import pytest
from nats.aio.msg import Msg

from events import subjects
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.eventlog.push import OrderedPush
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.consumer import ConsumerSpec
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import CONSUMERS, READS, WRITES, durable_denies, permissions
from tests.support.natsclient import client
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

SERVICES = sorted(WRITES)
DURABLES = sorted(CONSUMERS)
DECLARED = ("proxy.*.cmd",)
RETARGETED = "proxy.*.gone"


def spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(stream=CONSUMERS[durable], durable=durable, filter_subjects=DECLARED)


def others(user: str) -> list[str]:
    return [d for d in DURABLES if d != user]


def create_body(durable: str, *, named: bool = True) -> bytes:
    """A create request that would retarget ``durable``'s filter, were it allowed."""
    config: dict[str, Any] = {"ack_policy": "explicit", "filter_subject": RETARGETED}
    if named:
        config |= {"name": durable, "durable_name": durable}
    else:
        config["name"] = durable  # the legacy ephemeral form updates a consumer of that name
    return json.dumps({"stream_name": CONSUMERS[durable], "config": config}).encode()


def probes(durable: str) -> list[tuple[str, bytes]]:
    """Every API subject that reaches ``durable``: create or update (named, with a filter in
    the subject, legacy durable, legacy ephemeral naming it in the body), delete, pull, ack."""
    stream = CONSUMERS[durable]
    pull = json.dumps({"batch": 1, "expires": 500_000_000}).encode()
    return [
        (f"$JS.API.CONSUMER.CREATE.{stream}.{durable}", create_body(durable)),
        (f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{RETARGETED}", create_body(durable)),
        (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}", create_body(durable)),
        (f"$JS.API.CONSUMER.CREATE.{stream}", create_body(durable, named=False)),
        (f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", pull),
        (f"$JS.ACK.{stream}.{durable}.1.1.1.1.0", b""),
        (f"$JS.API.CONSUMER.DELETE.{stream}.{durable}", b""),
    ]


async def durable_state(conn: Connection) -> dict[str, Any]:
    found = {}
    for durable in DURABLES:
        info = await conn.js.consumer_info(CONSUMERS[durable], durable)
        found[durable] = (
            info.config.as_dict(),
            info.created,
            info.delivered,
            info.ack_floor,
            info.num_ack_pending,
            info.num_pending,
        )
    return found


@pytest.fixture
async def durables(conn: Connection) -> Connection:
    """Each service's durable as its loop declares it, with messages waiting."""
    for i in range(3):
        await conn.js.publish(f"proxy.p{i}.cmd", b"{}")
    for durable in DURABLES:
        await conn.js.add_consumer(CONSUMERS[durable], spec(durable).config())
    return conn


def test_each_service_is_denied_the_other_services_durables_and_no_legacy_create() -> None:
    for user in SERVICES:
        granted = permissions(user)
        assert granted is not None
        allow, deny = granted["publish"]["allow"], granted["publish"]["deny"]
        assert deny == durable_denies(user)
        assert "$JS.API.CONSUMER.CREATE.*" not in allow, user
        assert not any(".DURABLE.CREATE." in s for s in allow), user
        for durable in DURABLES:
            mine = [p for p in deny if p.split(".")[-1] == durable or f".{durable}." in p]
            assert bool(mine) == (durable != user), (user, durable, mine)
    assert set(READS) <= set(permissions("gc")["publish"]["allow"])  # type: ignore[index]


@pytest.mark.parametrize("user", SERVICES)
async def test_each_service_is_refused_every_call_on_another_services_durable(
    nats_server: EmbeddedNatsServer, durables: Connection, user: str
) -> None:
    before = await durable_state(durables)
    sent = [probe for durable in others(user) for probe in probes(durable)]
    assert sent
    async with client(nats_server.url_for(user)) as c:
        for subject, body in sent:
            if subject.startswith("$JS.ACK."):
                await c.nc.publish(subject, body)
                continue
            # A refused request gets no reply; an allowed one would be carried out.
            with pytest.raises(nats.errors.Error):
                await c.nc.request(subject, body, timeout=0.5)
        await c.nc.flush()

        async def all_refused() -> bool:
            return all(c.refused(subject) for subject, _ in sent)

        await until(all_refused, timeout=10, what="the server to refuse every call")
    assert await durable_state(durables) == before


@pytest.mark.parametrize("user", SERVICES)
async def test_wildcards_in_a_subject_reach_no_durable(
    nats_server: EmbeddedNatsServer, durables: Connection, user: str
) -> None:
    """A subject with wildcards where the name goes passes the deny rules, which name the
    durables; the server then refuses the name itself, or finds no consumer by it."""
    before = await durable_state(durables)
    async with client(nats_server.url_for(user)) as c:
        for durable in others(user):
            stream = CONSUMERS[durable]
            for name in ("*", ">"):
                for subject in (
                    f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                    f"$JS.API.CONSUMER.DELETE.{stream}.{name}",
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                ):
                    try:
                        reply = await c.nc.request(subject, create_body(durable), timeout=0.5)
                    except nats.errors.Error:
                        continue
                    assert b'"error"' in reply.data, (subject, reply.data)
    assert await durable_state(durables) == before


@pytest.mark.parametrize("user", SERVICES)
async def test_each_service_still_reads_with_ephemeral_consumers_and_sees_every_durable(
    nats_server: EmbeddedNatsServer, durables: Connection, user: str
) -> None:
    """The followers the runtime uses create their consumers under a name in the subject: an
    ordered pull (nats-py names it) and the push follower (which names its own). Consumer info
    stays open: discovery reports each durable's position."""
    mine = await connect(nats_server.url, credentials=nats_server.credentials_for(user))
    try:
        reader = OrderedPull(mine.js, subjects.PROXY_STREAM, "proxy.*.cmd")
        assert len(await reader.fetch(timeout=5)) == 3
        await reader.close()
        got: list[Msg] = []
        follower = OrderedPush(mine.nc, mine.js, subjects.PROXY_STREAM, "proxy.*.cmd", got.append)
        following = asyncio.create_task(follower.run(after=0))
        try:
            await until(lambda: len(got) == 3, timeout=10, what="the push follower's events")
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        assert follower.restarts == 0
        for durable in DURABLES:
            info = await mine.js.consumer_info(CONSUMERS[durable], durable)
            assert info.num_pending == 3
    finally:
        await mine.close()
