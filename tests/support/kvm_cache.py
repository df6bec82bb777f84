"""The kvm provider's image cache in a test's storage pool, seen and changed the way another
executor replica (or a crashed one, or the operator) would: on a libvirt connection of its own,
never through the provider under test."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs

from services.providers.kvm.imagelock import LockInfo, lock_name, parse_lock
from services.providers.kvm.images import download_bytes, upload_bytes
from services.providers.kvm.pure.config import KvmConfig
from services.providers.kvm.pure.domain import (
    base_name,
    base_volume_xml,
    marker_name,
    overlay_name,
    raw_volume_xml,
    seed_name,
)
from tests.support.kvm_daemon import LibvirtDaemon, pool_volumes

T = TypeVar("T")


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


@dataclass
class Cache:
    """The pool's cache of one config's ``tiny`` image, and what another replica (or the
    operator) does to it: every change is made on a libvirt connection of our own."""

    config: KvmConfig
    libvirtd: LibvirtDaemon
    pool: str

    @property
    def base(self) -> str:
        return base_name(self.config.images["tiny"])

    @property
    def lock(self) -> str:
        return lock_name(self.base)

    async def run(self, fn: Callable[[libvirt.virConnect, libvirt.virStoragePool], T]) -> T:
        """``fn(conn, pool)`` on a connection of our own."""

        def call() -> T:
            conn = self.libvirtd.connect()
            try:
                return fn(conn, conn.storagePoolLookupByName(self.pool))
            finally:
                conn.close()

        return await asyncio.to_thread(call)

    async def hold(self, lock: LockInfo, *, partial: bytes = b"") -> None:
        """Another replica's lock on the image and, if ``partial``, its half-written base."""

        def write(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
            write_volume(conn, pool, self.lock, lock.encode())
            if partial:
                xml = base_volume_xml(self.base, len(partial), "qcow2")
                write_volume(conn, pool, self.base, partial, xml)

        await self.run(write)

    async def holder(self) -> LockInfo | None:
        """The lock on the image, as written; None when there is none."""

        def read(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> LockInfo | None:
            if self.lock not in {v.name() for v in pool.listAllVolumes(0)}:
                return None
            return parse_lock(read_volume(conn, pool, self.lock))

        return await self.run(read)

    def volumes(self) -> set[str]:
        return pool_volumes(self.libvirtd, self.pool)

    async def check(self, image: bytes, vms: list[str]) -> None:
        """The base holds exactly the image, its marker its sha256, there is no lock, and every
        VM's overlay backs onto that base."""
        base = self.base

        def check(conn: libvirt.virConnect, pool: libvirt.virStoragePool) -> None:
            base_volume = pool.storageVolLookupByName(base)
            assert download_bytes(conn, base_volume, len(image) + 65536) == image
            marker = read_volume(conn, pool, marker_name(base)).decode()
            assert marker == hashlib.sha256(image).hexdigest()
            for vm in vms:
                overlay = pool.storageVolLookupByName(overlay_name(vm)).XMLDesc(0)
                assert f"<path>{base_volume.path()}</path>" in overlay

        await self.run(check)
        expected = {base, marker_name(base)}
        expected |= {overlay_name(vm) for vm in vms} | {seed_name(vm) for vm in vms}
        assert self.volumes() == expected  # no lock, no takeover claim left
