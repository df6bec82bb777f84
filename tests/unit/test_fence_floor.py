"""A new instance of a proxy starts fenced at the proxy's highest granted token (docs/decisions/,
D92): the executor reads it from the lease fold, and every kind of instance is given it. On the
in-memory event store, which keeps the JetStream store's contract; the path through a real Squid
is tests/integration/test_fence_recreate.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from nats.aio.msg import Msg

from events import subjects
from events.schemas import CreateInstance, LeaseAcquired, LeaseReleased, LeaseSwitched, ProxySpec
from events.store import NewEvent
from services.executor.commands import CommandHandler
from services.executor.fences import FenceFloors
from services.providers import local_auth
from services.providers.base import CreateRequest, LeaseAuth
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.pure.mapping import build_pod
from services.providers.pure.squidconf import SquidAuth, auth_lines
from services.providers.squidauth import helper
from services.providers.squidauth.keyed import lease_auth_for, lease_keyed
from services.runtime.nats.consumer import Delivery
from services.runtime.observability.metrics import Metrics
from services.testing.eventlog import InMemoryEventStore
from services.testing.provider import FakeProvider
from tests.unit.test_lease_auth_config import MASTER, UID, Recording, parts, request


async def append(store: InMemoryEventStore, *events: LeaseAcquired | LeaseReleased) -> int:
    """The stream sequence of the last of ``events``."""
    news = [NewEvent(e, f"{type(e).__name__}-{e.lease_id}-{i}") for i, e in enumerate(events)]
    return (await store.append(subjects.lease(UID), news)).last_seq


def claim(lease_id: str) -> LeaseAcquired:
    return LeaseAcquired(lease_id=lease_id, proxy_uid=UID, ttl_seconds=300)


async def test_the_floor_is_the_folds_highest_granted_token() -> None:
    store = InMemoryEventStore()
    floors = FenceFloors(store)
    assert await floors.floor(UID) == 0
    other = LeaseAcquired(lease_id="x", proxy_uid="another", ttl_seconds=60)
    await store.append(subjects.lease("another"), [NewEvent(other, "other")])
    first = await append(store, claim("a"))
    assert await floors.floor(UID) == first
    # A claim on a held proxy is refused by the fold: it sets no token, so no floor, though it
    # is the subject's last event (a floor above the holder's token would lock the holder out).
    await append(store, claim("c"))
    assert await floors.floor(UID) == first
    second = await append(store, LeaseReleased(lease_id="a", proxy_uid=UID), claim("b"))
    assert await floors.floor(UID) == second
    switch = LeaseSwitched(lease_id="b", proxy_uid=UID, rotation_id="r", provider_id="p")
    switched = (await store.append(subjects.lease(UID), [NewEvent(switch, "sw")])).last_seq
    assert await floors.floor(UID) == switched
    # Read on from the kept view, or from nothing: the same answer.
    assert await FenceFloors(store, keep=0).floor(UID) == switched


async def test_views_kept_are_bounded() -> None:
    store = InMemoryEventStore()
    floors = FenceFloors(store, keep=2)
    for uid in ("p1", "p2", "p3"):
        await floors.floor(uid)
    assert list(floors._views) == ["p2", "p3"]


class Recorder(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[CreateRequest] = []

    async def create(self, request: CreateRequest) -> str:
        self.requests.append(request)
        return await super().create(request)


async def test_the_executor_hands_the_floor_to_the_create() -> None:
    store = InMemoryEventStore()
    token = await append(store, claim("a"))
    command = CreateInstance(
        command_id="c1", provider="fake", instance_name="inst-c1", spec=ProxySpec()
    )
    await store.append(subjects.proxy(UID), [NewEvent(command, "cmd-c1")])
    recorded = (await store.read(subjects.proxy(UID))).events[0]
    fake = Recorder()
    handler = CommandHandler(store, {"fake": fake}, metrics=Metrics())
    await handler(Delivery(recorded, 1, cast(Msg, None)))
    [asked] = fake.requests
    assert asked.fence_floor == token


async def test_every_kind_of_instance_is_given_the_floor() -> None:
    local, vm = Recording("local"), Recording("kvm")
    await lease_keyed(local, MASTER).create(request(fence_floor=41))
    await lease_keyed(vm, MASTER).create(request("#cloud-config\n{}\n", fence_floor=41))
    [seen] = local.requests
    assert seen.lease_auth is not None
    assert seen.lease_auth.fence_floor == 41
    [booted] = vm.requests
    assert " --fence-floor 41 --concurrent" in parts(booted.cloud_init)[1][1]
    auth = lease_auth_for(MASTER, UID, 41)
    pod = build_pod(request(lease_auth=auth), KubernetesConfig(), "k8s", datetime.now(UTC))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert " --fence-floor 41 --concurrent" in env["SQUID_CONF"]
    # No floor yet (a proxy never leased): the helper's line is as it always was.
    program = "/usr/bin/python3 /h.py --key-file /k --state-file /s"
    assert auth_lines(SquidAuth(program=program))[0].endswith("--state-file /s --concurrent")


def test_a_local_squid_is_given_the_floor(tmp_path: Path) -> None:
    auth = LeaseAuth(key="00" * 32, helper="# helper\n", fence_floor=17)
    squid = local_auth.prepare_auth(tmp_path, auth, None, "svc")
    assert squid.fence_floor == 17


def test_proxypy_gets_the_floor_in_its_fencing_state_never_lowered(tmp_path: Path) -> None:
    local_auth.write_key(tmp_path, LeaseAuth(key="00" * 32, helper="", fence_floor=30))
    fence = helper.Fence(str(tmp_path / local_auth.FENCE_FILE))
    assert not fence.admit(29)
    assert fence.admit(31)
    local_auth.write_key(tmp_path, LeaseAuth(key="00" * 32, helper="", fence_floor=20))
    assert (tmp_path / local_auth.FENCE_FILE).read_text() == "31\n"
