"""``KvmProvider``: proxy VMs on KVM hypervisors reached over SSH (docs/kvm.md).

One provider instance spans every configured host; a VM is ``hosts/<host>/domains/<name>``. Each
operation is one deadline-bounded bundle of libvirt calls on the host's cached link (transport.py),
so a hung host costs its callers one timeout and never blocks the others.

Create is idempotent on the name: an existing domain is only started. Otherwise the image is
ensured in the pool (images.py), the VM's qcow2 overlay reused or created, its seed ISO always
rebuilt (an upload cut off earlier leaves a truncated one), the domain defined with our metadata
and started. A domain without our metadata is never ours: get does not see it and delete refuses
to touch it, whatever its name.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TypeVar

import asyncssh
import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import structlog

from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    NAME_LABEL,
    NAMESPACE_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
    Leftover,
    NotFound,
    Permanent,
    ProviderError,
)
from services.providers.cloud.pure.guard import with_guard
from services.providers.kvm import guests, volumes
from services.providers.kvm.images import ImageCache
from services.providers.kvm.pure.config import (
    HostConfig,
    KvmConfig,
    resolve_placement,
    validate_kvm_config,
)
from services.providers.kvm.pure.domain import (
    DomainSpec,
    check_vm_name,
    is_per_vm_volume,
    mac_for,
    overlay_name,
    seed_name,
)
from services.providers.kvm.pure.seed import build_seed_iso, meta_data_for
from services.providers.kvm.transport import HostLink, HostTransport, SshCredentials
from services.providers.kvm.volumes import OrphanVolume
from services.runtime.settings.errors import ConfigError

__all__ = ["KvmConfig", "KvmProvider", "OrphanVolume"]

log = structlog.get_logger("egress.provider.kvm")

T = TypeVar("T")
HOST_LABEL = "egress-proxies/kvm-host"
_PROVIDER_ID = re.compile(r"^hosts/(?P<host>[^/]+)/domains/(?P<name>[^/]+)\Z")
_VOLUME_ID = re.compile(r"^hosts/(?P<host>[^/]+)/volumes/(?P<pool>[^/]+)/(?P<volume>[^/]+)\Z")
VOLUME_KIND = "volume"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
GIB = 1 << 30


def load_credentials(config: KvmConfig) -> SshCredentials:
    """Read the key and known_hosts files now: a typo in a path is a start-up error."""
    key_path = Path(config.ssh_key_file).expanduser()
    try:
        key = asyncssh.import_private_key(key_path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"kvm.sshKeyFile {key_path}: cannot read it ({exc})") from exc
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise ConfigError(
            f"kvm.sshKeyFile {key_path}: not a usable private key ({exc}); use an OpenSSH "
            "private key without a passphrase"
        ) from exc
    known_hosts = None
    if config.known_hosts_file and not config.insecure_ignore_host_key:
        hosts_path = Path(config.known_hosts_file).expanduser()
        try:
            known_hosts = asyncssh.import_known_hosts(hosts_path.read_text())
        except OSError as exc:
            raise ConfigError(f"kvm.knownHostsFile {hosts_path}: cannot read it ({exc})") from exc
        except ValueError as exc:
            raise ConfigError(
                f"kvm.knownHostsFile {hosts_path}: not a known_hosts file ({exc}); "
                "create it with ssh-keyscan -p PORT HOST"
            ) from exc
    return SshCredentials(key, known_hosts)


class KvmProvider:
    """A ``Provider`` over several hypervisors; see the module docstring."""

    type = "kvm"

    def __init__(
        self,
        name: str,
        config: KvmConfig,
        credentials: SshCredentials,
        *,
        call_timeout: float = 60.0,
        download_timeout: float = 3600.0,
    ) -> None:
        self.name = name
        self.config = config
        self.call_timeout = call_timeout
        self.hosts = {host.name: host for host in config.hosts}
        self.transports = {
            host.name: HostTransport(
                host,
                credentials,
                connect_timeout=config.connect_timeout,
                keepalive_interval=config.keepalive_interval,
            )
            for host in config.hosts
        }
        self.images = ImageCache(download_timeout=download_timeout)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    @classmethod
    def from_config(cls, name: str, config: KvmConfig) -> KvmProvider:
        validate_kvm_config(config)
        return cls(name, config, load_credentials(config))

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        check_vm_name(request.name)
        placement = request.spec.placement
        where = resolve_placement(
            self.config, placement.zone, placement.machine_type, placement.image
        )
        host, name = where.host, request.name
        provider_id = f"hosts/{host.name}/domains/{name}"
        transport = self.transports[host.name]
        async with self._lock(host.name, name):
            if await self._run(
                transport, lambda c: guests.start_existing(c, name), f"start {name}"
            ):
                return provider_id
            base = await self.images.ensure(transport, host.pool, where.image)
            now = datetime.now(UTC).replace(microsecond=0)
            spec = DomainSpec(
                name=name,
                vcpus=where.machine_type.vcpus,
                memory_mib=where.machine_type.memory_mib,
                domain_type=self.config.domain_type,
                pool=host.pool,
                disk_volume=overlay_name(name),
                seed_volume=seed_name(name),
                bridge=host.bridge,
                owner_uid=request.owner_uid,
                created_at=now,
                mac=mac_for(name),
                namespace=request.namespace,
                proxy_name=request.proxy_name,
            )
            seed = build_seed_iso(
                # The image's Squid gets the destination rules and the metadata guard (D134).
                user_data=with_guard(request.cloud_init, self.config.allowed_targets, snippet=True),
                meta_data=meta_data_for(name),
                vendor_data=self.config.vendor_data,
            )
            disk_bytes = self.config.disk_size_gb * GIB
            await self._run(
                transport,
                partial(
                    guests.build, host=host, spec=spec, base=base, seed=seed, disk_bytes=disk_bytes
                ),
                f"create domain {name}",
            )
        log.info("kvm domain created", host=host.name, domain=name, owner=request.owner_uid)
        return provider_id

    async def get(self, provider_id: str) -> Instance:
        host, name = self._parse(provider_id)
        transport = self.transports[host.name]
        link = await transport.link(self._deadline())
        described: guests.Seen | None = await link.run(
            lambda c: guests.describe(c.lookupByName(name)), f"get {name}", self._deadline()
        )
        if described is None:
            raise NotFound(f"{provider_id}: the domain is not managed by egress-proxies")
        if described.state in guests.ACTIVE:
            described = replace(described, ip=await self._address(link, name))
        return self._instance(host, described)

    async def delete(self, provider_id: str) -> None:
        try:
            host, name = self._parse(provider_id)
        except NotFound:
            return
        transport = self.transports[host.name]
        async with self._lock(host.name, name):
            await self._run(transport, lambda c: guests.remove(c, host, name), f"delete {name}")
        log.info("kvm domain deleted", host=host.name, domain=name)

    async def list_by_tag(self) -> list[Instance]:
        results = await asyncio.gather(
            *(self._list_host(host) for host in self.hosts.values()), return_exceptions=True
        )
        instances: list[Instance] = []
        for result in results:
            if isinstance(result, BaseException):
                # A partial listing would let GC act on a view that is missing a host.
                raise result
            instances.extend(result)
        return instances

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports.values()))
        await self.images.close()

    # ---------------------------------------------------------------- LeftoverCleaner

    async def leftovers(self) -> list[Leftover]:
        """Per-VM volumes (overlay, seed) whose domain is gone, on every host: what a create
        cut off before its define, or a delete cut off after its undefine, left behind. Each is
        ``hosts/<host>/volumes/<pool>/<volume>``, owned by the uid its VM's name carries, as old
        as its file's mtime. A host that cannot be listed fails the whole call, like
        ``list_by_tag``."""
        found = await asyncio.gather(
            *(
                self._run(
                    self.transports[host.name],
                    partial(volumes.find_orphans, host=host),
                    f"scan pool {host.pool}",
                )
                for host in self.hosts.values()
            ),
            return_exceptions=True,
        )
        leftovers: list[Leftover] = []
        for result in found:
            if isinstance(result, BaseException):
                raise result
            leftovers.extend(
                Leftover(
                    provider_id=f"hosts/{o.host}/volumes/{o.pool}/{o.volume}",
                    owner_uid=o.owner_uid,
                    created_at=o.modified_at or EPOCH,
                    kind=VOLUME_KIND,
                )
                for o in result
            )
        return leftovers

    async def delete_leftover(self, leftover: Leftover) -> bool:
        """Delete one reported volume unless its VM has a domain again (a create resumed):
        then False. Only a per-VM volume in the host's configured pool is ever touched, so no
        id can name a base image or a volume that is not ours."""
        host, orphan = self._parse_volume(leftover)
        async with self._lock(host.name, orphan.vm):
            return await self._run(
                self.transports[host.name],
                lambda c: _delete_unused(c, host, orphan),
                f"delete volume {orphan.volume}",
            )

    # ---------------------------------------------------------------- helpers

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.call_timeout

    async def _run(
        self, transport: HostTransport, fn: Callable[[libvirt.virConnect], T], what: str
    ) -> T:
        return await transport.run(fn, what, self._deadline())

    def _lock(self, host: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((host, name), asyncio.Lock())

    def _parse(self, provider_id: str) -> tuple[HostConfig, str]:
        match = _PROVIDER_ID.match(provider_id)
        if match is None:
            raise NotFound(
                f"{provider_id!r} is not a kvm provider id (hosts/<host>/domains/<name>)"
            )
        host = self.hosts.get(match["host"])
        if host is None:
            raise Permanent(
                f"{provider_id}: host {match['host']!r} is no longer in the kvm config; add it "
                "back to reach this VM, or delete the VM on that host by hand"
            )
        return host, match["name"]

    def _parse_volume(self, leftover: Leftover) -> tuple[HostConfig, volumes.OrphanVolume]:
        match = _VOLUME_ID.match(leftover.provider_id)
        if match is None:
            raise Permanent(
                f"{leftover.provider_id!r} is not a kvm volume id (hosts/<host>/volumes/<pool>/"
                "<volume>)"
            )
        host = self.hosts.get(match["host"])
        if host is None or host.pool != match["pool"]:
            raise Permanent(
                f"{leftover.provider_id}: host {match['host']!r} with pool {match['pool']!r} is "
                "not in the kvm config (any more); delete the volume on that host by hand"
            )
        vm = is_per_vm_volume(match["volume"])
        if vm is None:
            raise Permanent(f"{leftover.provider_id}: not the disk or seed of a VM we name")
        orphan = volumes.OrphanVolume(
            host=host.name,
            pool=host.pool,
            volume=match["volume"],
            vm=vm,
            owner_uid=leftover.owner_uid,
            modified_at=None,
        )
        return host, orphan

    async def _address(self, link: HostLink, name: str) -> str:
        """ARP first (no guest cooperation needed), then the guest agent; a source that fails
        means "no address yet", unless the connection itself failed."""
        for source in (
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        ):
            try:
                ip = await link.run(
                    partial(guests.addresses_of, name=name, source=source),
                    f"addresses of {name}",
                    self._deadline(),
                )
            except ProviderError:
                if link.broken:
                    raise
                continue
            if ip:
                return ip
        return ""

    async def _list_host(self, host: HostConfig) -> list[Instance]:
        transport = self.transports[host.name]
        found = await self._run(transport, guests.list_domains, f"list domains on {host.name}")
        return [self._instance(host, seen) for seen in found]

    def _instance(self, host: HostConfig, seen: guests.Seen) -> Instance:
        meta = seen.meta
        return Instance(
            provider_id=f"hosts/{host.name}/domains/{seen.name}",
            name=seen.name,
            state=guests.instance_state(seen.state, seen.ip),
            owner_uid=meta.owner_uid,
            created_at=meta.created_at,
            ip=seen.ip,
            instance_uid=seen.uuid,
            labels={
                MANAGED_LABEL: "true",
                OWNER_LABEL: meta.owner_uid,
                CREATED_AT_LABEL: meta.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                HOST_LABEL: host.name,
                **({NAMESPACE_LABEL: meta.namespace} if meta.namespace else {}),
                **({NAME_LABEL: meta.proxy_name} if meta.proxy_name else {}),
            },
        )


def _delete_unused(
    conn: libvirt.virConnect, host: HostConfig, orphan: volumes.OrphanVolume
) -> bool:
    """True when the volume is gone, already gone included; False when its domain is back."""
    if volumes.delete_orphan(conn, host, orphan):
        return True
    try:
        conn.lookupByName(orphan.vm)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return True  # not deleted because the volume (or its pool) was gone already
        raise
    return False
