"""The embedded default provider: one real forward proxy process per instance on 127.0.0.1.

For development and demos without a cloud account or a cluster, yet with the same semantics as the
real providers, so the reconciler, health prober and GC are exercised for real: a create returns
before the proxy listens (Pending), a crashed proxy is Stopped, and instances outlive the executor
(each runs in its own session and is recorded on disk).

On disk, under ``dataDir/instances/<name>/``: ``meta.json`` (written atomically: owner uid,
created-at, port, pid, backend, spec hash), the backend's config, the pid file the process writes
itself, and its log; with leases enforced (D84), the lease helper, the proxy's key (mode 0600)
and the helper's fencing state. The record is written *before* the process is spawned, so every
process has a record and a crash can never leave one that no ``list_by_tag`` (and so no GC) would
find.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import structlog

from events.schemas import InstanceState
from services.providers import local_process as proc
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
    NotFound,
    Permanent,
    Transient,
)
from services.providers.pure import squidconf
from services.providers.pure.targets import AllowedTarget, targets_problem
from services.runtime.settings.errors import ConfigError

log = structlog.get_logger("egress.provider.local")

META_FILE = "meta.json"
BACKEND_LABEL = "egress-proxies/backend"
SPEC_HASH_LABEL = "egress-proxies/spec-hash"
# Names become directory names: no separators, no dot-only names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_PORT_RANGE = r"^\d{1,5}-\d{1,5}$"


def parse_port_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    lo, hi = int(low), int(high)
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"portRange {text!r}: use LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
    return lo, hi


class LocalConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """The ``local:`` block of a providers-config entry."""

    data_dir: str = ""
    backend: Literal["auto", "squid", "proxypy"] = "auto"
    port_range: Annotated[str, msgspec.Meta(pattern=_PORT_RANGE)] = "20000-29999"
    stop_grace_seconds: Annotated[float, msgspec.Meta(ge=0)] = 3.0
    outgoing_address: str = ""
    """The source address of the proxies' connections to targets (Squid's
    ``tcp_outgoing_address``): an IP literal this host owns; "" for the host's own choice."""
    allowed_targets: tuple[AllowedTarget, ...] = ()
    """Non-public ranges and ports the proxies may reach beyond loopback HTTP (D134)."""

    def __post_init__(self) -> None:
        parse_port_range(self.port_range)
        problem = targets_problem(self.allowed_targets)
        if problem:
            raise ValueError(problem)
        if self.outgoing_address:
            try:
                squidconf.outgoing_address(self.outgoing_address)
            except ValueError as exc:
                raise ValueError(f"outgoingAddress {exc}") from None
            if self.backend == proc.PROXYPY:
                raise ValueError(PROXYPY_NO_OUTGOING)


PROXYPY_NO_OUTGOING = (
    "outgoingAddress needs the squid backend: proxy.py cannot choose the source address of "
    "every connection (it ignores one for targets named by IP address); use backend squid or "
    "auto with Squid installed, or leave outgoingAddress out"
)


class InstanceMeta(msgspec.Struct, kw_only=True, rename="camel"):
    """``meta.json``: what survives an executor restart."""

    name: str
    owner_uid: str
    created_at: datetime
    port: int
    backend: str
    instance_uid: str
    namespace: str = ""
    proxy_name: str = ""
    spec_hash: str = ""
    pid: int = 0
    extra: dict[str, str] = msgspec.field(default_factory=dict)
    """What a type built on this one records of an instance (an upstream session's id)."""


@dataclass(frozen=True, slots=True)
class _Found:
    path: Path
    meta: InstanceMeta


class LocalProvider:
    """A ``Provider`` running proxies as local processes; see the module docstring."""

    type = "local"

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        backend: str = "auto",
        port_range: tuple[int, int] = (20000, 29999),
        stop_grace: float = 3.0,
        start_grace: float = 10.0,
        outgoing: str = "",
        targets: tuple[AllowedTarget, ...] = (),
    ) -> None:
        problem = targets_problem(targets, "local.allowedTargets")
        if problem:
            raise ConfigError(f"provider {name!r}: {problem}")
        self.targets = targets
        try:
            self.backend = proc.resolve_backend(backend)
        except ValueError as exc:
            raise ConfigError(f"provider {name!r}: {exc}") from exc
        try:
            self.outgoing = squidconf.outgoing_address(outgoing) if outgoing else ""
        except ValueError as exc:
            raise ConfigError(f"provider {name!r}: local.outgoingAddress {exc}") from exc
        if self.outgoing and self.backend != proc.SQUID:
            chose = "auto chose proxypy (no squid on PATH)" if backend == "auto" else backend
            raise ConfigError(f"provider {name!r}: backend {chose}: {PROXYPY_NO_OUTGOING}")
        problem = proc.unbindable(self.outgoing) if self.outgoing else ""
        if problem:
            # Squid would start, then fail every request: say so now, not as unhealthy proxies.
            raise ConfigError(
                f"provider {name!r}: local.outgoingAddress {self.outgoing} cannot be a source "
                f"address on this host ({problem}); use an address of one of its interfaces "
                "(`ip addr` lists them; any 127.x.y.z works on Linux)"
            )
        self.name = name
        self.data_dir = data_dir.resolve()
        self.port_range = port_range
        self.stop_grace = stop_grace
        self.start_grace = start_grace
        self._instances = self.data_dir / "instances"

    @classmethod
    def from_config(cls, name: str, config: LocalConfig) -> LocalProvider:
        if not config.data_dir:
            raise ConfigError(f"provider {name!r}: local.dataDir is required")
        return cls(
            name,
            Path(config.data_dir),
            backend=config.backend,
            port_range=parse_port_range(config.port_range),
            stop_grace=config.stop_grace_seconds,
            outgoing=config.outgoing_address,
            targets=config.allowed_targets,
        )

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        if not _NAME.match(request.name):
            raise Permanent(
                f"{self.name}: instance name {request.name!r} is not usable as a directory "
                "name; use letters, digits, '.', '_' or '-' (at most 128)"
            )
        try:
            return await asyncio.to_thread(self._create, request)
        except OSError as exc:
            raise proc.classify_os_error(f"{self.name}: create {request.name}", exc) from exc

    async def get(self, provider_id: str) -> Instance:
        found = self._find(provider_id)
        if found is None:
            raise NotFound(f"{self.name}: no instance {provider_id}")
        return await self._observe(found)

    async def delete(self, provider_id: str) -> None:
        if not _NAME.match(provider_id):
            return  # could never have been created
        path = self._instances / provider_id
        try:
            # Re-created under our feet (a racing create) means terminate again, a few times.
            for _ in range(3):
                if not path.exists():
                    return
                await proc.terminate(self._pid(path), path, self.stop_grace)
                if await asyncio.to_thread(self._remove, path):
                    return
        except OSError as exc:
            raise proc.classify_os_error(f"{self.name}: delete {provider_id}", exc) from exc
        raise Transient(f"{self.name}: {provider_id} keeps being re-created while deleting")

    async def list_by_tag(self) -> list[Instance]:
        try:
            found = await asyncio.to_thread(self._scan)
        except OSError as exc:
            raise proc.classify_os_error(f"{self.name}: list", exc) from exc
        return list(await asyncio.gather(*(self._observe(item) for item in found)))

    async def close(self) -> None:
        """Nothing to release: the proxies deliberately outlive the provider."""

    # ---------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise record changes across threads, providers and executor processes sharing
        the directory (port allocation and create-vs-delete must not interleave)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _create(self, request: CreateRequest) -> str:
        with self._locked():
            path = self._instances / request.name
            found = self._find(request.name)
            if found is None:
                if path.exists():
                    shutil.rmtree(path)  # leftovers of a delete that crashed: no process
                # What a former life at this path left outside it (a data dir wiped by hand):
                # its helper's fencing state would refuse this instance's first leases.
                proc.remove_leftovers(path)
                extra = self._new_extra(request)
                path.mkdir(parents=True)
                meta = InstanceMeta(
                    name=request.name,
                    owner_uid=request.owner_uid,
                    created_at=datetime.now(UTC),
                    port=proc.allocate_port(*self.port_range, self._taken_ports()),
                    backend=self.backend,
                    instance_uid=str(uuid.uuid4()),
                    namespace=request.namespace,
                    proxy_name=request.proxy_name,
                    spec_hash=request.spec_hash,
                    extra=extra,
                )
                command = self._prepare(path, meta, request)
                self._write(path, meta)  # the record first: see the module docstring
            elif self._pid(path):
                return request.name
            else:
                meta = found.meta  # recorded, then the creator crashed before spawning
                command = self._prepare(path, meta, request)
            meta.pid = proc.spawn(command, path)
            self._write(path, meta)
            log.info("instance started", provider=self.name, name=meta.name, port=meta.port)
        return request.name

    def _new_extra(self, request: CreateRequest) -> dict[str, str]:
        """What a new record keeps beside the instance's basics; a type built on this one
        (``upstream``) mints its session here, under the lock, before anything is written."""
        return {}

    def _prepare(self, path: Path, meta: InstanceMeta, request: CreateRequest) -> list[str]:
        """The proxy's files and command line, for a new record or one never spawned."""
        return proc.prepare(
            meta.backend,
            path,
            meta.port,
            meta.name,
            lease_auth=request.lease_auth,
            outgoing=self.outgoing,
            targets=self.targets,
        )

    def _extra_labels(self, meta: InstanceMeta) -> dict[str, str]:
        """Labels a type built on this one derives from its record's ``extra``."""
        return {}

    def _remove(self, path: Path) -> bool:
        """Remove the record, unless a racing create has spawned a process meanwhile."""
        with self._locked():
            if proc.group_members(self._pid(path), path):
                return False
            # The record goes first: a crash part-way leaves leftovers, never a half record.
            (path / META_FILE).unlink(missing_ok=True)
            proc.remove_leftovers(path)
            shutil.rmtree(path)
            return True

    def _scan(self) -> list[_Found]:
        """Every readable record; an unreadable one is logged and left out rather than failing
        the listing, or one bad file would stop garbage collection for the whole provider."""
        found = []
        paths = sorted(self._instances.iterdir()) if self._instances.is_dir() else []
        for path in paths:
            try:
                item = self._find(path.name)
            except Permanent as exc:
                log.warning("unreadable instance record", path=str(path), error=str(exc))
                continue
            if item is not None:
                found.append(item)
        return found

    def _find(self, name: str) -> _Found | None:
        if not _NAME.match(name):
            return None
        path = self._instances / name
        try:
            data = (path / META_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise proc.classify_os_error(f"{self.name}: read {name}", exc) from exc
        try:
            return _Found(path, msgspec.json.decode(data, type=InstanceMeta))
        except msgspec.DecodeError as exc:
            raise Permanent(
                f"{self.name}: record {path / META_FILE} is unreadable ({exc}); delete the "
                "instance to clean it up"
            ) from exc

    def _pid(self, path: Path) -> int:
        """The pid the process wrote itself wins: the recorded one may be from a spawn whose
        prologue lost the race for the pid file."""
        pid = proc.read_pid(path)
        if pid:
            return pid
        with contextlib.suppress(Permanent):
            found = self._find(path.name)
            if found is not None:
                return found.meta.pid
        return 0

    def _taken_ports(self) -> set[int]:
        if not self._instances.is_dir():
            return set()
        ports = set()
        for path in self._instances.iterdir():
            with contextlib.suppress(Permanent):
                found = self._find(path.name)
                if found is not None:
                    ports.add(found.meta.port)
        return ports

    @staticmethod
    def _write(path: Path, meta: InstanceMeta) -> None:
        proc.write_atomic(path / META_FILE, msgspec.json.encode(meta))

    async def _observe(self, found: _Found) -> Instance:
        meta, path = found.meta, found.path
        pid = self._pid(path)
        ip = ""
        if not pid:
            # Recorded but not spawned: a create in flight, or one that crashed (a repeated
            # create finishes it); after the grace, the reconciler should replace it.
            age = (datetime.now(UTC) - meta.created_at).total_seconds()
            state = InstanceState.PENDING if age < self.start_grace else InstanceState.STOPPED
        elif not proc.is_running(pid, path):
            state = InstanceState.STOPPED
        elif await proc.accepts(meta.port):
            state, ip = InstanceState.RUNNING, proc.HOST
        else:
            state = InstanceState.PENDING
        labels = {
            MANAGED_LABEL: "true",
            OWNER_LABEL: meta.owner_uid,
            CREATED_AT_LABEL: meta.created_at.isoformat(),
            BACKEND_LABEL: meta.backend,
        }
        if meta.spec_hash:
            labels[SPEC_HASH_LABEL] = meta.spec_hash
        labels.update(self._extra_labels(meta))
        return Instance(
            provider_id=meta.name,
            name=meta.name,
            state=state,
            owner_uid=meta.owner_uid,
            created_at=meta.created_at,
            ip=ip,
            port=meta.port,
            instance_uid=meta.instance_uid,
            labels=labels,
        )
