"""The kvm provider against a real libvirtd over a real SSH connection: what create leaves in the
pool, the image cache, the seed as the guest would read it, delete, and leftover volumes."""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from events.schemas import InstanceState, Placement, ProxySpec
from services.providers.base import CreateRequest, Instance, NotFound, Permanent, Transient
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.kvm.images import download_bytes
from services.providers.kvm.provider import KvmProvider
from services.providers.kvm.pure.config import DEFAULT_VENDOR_DATA
from services.providers.kvm.pure.domain import (
    base_name,
    marker_name,
    overlay_name,
    parse_metadata,
    seed_name,
)
from services.providers.kvm.pure.seed import meta_data_for
from tests.contract.provider import delete_all
from tests.support.kvm_arp import ArpTable, arp_watcher
from tests.support.kvm_daemon import LibvirtDaemon, pool_volumes
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.kvm_fixtures import ConfigFactory, host_entry, make_provider
from tests.support.kvm_http import ImageServer
from tests.support.kvm_ssh import Hypervisor
from tests.support.seed_reader import read_seed_iso

pytestmark = [pytest.mark.integration, pytest.mark.kvm]

WAIT = 60.0
CLOUD_INIT = "#cloud-config\nruncmd:\n  - [echo, hello from the test]\n"


def request(name: str, owner: str = "owner-1", image: str = "") -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid=owner,
        namespace="default",
        proxy_name=name,
        spec=ProxySpec(provider="kvm", placement=Placement(image=image)),
        cloud_init=CLOUD_INIT,
    )


@pytest.fixture
async def arp(libvirtd: LibvirtDaemon, kvm_bridge: str) -> AsyncIterator[ArpTable]:
    async with arp_watcher(libvirtd, kvm_bridge) as table:
        yield table


async def running(provider: KvmProvider, provider_id: str) -> Instance:
    """The instance as read once it is Running, which means its address was read too: a later
    read may again find none for a moment (the host's neighbour table is shared, and libvirt
    reads only its front), so the test asserts on this one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        instance = await provider.get(provider_id)
        if instance.state is InstanceState.RUNNING:
            return instance
        if loop.time() > deadline:
            pytest.fail(f"{provider_id} not Running within {WAIT}s: {instance}")
        await asyncio.sleep(0.1)


async def test_create_defines_and_starts_a_domain_with_overlay_and_seed(
    provider: KvmProvider,
    libvirtd: LibvirtDaemon,
    pool: str,
    images: ImageServer,
    arp: ArpTable,
) -> None:
    provider_id = await provider.create(request("vm-a", owner="owner-a"))
    assert provider_id == "hosts/hv1/domains/vm-a"
    image = provider.config.images["tiny"]
    base = base_name(image)
    assert pool_volumes(libvirtd, pool) == {
        base,
        marker_name(base),
        overlay_name("vm-a"),
        seed_name("vm-a"),
    }
    conn = libvirtd.connect()
    try:
        dom = conn.lookupByName("vm-a")
        assert dom.isActive()
        meta = parse_metadata(dom.XMLDesc(0))
        assert meta is not None
        assert (meta.managed, meta.owner_uid) == (True, "owner-a")
        pool_obj = conn.storagePoolLookupByName(pool)
        marker = download_bytes(conn, pool_obj.storageVolLookupByName(marker_name(base)), 256)
        assert marker.decode() == images.sha256
        overlay = pool_obj.storageVolLookupByName(overlay_name("vm-a"))
        assert pool_obj.storageVolLookupByName(base).path() in overlay.XMLDesc(0)
        seed = pool_obj.storageVolLookupByName(seed_name("vm-a"))
        contents = read_seed_iso(download_bytes(conn, seed, seed.info()[1]))
    finally:
        conn.close()
    assert contents.label == "cidata"
    assert set(contents.files) == {"user-data", "meta-data", "vendor-data"}
    assert contents.files["meta-data"] == meta_data_for("vm-a")
    assert contents.files["vendor-data"] == DEFAULT_VENDOR_DATA
    # The Proxy's cloud-init, then the guard part for the image's Squid (D134).
    message = email.parser.Parser(policy=email.policy.default).parsestr(contents.files["user-data"])
    parts = {str(p.get_filename()): str(p.get_content()) for p in message.iter_parts()}
    assert list(parts) == ["part-001", GUARD_PART]
    assert parts["part-001"] == CLOUD_INIT
    instance = await running(provider, provider_id)
    assert instance.ip
    assert (instance.owner_uid, instance.name) == ("owner-a", "vm-a")
    assert instance.url == f"http://{instance.ip}:3128"
    assert instance.ip in arp.assigned.values()


async def test_second_vm_on_the_host_downloads_nothing(
    provider: KvmProvider, images: ImageServer
) -> None:
    await provider.create(request("vm-b1"))
    await provider.create(request("vm-b2"))
    # And a third provider process (an executor restart) trusts the marker in the pool.
    again = make_provider(provider.config)
    try:
        await again.create(request("vm-b3"))
    finally:
        await again.close()
    assert images.requests["tiny.qcow2"] == 1


async def test_delete_leaves_only_the_cached_image(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    provider_id = await provider.create(request("vm-c"))
    await provider.delete(provider_id)
    await provider.delete(provider_id)
    base = base_name(provider.config.images["tiny"])
    assert pool_volumes(libvirtd, pool) == {base, marker_name(base)}
    with pytest.raises(NotFound):
        await provider.get(provider_id)
    conn = libvirtd.connect()
    try:
        assert "vm-c" not in {dom.name() for dom in conn.listAllDomains(0)}
    finally:
        conn.close()


async def test_create_after_the_domain_vanished_rebuilds_the_seed_and_reuses_the_disk(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    provider_id = await provider.create(request("vm-d"))
    conn = libvirtd.connect()
    try:
        dom = conn.lookupByName("vm-d")
        dom.destroy()
        dom.undefine()
        pool_obj = conn.storagePoolLookupByName(pool)
        overlay_key = pool_obj.storageVolLookupByName(overlay_name("vm-d")).key()
        # A seed cut off mid-upload: right name, wrong bytes.
        pool_obj.storageVolLookupByName(seed_name("vm-d")).wipe(0)
    finally:
        conn.close()
    assert await provider.create(request("vm-d")) == provider_id
    conn = libvirtd.connect()
    try:
        pool_obj = conn.storagePoolLookupByName(pool)
        assert pool_obj.storageVolLookupByName(overlay_name("vm-d")).key() == overlay_key
        seed = pool_obj.storageVolLookupByName(seed_name("vm-d"))
        assert read_seed_iso(download_bytes(conn, seed, seed.info()[1])).label == "cidata"
        assert conn.lookupByName("vm-d").isActive()
    finally:
        conn.close()


async def test_create_of_an_existing_stopped_domain_starts_it(
    provider: KvmProvider, libvirtd: LibvirtDaemon
) -> None:
    provider_id = await provider.create(request("vm-e"))
    conn = libvirtd.connect()
    try:
        conn.lookupByName("vm-e").destroy()
        assert (await provider.get(provider_id)).state is InstanceState.STOPPED
        assert await provider.create(request("vm-e")) == provider_id
        assert conn.lookupByName("vm-e").isActive()
    finally:
        conn.close()


# ----------------------------------------------------------------------------- images


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("missing.qcow2", Permanent, "HTTP 404"),
        ("busy.qcow2", Transient, "HTTP 503"),
        ("chunked.qcow2", Permanent, "no Content-Length"),
    ],
)
async def test_failed_downloads_are_classified_and_leave_nothing(  # noqa: PLR0917 - fixtures
    kvm_config: ConfigFactory,
    images: ImageServer,
    libvirtd: LibvirtDaemon,
    pool: str,
    path: str,
    error: type[Exception],
    message: str,
) -> None:
    kvm = make_provider(kvm_config())
    try:
        with pytest.raises(error, match=message):
            await kvm.create(request("vm-f", image=images.url(path)))
        assert pool_volumes(libvirtd, pool) == set()
        with pytest.raises(NotFound):
            await kvm.get("hosts/hv1/domains/vm-f")
    finally:
        await kvm.close()


async def test_checksum_mismatch_is_permanent_and_cleaned_up(
    kvm_config: ConfigFactory, images: ImageServer, libvirtd: LibvirtDaemon, pool: str
) -> None:
    wrong = "0" * 64
    kvm = make_provider(
        kvm_config(images={"tiny": {"url": images.url("tiny.qcow2"), "sha256": wrong}})
    )
    try:
        with pytest.raises(Permanent, match=f"not the configured {wrong}"):
            await kvm.create(request("vm-g"))
        assert pool_volumes(libvirtd, pool) == set()
        assert images.requests["tiny.qcow2"] == 1
    finally:
        await delete_all(kvm)
        await kvm.close()


async def test_an_image_without_marker_is_downloaded_again(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str, images: ImageServer
) -> None:
    await provider.create(request("vm-h1"))
    base = base_name(provider.config.images["tiny"])
    conn = libvirtd.connect()
    try:
        # An interrupted download: the base is there, the marker (written last) is not.
        conn.storagePoolLookupByName(pool).storageVolLookupByName(marker_name(base)).delete(0)
    finally:
        conn.close()
    again = make_provider(provider.config)
    try:
        await again.create(request("vm-h2"))
    finally:
        await again.close()
    assert images.requests["tiny.qcow2"] == 2
    assert {base, marker_name(base)} <= pool_volumes(libvirtd, pool)


async def test_an_image_by_url_without_sha256(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str, images: ImageServer
) -> None:
    await provider.create(request("vm-i", image=images.url("direct.qcow2")))
    volumes = pool_volumes(libvirtd, pool)
    assert overlay_name("vm-i") in volumes
    bases = {v for v in volumes if v.startswith("egress-base-") and not v.endswith("-sha256")}
    assert len(bases) == 1
    assert images.requests["direct.qcow2"] == 1


# ----------------------------------------------------------------------------- ownership


async def test_a_domain_without_our_metadata_is_never_touched(
    provider: KvmProvider, libvirtd: LibvirtDaemon
) -> None:
    conn = libvirtd.connect()
    try:
        conn.defineXML(
            "<domain type='qemu'><name>theirs</name><memory unit='MiB'>32</memory>"
            "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>"
        )
        provider_id = "hosts/hv1/domains/theirs"
        with pytest.raises(NotFound, match="not managed by egress-proxies"):
            await provider.get(provider_id)
        with pytest.raises(Permanent, match="did not create"):
            await provider.delete(provider_id)
        with pytest.raises(Permanent, match="did not create"):
            await provider.create(request("theirs"))
        assert "theirs" not in {i.name for i in await provider.list_by_tag()}
        assert conn.lookupByName("theirs").name() == "theirs"
    finally:
        conn.lookupByName("theirs").undefine()
        conn.close()


# ----------------------------------------------------------------------------- leftovers


async def test_volumes_left_without_a_domain_are_reported_and_removed(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    # What the reconciler names VMs; other names in a shared pool are never reported.
    name = "px-1f3a-0123abcd"
    await provider.create(request(name, owner="1f3a"))
    await provider.create(request("vm-kept"))
    assert await provider.leftovers() == []
    conn = libvirtd.connect()
    try:
        # A delete cut off between undefine and the volumes.
        dom = conn.lookupByName(name)
        dom.destroy()
        dom.undefine()
    finally:
        conn.close()
    orphans = await provider.leftovers()
    assert {o.provider_id for o in orphans} == {
        f"hosts/hv1/volumes/{pool}/{overlay_name(name)}",
        f"hosts/hv1/volumes/{pool}/{seed_name(name)}",
    }
    assert len(orphans) == 2
    assert {(o.owner_uid, o.kind) for o in orphans} == {("1f3a", "volume")}
    assert all(o.created_at > datetime(2000, 1, 1, tzinfo=UTC) for o in orphans)  # the mtime
    for orphan in orphans:
        assert await provider.delete_leftover(orphan)
    assert await provider.leftovers() == []
    base = base_name(provider.config.images["tiny"])
    assert pool_volumes(libvirtd, pool) == {
        base,
        marker_name(base),
        overlay_name("vm-kept"),
        seed_name("vm-kept"),
    }


async def test_an_orphan_whose_domain_came_back_is_kept(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    name = "px-2b4c-89abcdef"
    await provider.create(request(name, owner="2b4c"))
    conn = libvirtd.connect()
    try:
        dom = conn.lookupByName(name)
        dom.destroy()
        dom.undefine()
    finally:
        conn.close()
    orphans = await provider.leftovers()
    assert len(orphans) == 2
    # The create is retried (a redelivered command) before GC acts on its report.
    await provider.create(request(name, owner="2b4c"))
    assert [await provider.delete_leftover(o) for o in orphans] == [False, False]
    assert {overlay_name(name), seed_name(name)} <= pool_volumes(libvirtd, pool)


async def test_concurrent_creates_on_a_host_share_one_download(
    provider: KvmProvider, images: ImageServer
) -> None:
    ids = await asyncio.gather(*(provider.create(request(f"vm-j{i}")) for i in range(3)))
    assert len(set(ids)) == 3
    assert images.requests["tiny.qcow2"] == 1


async def test_a_missing_pool_fails_create_permanently_and_delete_cleans_nothing(
    kvm_config: ConfigFactory, hv: Hypervisor, kvm_bridge: str, images: ImageServer
) -> None:
    kvm = make_provider(kvm_config(hosts=[host_entry("hv1", hv, kvm_bridge, "no-such-pool")]))
    try:
        with pytest.raises(Permanent, match="no-such-pool"):
            await kvm.create(request("vm-k"))
        await kvm.delete("hosts/hv1/domains/vm-k")
        assert images.requests["tiny.qcow2"] == 0
    finally:
        await kvm.close()


async def test_an_unreachable_image_server_is_transient(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(Transient, match="download failed"):
        await provider.create(request("vm-l", image=f"http://127.0.0.1:{port}/gone.qcow2"))
    assert pool_volumes(libvirtd, pool) == set()
