"""A VM's volumes in a host's pool: its qcow2 overlay and its seed ISO, and the ones left behind.

These functions run in the host's threads (they call libvirt directly) inside one bounded call of
transport.py. Volumes are found by name only (``overlay_name``/``seed_name``), so a delete cleans
up even when the domain is already gone, and a pool scan can report what no domain uses.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs

from services.providers.kvm.images import (
    BaseImage,
    delete_volume,
    lookup_volume,
    upload_bytes,
)
from services.providers.kvm.pure.config import HostConfig
from services.providers.kvm.pure.domain import (
    is_per_vm_volume,
    overlay_name,
    overlay_volume_xml,
    owner_uid_from_name,
    raw_volume_xml,
    seed_name,
)


@dataclass(frozen=True, slots=True)
class OrphanVolume:
    """A per-VM volume whose domain does not exist: ``vm`` is the name it was made for,
    ``owner_uid`` the proxy uid that name carries, ``modified_at`` its file's mtime (None when
    the pool does not say), so GC can leave a create that is still in flight alone."""

    host: str
    pool: str
    volume: str
    vm: str
    owner_uid: str
    modified_at: datetime | None


def ensure_overlay(
    pool: libvirt.virStoragePool, name: str, capacity: int, base: BaseImage
) -> libvirt.virStorageVol:
    """The VM's disk; one that exists already is reused (a create retried after its define
    failed keeps what the guest may have written)."""
    existing = lookup_volume(pool, name)
    if existing is not None:
        return existing
    return pool.createXML(overlay_volume_xml(name, capacity, base.path, base.format), 0)


def rebuild_seed(
    conn: libvirt.virConnect, pool: libvirt.virStoragePool, name: str, iso: bytes
) -> None:
    """Always from scratch: an upload cut off earlier leaves a seed of the right name but
    truncated, and the user's cloud-init may have changed since."""
    delete_volume(pool, name)
    volume = pool.createXML(raw_volume_xml(name, len(iso)), 0)
    upload_bytes(conn, volume, iso)


def _pool_or_none(conn: libvirt.virConnect, name: str) -> libvirt.virStoragePool | None:
    try:
        return conn.storagePoolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
            return None
        raise


def delete_vm_volumes(conn: libvirt.virConnect, host: HostConfig, vm: str) -> None:
    """The overlay and the seed by name; a missing pool holds nothing to clean."""
    pool = _pool_or_none(conn, host.pool)
    if pool is None:
        return
    delete_volume(pool, overlay_name(vm))
    delete_volume(pool, seed_name(vm))


def find_orphans(conn: libvirt.virConnect, host: HostConfig) -> list[OrphanVolume]:
    pool = _pool_or_none(conn, host.pool)
    if pool is None:
        return []
    # Volumes first: a domain defined between the two listings is then still seen, so a
    # create in flight is not reported.
    names = [volume.name() for volume in pool.listAllVolumes(0)]
    domains = {dom.name() for dom in conn.listAllDomains(0)}
    orphans = []
    for name in names:
        vm = is_per_vm_volume(name)
        if vm is None or vm in domains:
            continue
        volume = lookup_volume(pool, name)
        if volume is None:
            continue
        orphans.append(
            OrphanVolume(
                host=host.name,
                pool=host.pool,
                volume=name,
                vm=vm,
                owner_uid=owner_uid_from_name(vm),
                modified_at=_mtime(volume),
            )
        )
    return orphans


def delete_orphan(conn: libvirt.virConnect, host: HostConfig, orphan: OrphanVolume) -> bool:
    if is_per_vm_volume(orphan.volume) != orphan.vm:
        raise ValueError(f"{orphan.volume} is not a per-VM volume of {orphan.vm}")
    try:
        conn.lookupByName(orphan.vm)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise
    else:
        return False
    pool = _pool_or_none(conn, host.pool)
    return pool is not None and delete_volume(pool, orphan.volume)


def _mtime(volume: libvirt.virStorageVol) -> datetime | None:
    try:
        root = ET.fromstring(volume.XMLDesc(0))
    except (libvirt.libvirtError, ET.ParseError):
        return None
    text = root.findtext("target/timestamps/mtime")
    if not text:
        return None
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError):
        return None
