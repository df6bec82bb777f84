"""The services on a three-node NATS cluster, when the node leading the PROXY stream is killed.

Three nats-servers from the wheel (tests/support/natscluster.py), the streams created with
`egress-proxies streams init --replicas 3` through the comma-separated URL list, and the services
started as `up` and `run` start them (``run_services``: each logs in as its own user, on any
node): the reconciler and the executor with the fake provider, and two discovery replicas
serving a lease load of crawlers (bench/chaos_load.py). The health service probes through real
proxies, which the fake provider has none of, so the test records each proxy's first verdict
itself, as the health service would.

Then the node leading PROXY is SIGKILLed while leases are being taken and released, and the
test checks:

- the services go on: leases are granted again, and proxies declared after the kill become
  Ready (the time from the kill until the first acknowledged append of a service is printed);
- no acknowledged event is lost: every 201 lease and 204 release is in the LEASE stream as
  answered, and every declared proxy is in PROXY (bench/chaos_check.py, folding with
  projections/lease.py and projections/proxy.py);
- no double lease: no two leases the clients held overlap on one proxy, and the log's fencing
  tokens are the grants' stream sequences, so they strictly increase per proxy;
- the fleet converges: every proxy is Ready;
- the killed node, restarted on its data dir, catches up: its own copy of every stream reaches
  the leader's last sequence, and the leader reports every replica current.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest

from bench import chaos_check as check
from bench.chaos_load import LoadOptions, Record, crawler
from bench.chaos_view import StreamReader, fold_proxies
from commands.declaring import apply
from events import subjects
from events.errors import ConcurrencyError, EventStoreError
from events.schemas import HealthChanged, Phase
from events.store import NewEvent
from events.subjects import LEASE_STREAM, PROXY_STREAM
from projections.proxy import ProxyView
from services.cli.fleet.manifests import parse_resources
from services.discovery.service import DiscoveryService
from services.executor.service import ExecutorService
from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS, ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.service import run_services
from services.runtime.settings.shared import Settings
from services.testing.provider import FakeProvider
from tests.support import markers
from tests.support.lifecycle import FAST, phases
from tests.support.natscluster import NatsCluster, monitor, running_cluster
from tests.support.system import base_env, cli
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

PROXIES = 6
LATE_PROXIES = 2
"""Declared right after the kill: the reconciler and the executor must bring them up."""
LEASES_BEFORE = 20
LEASES_AFTER = 20
NAMESPACE = "crawl"


@pytest.fixture
@markers.starts("a three-node nats-server cluster", marker="reliability")
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with running_cluster(tmp_path / "nats") as started:
        yield started


def doc(name: str) -> str:
    return f"""
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  provider: fake
  placement: {{zone: a}}
"""


async def declare(store: JetStreamEventStore, name: str, *, within: float = 30.0) -> str:
    """Apply one proxy, retrying while the log is between leaders (the append is idempotent)."""
    [resource] = parse_resources(doc(name), "test")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            return (await apply(store, resource)).uid
        except (EventStoreError, nats.errors.Error, TimeoutError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def found_healthy(store: JetStreamEventStore, uid: str) -> None:
    """The first verdict, as the health service appends it once its probe got through."""
    verdict = HealthChanged(healthy=True, reason="Probe", latency_ms=5.0)
    await store.append(subjects.proxy(uid), [NewEvent(verdict, f"cluster-test-health-{uid}")])


@contextlib.asynccontextmanager
async def services(url: str, tmp: Path) -> AsyncIterator[list[DiscoveryService]]:
    """The reconciler, the executor and two discovery replicas in one process, each on its own
    connection as its own NATS user, supervised as `up` supervises them."""
    replicas = [
        DiscoveryService(
            host="127.0.0.1",
            port=0,
            lease_cooldown=0.0,
            expiry_interval=0.2,
            shutdown_timeout=1.0,
        )
        for _ in range(2)
    ]
    executor = ExecutorService(
        None, tmp, 0.2, providers={"fake": FakeProvider(pending_polls=1)}, policy=FAST, ack_wait=5.0
    )
    settings = Settings(nats_url=url, stream_replicas=3, service_name="cluster-test")
    task = asyncio.create_task(
        run_services([ReconcilerService(), executor, *replicas], settings), name="services"
    )
    try:
        await until(
            lambda: task.done() or all(r.listening.is_set() for r in replicas),
            what="discovery listening",
        )
        if task.done():
            await task  # raises what stopped them
        yield replicas
        assert not task.done(), f"the services stopped: {task}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def stream_leader(js_conn: Connection, stream: str) -> str | None:
    try:
        info = await js_conn.js.stream_info(stream)
    except (nats.errors.Error, TimeoutError):
        return None
    return info.cluster.leader if info.cluster else None


async def lead_on(conn: Connection, stream: str, node: str) -> None:
    """Move ``stream``'s leadership to ``node`` (a step-down with a preferred successor)."""
    if await stream_leader(conn, stream) == node:
        return
    request = json.dumps({"placement": {"preferred": node}}).encode()
    reply = await conn.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, timeout=5)
    assert json.loads(reply.data).get("success") is True, reply.data
    await until(lambda: _leader_is(conn, stream, node), timeout=15, what=f"{stream} led by {node}")


async def _leader_is(conn: Connection, stream: str, node: str) -> bool:
    return await stream_leader(conn, stream) == node


def local_last_seqs(node: EmbeddedNatsServer) -> dict[str, int]:
    """The last sequence of each stream in ``node``'s own copy (its monitoring endpoint)."""
    jsz = monitor(node, "/jsz?accounts=true&streams=true")
    seqs: dict[str, int] = {}
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            seqs[stream["name"]] = int(stream["state"]["last_seq"])
    return seqs


async def caught_up(conn: Connection, node: EmbeddedNatsServer) -> bool:
    """``node`` holds every stream up to the leader's last sequence, and the leader counts
    every replica as current."""
    try:
        local = await asyncio.to_thread(local_last_seqs, node)
    except (OSError, ValueError):
        return False
    for spec in STREAMS:
        try:
            info = await conn.js.stream_info(spec.name)
        except (nats.errors.Error, TimeoutError):
            return False
        cluster = info.cluster
        if cluster is None or cluster.leader is None or local.get(spec.name) != info.state.last_seq:
            return False
        peers = cluster.replicas or []
        if len(peers) != 2 or not all(peer.current for peer in peers):
            return False
    return True


def granted(records: list[Record]) -> int:
    return sum(1 for r in records for a in r.acquisitions if a.answer.outcome == check.OK)


async def leases_granted(records: list[Record], n: int, what: str) -> None:
    """Until the clients hold ``n`` granted leases in all; failing, says what they were told."""
    try:
        await until(lambda: granted(records) >= n, timeout=30, what=what)
    except AssertionError as exc:
        answers = [a.answer for r in records for a in r.acquisitions]
        codes = sorted({a.code for a in answers if a.code})
        raise AssertionError(f"{exc}; answers: {check.tally(answers)}, errors: {codes}") from exc


async def test_services_ride_out_the_loss_of_the_proxy_stream_leader(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    env = {**base_env(), "NATS_URL": cluster.url}
    init = await asyncio.to_thread(cli, "streams", "init", "--replicas", "3", env=env, timeout=60)
    assert init.returncode == 0, init.stdout + init.stderr
    assert "PROXY: created (replicas 3)" in init.stdout

    admin = await connect(cluster.url, name="cluster-test-admin")
    store = JetStreamEventStore(admin.nc, admin.js)
    readers: list[StreamReader] = []
    try:
        for spec in STREAMS:
            info = await admin.js.stream_info(spec.name)
            assert info.config.num_replicas == 3, spec.name

        async with services(cluster.url, tmp_path / "executor") as replicas:
            uids = {f"p{i}": await declare(store, f"p{i}") for i in range(PROXIES)}
            await until(
                lambda: _all_ready(store, list(uids.values())), timeout=30, what="proxies Ready"
            )
            for uid in uids.values():
                await found_healthy(store, uid)

            stop = asyncio.Event()
            options = LoadOptions(
                clients=3, ttl=20.0, hold=(0.01, 0.05), timeout=15.0, pause=0.1, max_retry_after=0.2
            )
            records = [Record() for _ in replicas]
            loads = [
                asyncio.create_task(
                    crawler(
                        f"cluster-r{i}-c{c}",
                        replica.bound_port,
                        options,
                        records[i],
                        stop=stop,
                        rng=random.Random(f"{i}-{c}"),
                    )
                )
                for i, replica in enumerate(replicas)
                for c in range(options.clients)
            ]
            try:
                await leases_granted(records, LEASES_BEFORE, "leases before the kill")
                leader = await stream_leader(admin, PROXY_STREAM)
                assert leader is not None
                # The lease appends go through the same failover: LEASE is led by that node too.
                await lead_on(admin, LEASE_STREAM, leader)
                victim = cluster.node_named(leader)
                killed_at = time.time()
                await victim.kill()

                # The reconciler and the executor must take up proxies declared now.
                late = {f"late{i}": await declare(store, f"late{i}") for i in range(LATE_PROXIES)}
                declared_after = time.time() - killed_at
                uids |= late
                await until(
                    lambda: _new_leader(admin, leader), timeout=30, what="a new PROXY leader"
                )
                elected_after = time.time() - killed_at
                await until(
                    lambda: _all_ready(store, list(uids.values())),
                    timeout=30,
                    what="every proxy Ready after the failover",
                )
                ready_after = time.time() - killed_at
                for uid in late.values():
                    await found_healthy(store, uid)
                before = granted(records)
                await leases_granted(records, before + LEASES_AFTER, "leases after the kill")
            finally:
                stop.set()
                await asyncio.gather(*loads)

            acquisitions = [a for r in records for a in r.acquisitions]
            releases = [c for r in records for c in r.releases]
            reports = [c for r in records for c in r.reports]
            after_kill = [
                a.answer.answered_at - killed_at
                for a in acquisitions
                if a.answer.outcome == check.OK
                and a.answer.sent_at >= killed_at
                and a.answer.answered_at is not None
            ]
            assert after_kill, "no lease was granted after the kill"
            print(
                f"\nfailover: killed {leader} (PROXY and LEASE leader); new PROXY leader after "
                f"{elected_after:.2f} s; first lease acknowledged after {min(after_kill):.2f} s; "
                f"late proxies declared after {declared_after:.2f} s, every proxy Ready after "
                f"{ready_after:.2f} s; {len(acquisitions)} lease requests, "
                f"{granted(records)} granted"
            )

        await cluster.start_node(victim)
        await until(lambda: caught_up(admin, victim), timeout=30, what=f"{leader} caught up")

        leases = StreamReader(admin, LEASE_STREAM, "lease.>")
        proxies = StreamReader(admin, PROXY_STREAM, "proxy.>")
        readers += [leases, proxies]
        log = check.fold_log(await leases.read_all(timeout=20))
        views: dict[str, ProxyView] = {}
        fold_proxies(views, await proxies.read_all(timeout=20))
        applied = {uid: f"{NAMESPACE}/{name}" for name, uid in uids.items()}
        results = [
            check.check_double_leases(acquisitions, releases, log),
            check.check_lost(acquisitions, releases, reports, log, applied=applied, proxies=views),
        ]
        for result in results:
            assert result.ok, f"{result.name}: {result.value}\n" + "\n".join(result.evidence)
        assert all(views[uid].phase is Phase.READY for uid in uids.values())
        assert len(log.grants) >= LEASES_BEFORE + LEASES_AFTER
    finally:
        for reader in readers:
            await reader.close()
        await admin.close()


async def _all_ready(store: JetStreamEventStore, uids: list[str]) -> bool:
    try:
        return all(p is Phase.READY for p in (await phases(store, uids)).values())
    except (EventStoreError, nats.errors.Error, TimeoutError):
        return False


async def _new_leader(conn: Connection, old: str) -> bool:
    leader = await stream_leader(conn, PROXY_STREAM)
    return leader is not None and leader != old


async def test_a_replicated_stream_refuses_a_stale_append_as_a_conflict(
    cluster: NatsCluster,
) -> None:
    """A replicated stream answers a wrong expected sequence with its own error code (10164,
    not 10071): the store must still report a conflict, and recognise its own earlier append."""
    conn = await connect(cluster.url, name="cluster-test-conflict")
    try:
        await ensure_streams(conn.js, 3)
        store = JetStreamEventStore(conn.nc, conn.js)
        aggregate = subjects.proxy("conflict")
        first = HealthChanged(healthy=True, reason="Probe", latency_ms=1.0)
        stored = await store.append(aggregate, [NewEvent(first, "first")], expected_seq=0)
        retried = await store.append(aggregate, [NewEvent(first, "first")], expected_seq=0)
        assert (retried.seqs, retried.duplicates) == (stored.seqs, 1)
        other = HealthChanged(healthy=False, reason="Probe", latency_ms=1.0)
        with pytest.raises(ConcurrencyError):
            await store.append(aggregate, [NewEvent(other, "other")], expected_seq=0)
    finally:
        await conn.close()
