"""The image cache shared by executor replicas, against a real libvirtd over real SSH.

A replica is a ``KvmProvider`` of its own: its own SSH connection, its own in-process lock, its
own HTTP client. What another replica (or a crashed one) leaves in the pool is made by hand
through a direct libvirt connection, exactly as a process elsewhere would leave it. A gated
HTTP server holds an upload half-way for as long as a test needs it in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from events.schemas import Placement, ProxySpec
from services.providers.base import CreateRequest, Transient
from services.providers.kvm.config import KvmConfig
from services.providers.kvm.domain import (
    base_name,
    base_volume_xml,
    marker_name,
    overlay_name,
    raw_volume_xml,
    seed_name,
)
from services.providers.kvm.imagelock import LockInfo, lock_name, parse_lock
from services.providers.kvm.images import download_bytes, upload_bytes
from services.providers.kvm.provider import KvmProvider
from tests.contract.provider import delete_all
from tests.support.kvm_daemon import LibvirtDaemon, pool_volumes
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.kvm_fixtures import ConfigFactory, make_provider
from tests.support.kvm_http import ImageServer
from tests.support.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.kvm]

T = TypeVar("T")
WAIT = 60.0
CLOUD_INIT = "#cloud-config\nruncmd:\n  - [echo, hello from the test]\n"
Logs = list[MutableMapping[str, Any]]


def request(name: str) -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid="owner-1",
        namespace="default",
        proxy_name=name,
        spec=ProxySpec(provider="kvm", placement=Placement()),
        cloud_init=CLOUD_INIT,
    )


@dataclass
class GatedServer:
    """Serves the image in two halves: the second only once ``gate`` is set."""

    image: bytes
    port: int = 0
    requests: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    halfway: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/gated.qcow2"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.image).hexdigest()


@pytest.fixture
async def gated(qcow2: bytes) -> AsyncIterator[GatedServer]:
    served = GatedServer(qcow2)

    async def handle(request: web.Request) -> web.StreamResponse:
        served.requests += 1
        response = web.StreamResponse(headers={"Content-Length": str(len(served.image))})
        await response.prepare(request)
        half = len(served.image) // 2
        await response.write(served.image[:half])
        served.halfway.set()
        await served.gate.wait()
        await response.write(served.image[half:])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/gated.qcow2", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.port = runner.addresses[0][1]
    try:
        yield served
    finally:
        served.gate.set()
        await runner.cleanup()


@pytest.fixture
def gated_config(kvm_config: ConfigFactory, gated: GatedServer) -> KvmConfig:
    return kvm_config(images={"tiny": {"url": gated.url, "sha256": gated.sha256}})


@contextlib.asynccontextmanager
async def replicas(config: KvmConfig, count: int) -> AsyncIterator[list[KvmProvider]]:
    """``count`` executor replicas of one provider config: separate connections and locks."""
    providers = [make_provider(config, download_timeout=WAIT) for _ in range(count)]
    for provider in providers:
        provider.images.poll_interval = 0.1
    try:
        yield providers
    finally:
        for provider in providers:
            await delete_all(provider)
            await provider.close()


# ------------------------------------------------------------------ the pool, by hand


async def in_pool(
    libvirtd: LibvirtDaemon,
    pool: str,
    fn: Callable[[libvirt.virConnect, libvirt.virStoragePool], T],
) -> T:
    """``fn(conn, pool)`` on a connection of our own (another replica, or the operator)."""

    def call() -> T:
        conn = libvirtd.connect()
        try:
            return fn(conn, conn.storagePoolLookupByName(pool))
        finally:
            conn.close()

    return await asyncio.to_thread(call)


def write_volume(
    conn: libvirt.virConnect, pool: libvirt.virStoragePool, name: str, data: bytes, xml: str = ""
) -> None:
    volume = pool.createXML(xml or raw_volume_xml(name, len(data)), 0)
    upload_bytes(conn, volume, data)


def read_volume(conn: libvirt.virConnect, pool: libvirt.virStoragePool, name: str) -> bytes:
    return download_bytes(conn, pool.storageVolLookupByName(name), 1 << 20)


def foreign_lock(*, age: float, lifetime: float) -> LockInfo:
    now = time.time()
    return LockInfo(
        token="f" * 32, holder="other-replica:4242", created=now - age, expires=now - age + lifetime
    )


async def read_lock(libvirtd: LibvirtDaemon, pool: str, base: str) -> LockInfo | None:
    def read(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> LockInfo | None:
        if lock_name(base) not in {v.name() for v in pool_obj.listAllVolumes(0)}:
            return None
        return parse_lock(read_volume(conn, pool_obj, lock_name(base)))

    return await in_pool(libvirtd, pool, read)


async def logged(logs: Logs, event: str) -> None:
    async def seen() -> bool:
        return any(entry.get("event") == event for entry in logs)

    try:
        await until(seen, timeout=WAIT)
    except AssertionError as exc:
        raise AssertionError(f"no {event!r} in the log: {logs}") from exc


async def check_image(
    libvirtd: LibvirtDaemon, pool: str, base: str, image: bytes, vms: list[str]
) -> None:
    """The base holds exactly the image, its marker its sha256, there is no lock, and every
    VM's overlay backs onto that base."""

    def check(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        base_volume = pool_obj.storageVolLookupByName(base)
        assert download_bytes(conn, base_volume, len(image) + 65536) == image
        marker = read_volume(conn, pool_obj, marker_name(base)).decode()
        assert marker == hashlib.sha256(image).hexdigest()
        for vm in vms:
            overlay = pool_obj.storageVolLookupByName(overlay_name(vm)).XMLDesc(0)
            assert f"<path>{base_volume.path()}</path>" in overlay

    await in_pool(libvirtd, pool, check)
    expected = {base, marker_name(base)}
    expected |= {overlay_name(vm) for vm in vms} | {seed_name(vm) for vm in vms}
    assert pool_volumes(libvirtd, pool) == expected  # no lock, no takeover claim left


# ------------------------------------------------------------------ tests


async def test_two_replicas_creating_from_one_image_download_it_once(
    gated_config: KvmConfig, gated: GatedServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    base = base_name(gated_config.images["tiny"])
    async with replicas(gated_config, 2) as (first, second):
        with capture_logs() as logs:
            creates = [
                asyncio.create_task(first.create(request("vm-r1"))),
                asyncio.create_task(second.create(request("vm-r2"))),
            ]
            # One replica is half-way through the upload, the other saw its lock and waits.
            await asyncio.wait_for(gated.halfway.wait(), WAIT)
            await logged(logs, "kvm image busy")
            finished = [task for task in creates if task.done()]
            # What ended early, and what the replicas logged: the answer to a rare failure.
            assert not finished, ([task.exception() or task.result() for task in finished], logs)
            gated.gate.set()
            ids = await asyncio.wait_for(asyncio.gather(*creates), WAIT)
        assert ids == ["hosts/hv1/domains/vm-r1", "hosts/hv1/domains/vm-r2"]
        assert gated.requests == 1
        assert [e["event"] for e in logs].count("kvm image download") == 1
        await check_image(libvirtd, pool, base, gated.image, ["vm-r1", "vm-r2"])


async def test_a_stale_lock_of_a_crashed_holder_is_taken_over(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    config = kvm_config()
    base = base_name(config.images["tiny"])
    # Its holder died an hour ago, mid-download: a lock and a partial base, no marker.
    crashed = foreign_lock(age=7200, lifetime=3600)
    await in_pool(
        libvirtd, pool, lambda c, p: write_volume(c, p, lock_name(base), crashed.encode())
    )
    await in_pool(
        libvirtd,
        pool,
        lambda c, p: write_volume(c, p, base, b"half", base_volume_xml(base, 4, "qcow2")),
    )
    async with replicas(config, 1) as (provider,):
        with capture_logs() as logs:
            await provider.create(request("vm-s"))
        taken = [e for e in logs if e["event"] == "kvm image lock taken over"]
        assert len(taken) == 1
        assert taken[0]["stale_holder"] == "other-replica:4242 (token ffffffff)"
        assert images.requests["tiny.qcow2"] == 1
        await check_image(libvirtd, pool, base, images.image, ["vm-s"])


async def test_an_unreadable_lock_is_judged_by_its_age_on_the_host(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    config = kvm_config()
    base = base_name(config.images["tiny"])

    def old_garbage_lock(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        write_volume(conn, pool_obj, lock_name(base), b"\0" * 16)  # created, never written
        path = pool_obj.storageVolLookupByName(lock_name(base)).path()
        two_hours_ago = time.time() - 7200
        os.utime(path, (two_hours_ago, two_hours_ago))

    await in_pool(libvirtd, pool, old_garbage_lock)
    async with replicas(config, 1) as (provider,):
        await provider.create(request("vm-u"))
        assert images.requests["tiny.qcow2"] == 1
        await check_image(libvirtd, pool, base, images.image, ["vm-u"])


async def test_a_fresh_lock_makes_a_replica_wait_and_use_the_finished_image(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    config = kvm_config()
    base = base_name(config.images["tiny"])
    holder = foreign_lock(age=5, lifetime=3600)

    def start_download(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        write_volume(conn, pool_obj, lock_name(base), holder.encode())
        # Its upload is under way: a base volume, no marker yet.
        pool_obj.createXML(base_volume_xml(base, len(images.image), "qcow2"), 0)

    def finish_download(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        upload_bytes(conn, pool_obj.storageVolLookupByName(base), images.image)
        pool_obj.refresh(0)
        write_volume(conn, pool_obj, marker_name(base), images.sha256.encode())
        pool_obj.storageVolLookupByName(lock_name(base)).delete(0)

    await in_pool(libvirtd, pool, start_download)
    async with replicas(config, 1) as (provider,):
        with capture_logs() as logs:
            create = asyncio.create_task(provider.create(request("vm-w")))
            await logged(logs, "kvm image busy")
            assert not create.done()
            # The waiter deleted nothing of the holder's.
            assert {base, lock_name(base)} <= pool_volumes(libvirtd, pool)
            await in_pool(libvirtd, pool, finish_download)
            await asyncio.wait_for(create, WAIT)
        busy = next(e for e in logs if e["event"] == "kvm image busy")
        assert busy["holder"] == "other-replica:4242 (token ffffffff)"
        assert images.requests["tiny.qcow2"] == 0
        await check_image(libvirtd, pool, base, images.image, ["vm-w"])


async def test_a_holder_that_gives_up_leaves_the_download_to_the_waiter(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    config = kvm_config()
    base = base_name(config.images["tiny"])
    holder = foreign_lock(age=5, lifetime=3600)

    def start_download(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        write_volume(conn, pool_obj, lock_name(base), holder.encode())
        write_volume(conn, pool_obj, base, b"partial", base_volume_xml(base, 7, "qcow2"))

    def give_up(_conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        # Released without a marker (its cleanup could not delete the partial base).
        pool_obj.storageVolLookupByName(lock_name(base)).delete(0)

    await in_pool(libvirtd, pool, start_download)
    async with replicas(config, 1) as (provider,):
        with capture_logs() as logs:
            create = asyncio.create_task(provider.create(request("vm-g")))
            await logged(logs, "kvm image busy")
            await in_pool(libvirtd, pool, give_up)
            await asyncio.wait_for(create, WAIT)
        assert images.requests["tiny.qcow2"] == 1
        await check_image(libvirtd, pool, base, images.image, ["vm-g"])


async def test_a_holder_whose_lock_was_taken_over_writes_no_marker(
    gated_config: KvmConfig, gated: GatedServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    base = base_name(gated_config.images["tiny"])
    usurper = foreign_lock(age=0, lifetime=3600)

    def take_over(conn: libvirt.virConnect, pool_obj: libvirt.virStoragePool) -> None:
        pool_obj.storageVolLookupByName(lock_name(base)).delete(0)
        write_volume(conn, pool_obj, lock_name(base), usurper.encode())

    async with replicas(gated_config, 1) as (provider,):
        create = asyncio.create_task(provider.create(request("vm-t")))
        await asyncio.wait_for(gated.halfway.wait(), WAIT)
        ours = await read_lock(libvirtd, pool, base)
        assert ours is not None
        assert ours.token != usurper.token
        # Another replica judged the lock stale (a clock far off, say) and took it over.
        await in_pool(libvirtd, pool, take_over)
        gated.gate.set()
        with pytest.raises(Transient, match=r"no longer ours.*not writing its marker"):
            await asyncio.wait_for(create, WAIT)
        # Nothing the new holder owns was touched: its lock stays, the base is left to it.
        assert await read_lock(libvirtd, pool, base) == usurper
        assert pool_volumes(libvirtd, pool) == {base, lock_name(base)}


async def test_waiting_is_bounded_by_the_download_timeout(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    config = kvm_config()
    base = base_name(config.images["tiny"])
    holder = foreign_lock(age=0, lifetime=3600)
    await in_pool(libvirtd, pool, lambda c, p: write_volume(c, p, lock_name(base), holder.encode()))
    provider = make_provider(config, download_timeout=3)
    provider.images.poll_interval = 0.1
    try:
        with pytest.raises(Transient, match="still being downloaded by other-replica:4242"):
            await provider.create(request("vm-x"))
    finally:
        await provider.close()
    assert images.requests["tiny.qcow2"] == 0
    assert await read_lock(libvirtd, pool, base) == holder


async def test_a_cancelled_download_releases_its_lock(
    gated_config: KvmConfig, gated: GatedServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    base = base_name(gated_config.images["tiny"])
    async with replicas(gated_config, 1) as (provider,):
        create = asyncio.create_task(provider.create(request("vm-c")))
        await asyncio.wait_for(gated.halfway.wait(), WAIT)
        assert await read_lock(libvirtd, pool, base) is not None
        create.cancel()
        with pytest.raises(asyncio.CancelledError):
            await create
        # Released on the way out, not left to go stale an hour later; no marker either.
        assert not {lock_name(base), marker_name(base)} & pool_volumes(libvirtd, pool)
        gated.gate.set()
        await provider.create(request("vm-c"))
        assert gated.requests == 2
        await check_image(libvirtd, pool, base, gated.image, ["vm-c"])
