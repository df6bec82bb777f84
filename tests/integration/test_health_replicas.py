"""Two health replicas share the proxies through NATS KV membership; a dead one's share moves."""

from __future__ import annotations

import collections

import pytest

from services.health.assign import owner
from services.health.service import HealthService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.health import (
    Replica,
    declare_ready,
    fast_check,
    health_events,
    recording_target,
    start_replica,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration

UIDS = [f"r{i}" for i in range(8)]
NAMES = ("replica-a", "replica-b")


def probes(replica: Replica) -> collections.Counter[str]:
    prober = replica.service.prober
    return collections.Counter() if prober is None else collections.Counter(prober.probes)


def members(replica: Replica) -> tuple[str, ...]:
    membership = replica.service.membership
    return () if membership is None else membership.members


async def test_two_replicas_split_the_proxies_and_one_takes_over_when_the_other_dies(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    split = {name: {uid for uid in UIDS if owner(uid, NAMES) == name} for name in NAMES}
    assert all(split.values()), "the test needs both replicas to own something"
    async with recording_target() as target:
        # The origin doubles as the proxy: it answers absolute-URI requests like one.
        proxy_url = f"http://127.0.0.1:{target.port}"
        for uid in UIDS:
            await declare_ready(jetstream_store, uid, proxy_url, fast_check(target.url()))
        a, b = [
            await start_replica(
                nats_server.url,
                HealthService(check_url=target.url(), heartbeat=0.2, replica_id=name),
            )
            for name in NAMES
        ]
        try:

            async def both_see_both() -> bool:
                return members(a) == members(b) == NAMES

            await until(both_see_both)

            async def owned_as_split() -> bool:
                pa, pb = a.service.prober, b.service.prober
                return (
                    pa is not None
                    and pb is not None
                    and pa.owned == split[NAMES[0]]
                    and pb.owned == split[NAMES[1]]
                )

            await until(owned_as_split)
            before_a, before_b = probes(a), probes(b)

            async def every_proxy_probed(times: int) -> bool:
                total = probes(a) + probes(b)
                return all(total[uid] - before_a[uid] - before_b[uid] >= times for uid in UIDS)

            await until(lambda: every_proxy_probed(5))
            by_a, by_b = probes(a) - before_a, probes(b) - before_b
            assert set(by_a) == split[NAMES[0]]
            assert set(by_b) == split[NAMES[1]]
            assert not set(by_a) & set(by_b), "a proxy was probed by both replicas"

            await b.crash()

            async def a_owns_everything() -> bool:
                return (
                    members(a) == (NAMES[0],)
                    and a.service.prober is not None
                    and (a.service.prober.owned == set(UIDS))
                )

            await until(a_owns_everything)
            taken = probes(a)
            await until(
                lambda: _all_probed_since(a, taken, times=3),
            )
            for uid in UIDS:
                # One first verdict each, whichever replica reached it: no duplicates.
                assert [e.healthy for e in await health_events(jetstream_store, uid)] == [True]
        finally:
            await a.stop()
            await b.stop()


async def _all_probed_since(replica: Replica, since: collections.Counter[str], times: int) -> bool:
    now = probes(replica)
    return all(now[uid] - since[uid] >= times for uid in UIDS)
