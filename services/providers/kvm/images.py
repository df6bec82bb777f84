"""The image cache on each hypervisor: downloaded cloud images as volumes of its storage pool.

The pool is the only state. An image is a base volume named by its content (``base_name``) plus a
marker volume holding the sha256 of the verified upload; the marker is written last, so a base
without it is an interrupted download (or one in progress). Ready = both exist and the marker is
a sha256 equal to the configured one, if any. Otherwise the image is downloaded (imagefetch.py).

One download per (host, image) at a time, across every executor replica: the downloader holds
the image's lock volume (imagelock.py), and only the holder deletes leftovers, uploads, and
writes the marker (after checking the lock is still its own). Others poll the pool until the
marker appears (ready), the lock goes (they try to take it), or it goes stale (taken over).
Within one process an asyncio lock keeps the others from polling at all.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import structlog

from services.providers.base import ProviderError, Transient
from services.providers.kvm import imagelock
from services.providers.kvm.imagefetch import Fetcher
from services.providers.kvm.imagelock import (
    CHUNK,
    Seen,
    delete_volume,
    download_bytes,
    is_stale,
    lock_name,
    lookup_volume,
    new_lock,
    upload_bytes,
)
from services.providers.kvm.pure.config import ImageConfig
from services.providers.kvm.pure.domain import base_name, marker_name, raw_volume_xml
from services.providers.kvm.transport import HostTransport

# volumes.py and the tests use the volume helpers from here, where they used to live.
__all__ = [
    "BaseImage",
    "ImageCache",
    "delete_volume",
    "download_bytes",
    "lookup_volume",
    "upload_bytes",
]

log = structlog.get_logger("egress.provider.kvm")

_MARKER_MAX = 256
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
# Removing what a failed download left must not wait on a deadline that has already passed; a
# holder's lock lasts this much longer than its deadline, so the cleanup still holds it.
_CLEANUP_SECONDS = 30.0
# What one look at the pool may take, at most, while waiting for another replica's download.
_LOOK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class BaseImage:
    """A ready image in one host's pool: what an overlay backs onto."""

    name: str
    path: str
    format: str
    capacity: int


@dataclass(frozen=True, slots=True)
class _Inspection:
    base: BaseImage | None
    marker: str | None
    lock: Seen | None

    def ready(self, sha256: str) -> BaseImage | None:
        """The base when usable: a marker cut off mid-write holds no sha256, so is not one."""
        if self.base is None or self.marker is None or not _SHA256.match(self.marker):
            return None
        return self.base if not sha256 or self.marker == sha256 else None


@dataclass(frozen=True, slots=True)
class _Lease:
    """This caller holds the image's lock: ``token`` is in it. The holder acts until
    ``release_by`` (loop time); others take the lock over only a skew grace after that."""

    token: str
    release_by: float


def _base_image(volume: libvirt.virStorageVol, fmt: str) -> BaseImage:
    _kind, capacity, _allocation = volume.info()
    return BaseImage(volume.name(), volume.path(), fmt, int(capacity))


@dataclass(frozen=True, slots=True)
class _Target:
    """One image on one host: what every step below works on."""

    transport: HostTransport
    pool: str
    base: str
    image: ImageConfig

    @property
    def host(self) -> str:
        return self.transport.host.name


class ImageCache:
    """Ensures images on hosts; one instance per provider (it owns the HTTP client)."""

    def __init__(
        self,
        *,
        download_timeout: float = 3600.0,
        chunk_size: int = CHUNK,
        poll_interval: float = 2.0,
    ) -> None:
        self.download_timeout = download_timeout
        # How often a caller waiting for another replica's download looks at the pool again.
        self.poll_interval = poll_interval
        self.fetcher = Fetcher(chunk_size)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._releases: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._releases:
            await asyncio.wait(self._releases, timeout=_CLEANUP_SECONDS)
        await self.fetcher.close()

    async def ensure(self, transport: HostTransport, pool: str, image: ImageConfig) -> BaseImage:
        """The image's base volume on this host, downloading it first when not ready."""
        target = _Target(transport, pool, base_name(image), image)
        lock = self._locks.setdefault((target.host, target.base), asyncio.Lock())
        async with lock:
            deadline = asyncio.get_running_loop().time() + self.download_timeout
            found = await self._ready_or_lease(target, deadline)
            if isinstance(found, BaseImage):
                return found
            return await self._fill(target, found, deadline)

    async def _ready_or_lease(self, target: _Target, deadline: float) -> BaseImage | _Lease:
        """The ready image, or the lock to download it under; waits while another holds it."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting_for: str | None = None
        while True:
            found = await target.transport.run(
                lambda conn: _inspect(conn, target),
                f"inspect image {target.base} in pool {target.pool}",
                deadline,
            )
            ready = found.ready(target.image.sha256)
            if ready is not None:
                if waiting_for is not None:
                    log.info("kvm image ready after waiting", volume=target.base)
                return ready
            lock = found.lock
            if lock is None or is_stale(lock, time.time(), self.download_timeout):
                taken = await self._acquire(target, lock, deadline)
                if not isinstance(taken, _Inspection):
                    return taken
                lock = taken.lock
            holder = lock.describe() if lock is not None else "another executor"
            if waiting_for != holder:
                waiting_for = holder
                log.info("kvm image busy", host=target.host, volume=target.base, holder=holder)
            # Give up while there is still time for a look: one cut off by the deadline would
            # close the link under everyone else's calls.
            if deadline - loop.time() < self.poll_interval + _LOOK_SECONDS:
                raise Transient(
                    f"{target.host}: image {target.base} is still being downloaded by {holder} "
                    f"after {loop.time() - started:.0f}s of waiting; a retry uses it once ready"
                )
            await asyncio.sleep(self.poll_interval)

    async def _acquire(
        self, target: _Target, seen: Seen | None, deadline: float
    ) -> _Lease | BaseImage | _Inspection:
        """Try to take the lock (taking a stale one over). Taken: the lease, or the image when
        it became ready meanwhile (the lock is then released). Not taken: the pool as seen."""
        lifetime = deadline - asyncio.get_running_loop().time() + _CLEANUP_SECONDS
        info = new_lock(time.time(), lifetime)
        lease = _Lease(info.token, deadline + _CLEANUP_SECONDS)

        def claim(conn: libvirt.virConnect) -> tuple[bool, _Inspection]:
            pool = conn.storagePoolLookupByName(target.pool)
            taken = imagelock.acquire(
                conn, pool, target.base, seen, info, fallback_lifetime=self.download_timeout
            )
            found = _inspect(conn, target)
            if taken and found.ready(target.image.sha256) is not None:
                imagelock.drop(pool, target.base)
            return taken, found

        try:
            taken, found = await target.transport.run(claim, f"lock image {target.base}", deadline)
        except BaseException:
            # The lock may exist without us knowing: release it if it carries our token.
            await self._abandon(target, lease, digest=None, cleanup=False)
            raise
        ready = found.ready(target.image.sha256)
        if ready is not None:
            return ready
        return lease if taken else found

    async def _fill(self, target: _Target, lease: _Lease, deadline: float) -> BaseImage:
        """Download the image under ``lease``; whatever happens, the lock is released."""
        base = target.base
        log.info("kvm image download", host=target.host, image=target.image.url, volume=base)
        digest: str | None = None
        try:
            link = await target.transport.link(deadline)
            await link.run(
                lambda conn: _delete_leftovers(conn, target, lease.token),
                f"delete leftovers of {base}",
                deadline,
            )
            digest = await self.fetcher.download(link, target.pool, base, target.image, deadline)
            verified = digest
            ready = await link.run(
                lambda conn: _finish(conn, target, lease.token, verified),
                f"finish image {base}",
                deadline,
            )
        except BaseException:
            await self._abandon(target, lease, digest=digest, cleanup=True)
            raise
        log.info("kvm image ready", host=target.host, volume=base, sha256=digest)
        return ready

    async def _abandon(
        self, target: _Target, lease: _Lease, *, digest: str | None, cleanup: bool
    ) -> None:
        """Release the lock if it is still ours, first (``cleanup``) deleting what the failed
        download left unless its marker made it (the image is then good, and may be in use
        already). A task of its own: a caller cancelled again still lets it finish."""

        async def release() -> None:
            by = min(asyncio.get_running_loop().time() + _CLEANUP_SECONDS, lease.release_by)
            try:
                await target.transport.run(
                    lambda conn: _release(conn, target, lease.token, digest, cleanup=cleanup),
                    f"release the lock of {target.base}",
                    by,
                )
            except ProviderError as exc:
                # It goes stale once past its expiry, and is then taken over.
                log.warning("kvm image lock not released", volume=target.base, error=str(exc))

        task = asyncio.ensure_future(release())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)
        await asyncio.shield(task)


# ------------------------------------------------------------ libvirt steps (in the host thread)


def _inspect(conn: libvirt.virConnect, target: _Target) -> _Inspection:
    """What the pool holds of the image. Another replica may be creating any of these volumes
    right now, and libvirt refuses to read one until its createXML returns: that one counts as
    not there yet (a lock counts as held)."""
    pool = conn.storagePoolLookupByName(target.pool)
    marker = _marker(conn, pool, target.base)
    lock = imagelock.read_lock(conn, pool, lock_name(target.base))
    base = None
    volume = lookup_volume(pool, target.base)
    if volume is not None and marker is not None:
        try:
            base = _base_image(volume, target.image.format)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
                raise
    return _Inspection(base, marker, lock)


def _marker(conn: libvirt.virConnect, pool: libvirt.virStoragePool, base: str) -> str | None:
    volume = lookup_volume(pool, marker_name(base))
    if volume is None:
        return None
    try:
        data = download_bytes(conn, volume, _MARKER_MAX)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL or imagelock.being_built(exc):
            return None
        raise
    return data.decode(errors="replace").strip()


def _delete_leftovers(conn: libvirt.virConnect, target: _Target, token: str) -> None:
    pool = conn.storagePoolLookupByName(target.pool)
    imagelock.check_held(conn, pool, target.base, token, "not deleting its leftovers")
    # The marker first: a base without its marker is never taken for ready.
    delete_volume(pool, marker_name(target.base))
    delete_volume(pool, target.base)


def _finish(conn: libvirt.virConnect, target: _Target, token: str, digest: str) -> BaseImage:
    pool = conn.storagePoolLookupByName(target.pool)
    imagelock.check_held(conn, pool, target.base, token, "not writing its marker")
    # The upload wrote a qcow2 into a volume sized to the file; the refresh makes libvirt read
    # the image's own header (virtual size) before overlays use it. libvirt refuses it while
    # another volume is being built (a VM's overlay, by any replica): the volume's own info,
    # read below, reads the header too, so that is no reason to throw the download away.
    try:
        pool.refresh(0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_INTERNAL_ERROR:
            raise
        log.debug("kvm pool refresh skipped", pool=target.pool, error=str(exc))
    volume = pool.storageVolLookupByName(target.base)
    marker = pool.createXML(raw_volume_xml(marker_name(target.base), len(digest)), 0)
    upload_bytes(conn, marker, digest.encode())
    imagelock.drop(pool, target.base)
    return _base_image(volume, target.image.format)


def _release(
    conn: libvirt.virConnect, target: _Target, token: str, digest: str | None, *, cleanup: bool
) -> None:
    pool = conn.storagePoolLookupByName(target.pool)
    if not imagelock.holds(conn, pool, target.base, token):
        return  # taken over: whatever is there is no longer ours to touch
    if cleanup and (digest is None or _marker(conn, pool, target.base) != digest):
        try:
            delete_volume(pool, marker_name(target.base))
            delete_volume(pool, target.base)
        except libvirt.libvirtError as exc:
            # Still open for the cut-off upload, say: the next holder deletes it.
            log.warning("kvm image cleanup failed", volume=target.base, error=str(exc))
    imagelock.drop(pool, target.base)
