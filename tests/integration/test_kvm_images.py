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
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from events.schemas import Placement, ProxySpec
from services.providers.base import CreateRequest, Transient
from services.providers.kvm.images import upload_bytes
from services.providers.kvm.provider import KvmProvider
from services.providers.kvm.pure.config import KvmConfig
from services.providers.kvm.pure.domain import base_volume_xml, marker_name
from tests.contract.provider import delete_all
from tests.support.kvm_cache import Cache, foreign_lock, write_volume
from tests.support.kvm_daemon import LibvirtDaemon
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.kvm_fixtures import ConfigFactory, make_provider
from tests.support.kvm_http import ImageServer
from tests.support.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.kvm]

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


# ------------------------------------------------------------------ the cache, creates in flight


@pytest.fixture
def cache(kvm_config: ConfigFactory, libvirtd: LibvirtDaemon, pool: str) -> Cache:
    """The cache of the image the ``images`` server serves."""
    return Cache(kvm_config(), libvirtd, pool)


@pytest.fixture
def gated_cache(gated_config: KvmConfig, libvirtd: LibvirtDaemon, pool: str) -> Cache:
    """The cache of the image the ``gated`` server serves."""
    return Cache(gated_config, libvirtd, pool)


async def logged(logs: Logs, event: str) -> None:
    async def seen() -> bool:
        return any(entry.get("event") == event for entry in logs)

    try:
        await until(seen, timeout=WAIT)
    except AssertionError as exc:
        raise AssertionError(f"no {event!r} in the log: {logs}") from exc


def create(provider: KvmProvider, vm: str) -> asyncio.Task[str]:
    return asyncio.create_task(provider.create(request(vm)))


async def waiting(provider: KvmProvider, vm: str, logs: Logs) -> asyncio.Task[str]:
    """A create that found the image locked by another replica and waits for it."""
    task = create(provider, vm)
    await logged(logs, "kvm image busy")
    return task


async def halfway(provider: KvmProvider, vm: str, gated: GatedServer) -> asyncio.Task[str]:
    """A create that holds the lock, half-way through its download from the gated server."""
    task = create(provider, vm)
    await asyncio.wait_for(gated.halfway.wait(), WAIT)
    return task


# ------------------------------------------------------------------ tests


async def test_two_replicas_creating_from_one_image_download_it_once(
    gated_cache: Cache, gated: GatedServer
) -> None:
    async with replicas(gated_cache.config, 2) as (first, second):
        with capture_logs() as logs:
            creates = [create(first, "vm-r1"), create(second, "vm-r2")]
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
        await gated_cache.check(gated.image, ["vm-r1", "vm-r2"])


async def test_a_stale_lock_of_a_crashed_holder_is_taken_over(
    cache: Cache, images: ImageServer
) -> None:
    # Its holder died an hour ago, mid-download: a lock and a partial base, no marker.
    await cache.hold(foreign_lock(age=7200, lifetime=3600), partial=b"half")
    async with replicas(cache.config, 1) as (provider,):
        with capture_logs() as logs:
            await provider.create(request("vm-s"))
        taken = [e for e in logs if e["event"] == "kvm image lock taken over"]
        assert len(taken) == 1
        assert taken[0]["stale_holder"] == "other-replica:4242 (token ffffffff)"
        assert images.requests["tiny.qcow2"] == 1
        await cache.check(images.image, ["vm-s"])


async def test_an_unreadable_lock_is_judged_by_its_age_on_the_host(
    cache: Cache, images: ImageServer
) -> None:
    def old_garbage_lock(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
        write_volume(conn, pool, cache.lock, b"\0" * 16)  # created, never written
        path = pool.storageVolLookupByName(cache.lock).path()
        two_hours_ago = time.time() - 7200
        os.utime(path, (two_hours_ago, two_hours_ago))

    await cache.run(old_garbage_lock)
    async with replicas(cache.config, 1) as (provider,):
        await provider.create(request("vm-u"))
        assert images.requests["tiny.qcow2"] == 1
        await cache.check(images.image, ["vm-u"])


async def test_a_fresh_lock_makes_a_replica_wait_and_use_the_finished_image(
    cache: Cache, images: ImageServer
) -> None:
    base = cache.base

    def start_upload(_conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
        # Its upload is under way: a base volume, no marker yet.
        pool.createXML(base_volume_xml(base, len(images.image), "qcow2"), 0)

    def finish_download(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
        upload_bytes(conn, pool.storageVolLookupByName(base), images.image)
        pool.refresh(0)
        write_volume(conn, pool, marker_name(base), images.sha256.encode())
        pool.storageVolLookupByName(cache.lock).delete(0)

    await cache.hold(foreign_lock(age=5, lifetime=3600))
    await cache.run(start_upload)
    async with replicas(cache.config, 1) as (provider,):
        with capture_logs() as logs:
            task = await waiting(provider, "vm-w", logs)
            assert not task.done()
            # The waiter deleted nothing of the holder's.
            assert {base, cache.lock} <= cache.volumes()
            await cache.run(finish_download)
            await asyncio.wait_for(task, WAIT)
        busy = next(e for e in logs if e["event"] == "kvm image busy")
        assert busy["holder"] == "other-replica:4242 (token ffffffff)"
        assert images.requests["tiny.qcow2"] == 0
        await cache.check(images.image, ["vm-w"])


async def test_a_holder_that_gives_up_leaves_the_download_to_the_waiter(
    cache: Cache, images: ImageServer
) -> None:
    def give_up(_conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
        # Released without a marker (its cleanup could not delete the partial base).
        pool.storageVolLookupByName(cache.lock).delete(0)

    await cache.hold(foreign_lock(age=5, lifetime=3600), partial=b"partial")
    async with replicas(cache.config, 1) as (provider,):
        with capture_logs() as logs:
            task = await waiting(provider, "vm-g", logs)
            await cache.run(give_up)
            await asyncio.wait_for(task, WAIT)
        assert images.requests["tiny.qcow2"] == 1
        await cache.check(images.image, ["vm-g"])


async def test_a_holder_whose_lock_was_taken_over_writes_no_marker(
    gated_cache: Cache, gated: GatedServer
) -> None:
    usurper = foreign_lock(age=0, lifetime=3600)

    def take_over(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
        pool.storageVolLookupByName(gated_cache.lock).delete(0)
        write_volume(conn, pool, gated_cache.lock, usurper.encode())

    async with replicas(gated_cache.config, 1) as (provider,):
        task = await halfway(provider, "vm-t", gated)
        ours = await gated_cache.holder()
        assert ours is not None
        assert ours.token != usurper.token
        # Another replica judged the lock stale (a clock far off, say) and took it over.
        await gated_cache.run(take_over)
        gated.gate.set()
        with pytest.raises(Transient, match=r"no longer ours.*not writing its marker"):
            await asyncio.wait_for(task, WAIT)
        # Nothing the new holder owns was touched: its lock stays, the base is left to it.
        assert await gated_cache.holder() == usurper
        assert gated_cache.volumes() == {gated_cache.base, gated_cache.lock}


async def test_waiting_is_bounded_by_the_download_timeout(
    cache: Cache, images: ImageServer
) -> None:
    holder = foreign_lock(age=0, lifetime=3600)
    await cache.hold(holder)
    provider = make_provider(cache.config, download_timeout=3)
    provider.images.poll_interval = 0.1
    try:
        with pytest.raises(Transient, match="still being downloaded by other-replica:4242"):
            await provider.create(request("vm-x"))
    finally:
        await provider.close()
    assert images.requests["tiny.qcow2"] == 0
    assert await cache.holder() == holder


async def test_a_cancelled_download_releases_its_lock(
    gated_cache: Cache, gated: GatedServer
) -> None:
    async with replicas(gated_cache.config, 1) as (provider,):
        task = await halfway(provider, "vm-c", gated)
        assert await gated_cache.holder() is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Released on the way out, not left to go stale an hour later; no marker either.
        assert not {gated_cache.lock, marker_name(gated_cache.base)} & gated_cache.volumes()
        gated.gate.set()
        await provider.create(request("vm-c"))
        assert gated.requests == 2
        await gated_cache.check(gated.image, ["vm-c"])
