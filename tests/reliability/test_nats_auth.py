"""Only the system writes the log: NATS users and permissions, against real nats-servers.

Every service logs in as its own user, which may publish only the subjects that service writes.
The table in ``services.runtime.nats.users`` is checked three ways: against the code (which events
each service constructs), against a real server (what each user is refused, and that each can still
do its whole job), and, in tests/unit/test_deploy.py and test_nats_credentials.py, against the
bundled configurations.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import get_args

import nats
import nats.errors
import pytest
from nats.js.errors import NotFoundError

from events import subjects
from events.errors import StoreUnavailable
from events.schemas import Event, HealthChanged, PoolEvent
from events.store import NewEvent
from services.discovery.views import VIEWS_BUCKET
from services.gc.lock import LOCK_BUCKET, SweepLock
from services.health.assign import BUCKET, Membership
from services.reconciler.cache import STATES_BUCKET
from services.reconciler.pure.view import ProxyState
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.eventlog.snapshots import SnapshotStore
from services.runtime.eventlog.streams import STREAMS, ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.consumer import ConsumerLoop, ConsumerSpec, Delivery, GiveUp, Outcome
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import (
    CHECKPOINT_BUCKETS,
    CONSUMERS,
    KV_BUCKETS,
    WRITES,
    permissions,
)
from tests.support.natsclient import client
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(WRITES)

# Subjects some user must not publish: every place in the log, the KV buckets, other consumers'
# acks, and the JetStream API calls that delete or rewrite what is stored.
PROBES = (
    *(f"proxy.p1.{category}" for category in subjects.PROXY_CATEGORIES),
    *(f"pool.p1.{category}" for category in subjects.POOL_CATEGORIES),
    "lease.p1",
    "demand.p1",
    "traffic.p1",
    "gc.local",
    *(f"deadletter.{service}" for service in SERVICES),
    *(f"$KV.{bucket}.k" for bucket in KV_BUCKETS.values()),
    *(f"$KV.{bucket}.k" for bucket in CHECKPOINT_BUCKETS.values()),
    *(f"$JS.ACK.PROXY.{durable}.1.1.1.1.0" for durable in CONSUMERS),
    "$JS.API.STREAM.DELETE.PROXY",
    "$JS.API.STREAM.PURGE.DEADLETTER",
    "$JS.API.STREAM.UPDATE.LEASE",
    "$JS.API.STREAM.MSG.DELETE.GC",
    "$JS.API.STREAM.CREATE.ELSEWHERE",
    "$JS.API.ACCOUNT.PURGE.ALL",
)
NEVER = tuple(p for p in PROBES if p.startswith("$JS.API."))
"""No service may call these; only the admin."""


def matches(pattern: str, subject: str) -> bool:
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or token not in ("*", got[i]):
            return False
    return len(want) == len(got)


def allowed(user: str, subject: str) -> bool:
    granted = permissions(user)
    if granted is None:
        return True
    rules = granted["publish"]
    denied = any(matches(p, subject) for p in rules.get("deny", []))
    return not denied and any(matches(p, subject) for p in rules["allow"])


def concrete(pattern: str) -> str:
    return pattern.replace("*", "p1").replace(">", "k")


async def as_user(server: EmbeddedNatsServer, user: str) -> tuple[Connection, JetStreamEventStore]:
    """The runtime's own connection, logged in as ``user`` (as ``up`` and ``run`` do)."""
    conn = await connect(server.url, credentials=server.credentials_for(user))
    return conn, JetStreamEventStore(conn.nc, conn.js)


# ----------------------------------------------------------------------------- the table vs code


def constructed(paths: list[Path]) -> set[str]:
    """Names of the classes the code calls (a ``case X()`` pattern is no call)."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                found.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return found


def event_classes() -> dict[str, str]:
    found, todo = {}, list(Event.__subclasses__())
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls.category
        todo += cls.__subclasses__()
    return found


POOL_EVENTS = frozenset(cls.__name__ for cls in get_args(PoolEvent))


def subject_of(name: str, category: str, service: str) -> str:
    if name in POOL_EVENTS:
        return f"pool.*.{category}"
    if category in subjects.PROXY_CATEGORIES:
        return f"proxy.*.{category}"
    return f"deadletter.{service}" if category == "deadletter" else f"{category}.*"


@pytest.mark.parametrize("service", SERVICES)
def test_each_user_may_write_what_its_service_appends(service: str) -> None:
    package = sorted((ROOT / "services" / service).rglob("*.py"))
    runtime = ROOT / "services" / "runtime"
    # The watcher and the pool controller declare Proxies, and ask for fresh instances of pool
    # members, through the shared declaring and rotating code.
    declares = service in ("watcher", "pools")
    shared = [ROOT / "commands" / "declaring.py", ROOT / "commands" / "rotating.py"]
    extra = shared if declares else []
    if service == "health":  # the replacement of a proxy whose egress does not match (D111)
        extra.append(ROOT / "commands" / "rotating.py")
    if service == "watcher":  # ProxyPool objects, through the CLI's pool declaring code
        extra.append(ROOT / "commands" / "pooldeclaring.py")
    if service == "executor":  # the meter's records, made by the upstream log's reader (D161)
        extra.append(ROOT / "services" / "providers" / "pure" / "meterlog.py")
    loops = any("ConsumerLoop(" in p.read_text() for p in package)
    assert loops == (service in CONSUMERS)
    if loops:
        extra.append(runtime / "nats" / "consumer.py")  # dead-letters under the durable's name
        assert any(
            f'durable="{service}"' in p.read_text() or f'DURABLE = "{service}"' in p.read_text()
            for p in package
        )
    events = event_classes()
    writes = {
        subject_of(n, events[n], service) for n in constructed(package + extra) if n in events
    }
    assert writes, "the code scan found no appended event"
    granted = set(WRITES[service]) | ({f"deadletter.{service}"} if loops else set())
    assert writes == granted, f"code writes {sorted(writes)}; the table grants {sorted(granted)}"


def test_the_kv_buckets_are_the_services_own() -> None:
    assert KV_BUCKETS == {
        "health": BUCKET,
        "gc": LOCK_BUCKET,
        "discovery": VIEWS_BUCKET,
        "reconciler": STATES_BUCKET,
    }


# ------------------------------------------------------------------------------ a real server


async def test_a_client_without_the_right_credentials_is_refused(
    nats_server: EmbeddedNatsServer,
) -> None:
    wrong = nats_server.url.replace("nats://", "nats://admin:not-the-password@")
    for url in (nats_server.url, wrong):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            async with client(url):
                pass
    async with client(nats_server.admin_url) as admin:
        assert admin.nc.is_connected


@pytest.mark.parametrize("user", SERVICES)
async def test_each_user_is_refused_outside_its_subjects(
    nats_server: EmbeddedNatsServer, conn: Connection, user: str
) -> None:
    denied = [p for p in PROBES if not allowed(user, p)]
    assert set(NEVER) <= set(denied)
    if user == "discovery":
        assert "proxy.p1.declared" in denied
    if user == "executor":
        assert "lease.p1" in denied
    if user not in ("pools", "watcher"):
        # A pool's log is the CLI's (admin), its controller's and, for ProxyPool objects,
        # the watcher's alone.
        assert {f"pool.p1.{c}" for c in subjects.POOL_CATEGORIES} <= set(denied)
    if user == "watcher":  # what people ask of a pool; never its controller's decisions
        assert "pool.p1.decision" in denied
    if user != "discovery":  # a pool's demand is what discovery could not serve
        assert "demand.p1" in denied
    async with client(nats_server.url_for(user)) as c:
        for subject in denied:
            await c.nc.publish(subject, b"{}")
        await c.nc.flush()

        async def all_refused() -> bool:
            return all(c.refused(s) for s in denied)

        await until(all_refused, timeout=10)
        # Its own subjects, through JetStream: stored and acknowledged.
        js = c.nc.jetstream()
        own = [concrete(p) for p in WRITES[user]]
        if user in CONSUMERS:
            own.append(f"deadletter.{user}")
        for subject in own:
            assert (await js.publish(subject, b"{}")).seq > 0
    # Nothing refused was stored, and no stream was touched.
    for spec in STREAMS:
        for subject in denied:
            if any(matches(s, subject) for s in spec.subjects):
                with pytest.raises(NotFoundError):
                    await conn.js.get_last_msg(spec.name, subject)
    for spec in STREAMS:
        assert (await conn.js.stream_info(spec.name)).config.deny_delete == spec.deny_delete


@pytest.mark.parametrize("user", SERVICES)
async def test_each_user_creates_and_reads_the_streams(
    nats_server: EmbeddedNatsServer, user: str
) -> None:
    """On a fresh server any service creates the streams (every one does at start-up), then
    reads with a direct get and with an ephemeral pull consumer, as projections do."""
    mine, store = await as_user(nats_server, user)
    admin = await connect(nats_server.url)
    try:
        assert sorted(await ensure_streams(mine.js)) == sorted(s.name for s in STREAMS)
        event = NewEvent(HealthChanged(healthy=True), "h1")
        await JetStreamEventStore(admin.nc, admin.js).append(subjects.proxy("p1"), [event])
        history = await store.read(subjects.proxy("p1"))
        assert [r.event for r in history.events] == [HealthChanged(healthy=True)]
        reader = OrderedPull(mine.js, subjects.PROXY_STREAM, "proxy.*.*")
        assert len(await reader.fetch(timeout=5)) == 1
        assert await reader.pending() == 0
        await reader.close()
    finally:
        await admin.close()
        await mine.close()


@pytest.mark.parametrize("user", sorted(CONSUMERS))
async def test_a_consumer_loop_acks_and_dead_letters_as_its_own_user(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, user: str
) -> None:
    await jetstream_store.append(subjects.proxy("p1"), [NewEvent(HealthChanged(healthy=True), "x")])
    mine, store = await as_user(nats_server, user)

    async def give_up(delivery: Delivery) -> Outcome:
        raise GiveUp("on purpose")

    spec = ConsumerSpec(stream=CONSUMERS[user], durable=user, filter_subjects=("proxy.*.*",))
    loop = ConsumerLoop(mine, spec, give_up, store=store)
    running = asyncio.create_task(loop.run())
    try:

        async def dead_lettered_and_acked() -> bool:
            letters = await jetstream_store.read(subjects.deadletter(user))
            try:
                info = await mine.js.consumer_info(spec.stream, user)
            except NotFoundError:  # the loop has not created its durable yet
                return False
            return len(letters.events) == 1 and info.num_ack_pending == info.num_pending == 0

        await until(dead_lettered_and_acked, timeout=20)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await mine.close()


async def test_health_and_gc_keep_their_buckets_as_their_own_users(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    health, _ = await as_user(nats_server, "health")
    gc, _ = await as_user(nats_server, "gc")
    try:
        members = Membership(health.js, "replica-1")
        await members.join()
        assert members.members == ("replica-1",)
        await members.leave()
        lock = SweepLock(gc.js, ttl=30)
        held = await lock.try_acquire()
        assert held is not None
        assert await lock.refresh(held)
        await lock.release(held)
        # Neither may touch the other's.
        assert await SweepLock(gc.js, ttl=30).try_acquire() is not None
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await SweepLock(health.js, ttl=30).try_acquire()
    finally:
        await health.close()
        await gc.close()


async def test_discovery_and_the_reconciler_keep_their_snapshots_in_their_own_buckets(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    """Written and read back as the services' own users, over real permissions: a snapshot that
    could not be written would only cost time, silently, so it is checked here."""
    discovery, _ = await as_user(nats_server, "discovery")
    reconciler, _ = await as_user(nats_server, "reconciler")
    try:
        views: SnapshotStore[ProxyState] = SnapshotStore(
            discovery.js, VIEWS_BUCKET, "t", 1, ProxyState
        )
        assert await views.write([("p1", ProxyState(uid="p1"))], 7) == 1
        restored = await views.restore(stream_last_seq=7)
        assert restored is not None
        assert restored.views == {"p1": ProxyState(uid="p1")}
        states: SnapshotStore[ProxyState] = SnapshotStore(
            reconciler.js, STATES_BUCKET, "t", 1, ProxyState
        )
        await states.put("p1", ProxyState(uid="p1"), 9)
        assert await states.get("p1") == (ProxyState(uid="p1"), 9)
        # Neither may write the other's.
        other = SnapshotStore(reconciler.js, VIEWS_BUCKET, "t", 1, ProxyState)
        with pytest.raises(StoreUnavailable):
            await other.put("p1", ProxyState(uid="p1"), 9)
    finally:
        await discovery.close()
        await reconciler.close()
