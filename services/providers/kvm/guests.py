"""What the provider does on a host, as plain blocking libvirt calls: each function runs in the
host's thread pool inside one deadline-bounded call of transport.py, so a bundle of calls costs one
round of thread hand-off and one deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import structlog

from events.schemas import InstanceState
from services.providers.base import Permanent
from services.providers.kvm import volumes
from services.providers.kvm.images import BaseImage
from services.providers.kvm.pure.config import HostConfig
from services.providers.kvm.pure.domain import (
    DomainMetadata,
    DomainSpec,
    domain_xml,
    first_routable_ipv4,
    parse_metadata,
)

log = structlog.get_logger("egress.provider.kvm")

ACTIVE = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED)
UNDEFINE_FLAGS = (
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
)


@dataclass(frozen=True, slots=True)
class Seen:
    """A domain of ours as one bundle of calls saw it."""

    name: str
    state: int
    meta: DomainMetadata
    uuid: str
    ip: str = ""


def instance_state(state: int, ip: str) -> InstanceState:
    if state in ACTIVE:
        return InstanceState.RUNNING if ip else InstanceState.PENDING
    if state == libvirt.VIR_DOMAIN_NOSTATE:
        return InstanceState.PENDING
    return InstanceState.STOPPED


def describe(dom: libvirt.virDomain) -> Seen | None:
    state, _reason = dom.state(0)
    meta = parse_metadata(dom.XMLDesc(0))
    if meta is None or not meta.managed:
        return None
    return Seen(dom.name(), int(state), meta, dom.UUIDString())


def addresses_of(conn: libvirt.virConnect, *, name: str, source: int) -> str:
    return addresses(conn.lookupByName(name), source)


def addresses(dom: libvirt.virDomain, source: int) -> str:
    found = dom.interfaceAddresses(source, 0) or {}
    return first_routable_ipv4(
        address["addr"]
        for interface in found.values()
        for address in (interface.get("addrs") or [])
        if address.get("addr")
    )


def list_domains(conn: libvirt.virConnect) -> list[Seen]:
    found = []
    for dom in conn.listAllDomains(0):
        try:
            seen = describe(dom)
            if seen is None:
                continue
            if seen.state in ACTIVE:
                try:
                    ip = addresses(dom, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP)
                except libvirt.libvirtError:
                    ip = ""
                seen = replace(seen, ip=ip)
            found.append(seen)
        except libvirt.libvirtError as exc:
            # Undefined meanwhile, or its XML unreadable: one such domain must not hide the rest.
            if not conn.isAlive():
                raise
            log.debug("kvm domain skipped", error=str(exc))
    return found


def lookup(conn: libvirt.virConnect, name: str) -> libvirt.virDomain | None:
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def ensure_ours(dom: libvirt.virDomain, name: str) -> None:
    meta = parse_metadata(dom.XMLDesc(0))
    if meta is None or not meta.managed:
        raise Permanent(
            f"a domain named {name} exists that egress-proxies did not create; rename or "
            "remove it on the host"
        )


def start_existing(conn: libvirt.virConnect, name: str) -> bool:
    """True when the domain exists (started if it was not running)."""
    dom = lookup(conn, name)
    if dom is None:
        return False
    ensure_ours(dom, name)
    if not dom.isActive():
        dom.create()
    return True


def build(
    conn: libvirt.virConnect,
    *,
    host: HostConfig,
    spec: DomainSpec,
    base: BaseImage,
    seed: bytes,
    disk_bytes: int,
) -> None:
    pool = conn.storagePoolLookupByName(host.pool)
    volumes.ensure_overlay(pool, spec.disk_volume, max(disk_bytes, base.capacity), base)
    volumes.rebuild_seed(conn, pool, spec.seed_volume, seed)
    dom = conn.defineXML(domain_xml(spec))
    if not dom.isActive():
        dom.create()


def remove(conn: libvirt.virConnect, host: HostConfig, name: str) -> None:
    dom = lookup(conn, name)
    if dom is not None:
        ensure_ours(dom, name)
        try:
            dom.destroy()
        except libvirt.libvirtError as exc:
            # Already off, or gone meanwhile: both are what we wanted.
            if exc.get_error_code() not in (
                libvirt.VIR_ERR_OPERATION_INVALID,
                libvirt.VIR_ERR_NO_DOMAIN,
            ):
                raise
        try:
            dom.undefineFlags(UNDEFINE_FLAGS)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    volumes.delete_vm_volumes(conn, host, name)
