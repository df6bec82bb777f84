"""The image cache on each hypervisor: downloaded cloud images as volumes of its storage pool.

The pool is the only state. An image is a base volume named by its content (``base_name``) plus a
marker volume holding the sha256 of the verified upload; the marker is written last, so a base
without it is an interrupted download. Ready = both exist and, when a sha256 is configured, the
marker says exactly that. Anything else is deleted and downloaded again, streamed from HTTP
straight into ``virStorageVolUpload`` chunk by chunk while hashing: nothing is buffered whole, so a
multi-gigabyte image costs one chunk of memory. One download per (host, image) at a time; callers
waiting for it find the image ready when it finishes.

HTTP 4xx (the URL is wrong) and a checksum mismatch (the configured sha256 is wrong, or so is the
server) are Permanent; 5xx and network failures are Transient. A response without Content-Length
is Permanent: the volume must be created with the size the upload fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import libvirt  # type: ignore[import-untyped, unused-ignore]  # no stubs; see pyproject
import structlog

from services.executor.providers.base import Permanent, ProviderError, Transient
from services.executor.providers.kvm.config import ImageConfig
from services.executor.providers.kvm.domain import (
    base_name,
    base_volume_xml,
    marker_name,
    raw_volume_xml,
)
from services.executor.providers.kvm.transport import HostLink, HostTransport

log = structlog.get_logger("egress.provider.kvm")

CHUNK = 1 << 20
_MARKER_MAX = 256
# Removing what a failed download left must not wait on a deadline that has already passed.
_CLEANUP_SECONDS = 30.0


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


def lookup_volume(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    """The volume, or None when the pool has none of that name."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def delete_volume(pool: libvirt.virStoragePool, name: str) -> bool:
    """Delete ``name`` if it exists; True when it did."""
    volume = lookup_volume(pool, name)
    if volume is None:
        return False
    try:
        volume.delete(0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
            raise
    return True


def upload_bytes(conn: libvirt.virConnect, volume: libvirt.virStorageVol, data: bytes) -> None:
    """Small contents (seed ISO, marker) in one stream."""
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, len(data), 0)
        _send_all(stream, data)
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise


def download_bytes(conn: libvirt.virConnect, volume: libvirt.virStorageVol, limit: int) -> bytes:
    """At most ``limit`` bytes of a volume: markers, and seeds read back by tests."""
    stream = conn.newStream(0)
    chunks: list[bytes] = []
    try:
        volume.download(stream, 0, limit, 0)
        while True:
            got = stream.recv(CHUNK)
            if not got:
                break
            if isinstance(got, int):  # -2: only on non-blocking streams, which this is not
                raise RuntimeError(f"unexpected stream status {got}")
            chunks.append(got)
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise
    return b"".join(chunks)


def _sender(stream: libvirt.virStream, data: bytes) -> Callable[[libvirt.virConnect], None]:
    return lambda _conn: _send_all(stream, data)


def _abort(stream: libvirt.virStream) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        stream.abort()


def _send_all(stream: libvirt.virStream, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = stream.send(bytes(view))
        if sent <= 0:
            raise RuntimeError(f"libvirt stream refused data (status {sent})")
        view = view[sent:]


def _base_image(volume: libvirt.virStorageVol, fmt: str) -> BaseImage:
    _kind, capacity, _allocation = volume.info()
    return BaseImage(volume.name(), volume.path(), fmt, int(capacity))


class ImageCache:
    """Ensures images on hosts; one instance per provider (it owns the HTTP client)."""

    def __init__(self, *, download_timeout: float = 3600.0, chunk_size: int = CHUNK) -> None:
        self.download_timeout = download_timeout
        self.chunk_size = chunk_size
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def ensure(self, transport: HostTransport, pool: str, image: ImageConfig) -> BaseImage:
        """The image's base volume on this host, downloading it first when not ready."""
        base = base_name(image)
        lock = self._locks.setdefault((transport.host.name, base), asyncio.Lock())
        async with lock:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.download_timeout
            found = await transport.run(
                lambda conn: self._inspect(conn, pool, base, image.format),
                f"inspect image {base} in pool {pool}",
                deadline,
            )
            ready = found.marker is not None and found.marker == (image.sha256 or found.marker)
            if found.base is not None and ready:
                return found.base
            log.info(
                "kvm image download",
                host=transport.host.name,
                image=image.url,
                volume=base,
                leftover=found.base is not None,
            )
            link = await transport.link(deadline)
            await link.run(
                lambda conn: self._delete_both(conn, pool, base),
                f"delete leftovers of {base}",
                deadline,
            )
            try:
                return await self._download(link, pool, base, image, deadline)
            except Exception:
                # Not on cancellation: the link under it is closed then, and the next ensure
                # deletes the leftovers anyway.
                await self._cleanup(transport, pool, base)
                raise

    def _inspect(
        self, conn: libvirt.virConnect, pool_name: str, base: str, fmt: str
    ) -> _Inspection:
        pool = conn.storagePoolLookupByName(pool_name)
        volume = lookup_volume(pool, base)
        marker = lookup_volume(pool, marker_name(base))
        text = None
        if marker is not None:
            text = download_bytes(conn, marker, _MARKER_MAX).decode(errors="replace").strip()
        return _Inspection(None if volume is None else _base_image(volume, fmt), text)

    def _delete_both(self, conn: libvirt.virConnect, pool_name: str, base: str) -> None:
        pool = conn.storagePoolLookupByName(pool_name)
        # The marker first: a base without its marker is never taken for ready.
        delete_volume(pool, marker_name(base))
        delete_volume(pool, base)

    async def _cleanup(self, transport: HostTransport, pool: str, base: str) -> None:
        deadline = asyncio.get_running_loop().time() + _CLEANUP_SECONDS
        try:
            await transport.run(
                lambda conn: self._delete_both(conn, pool, base),
                f"delete the failed download {base}",
                deadline,
            )
        except ProviderError as exc:
            # The next ensure deletes it anyway: a base without a marker is never used.
            log.warning("kvm image cleanup failed", volume=base, error=str(exc))

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60),
                auto_decompress=False,
            )
        return self._http

    async def _download(
        self, link: HostLink, pool: str, base: str, image: ImageConfig, deadline: float
    ) -> BaseImage:
        url = image.url
        try:
            async with self._client().get(url) as response:
                if 400 <= response.status < 500:
                    raise Permanent(f"image {url}: HTTP {response.status} {response.reason}")
                if response.status >= 300:
                    raise Transient(f"image {url}: HTTP {response.status} {response.reason}")
                if response.content_length is None:
                    raise Permanent(
                        f"image {url}: the server sent no Content-Length; serve the image as "
                        "a plain file so its size is known before the upload"
                    )
                length = response.content_length
                if length <= 0:
                    raise Permanent(f"image {url}: the server sent an empty image")
                digest = await self._stream(
                    link,
                    pool=pool,
                    base=base,
                    image=image,
                    response=response,
                    length=length,
                    deadline=deadline,
                )
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise Permanent(f"image {url}: not a usable URL ({exc})") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Transient(f"image {url}: download failed ({exc or type(exc).__name__})") from exc
        if image.sha256 and digest != image.sha256:
            raise Permanent(
                f"image {url}: its sha256 is {digest}, not the configured {image.sha256}; "
                "fix kvm.images[].sha256 or the URL"
            )

        def finish(conn: libvirt.virConnect) -> BaseImage:
            pool_obj = conn.storagePoolLookupByName(pool)
            # The upload wrote a qcow2 into a volume sized to the file; the refresh makes
            # libvirt read the image's own header (virtual size, format) before overlays use it.
            pool_obj.refresh(0)
            volume = pool_obj.storageVolLookupByName(base)
            marker = pool_obj.createXML(raw_volume_xml(marker_name(base), len(digest)), 0)
            upload_bytes(conn, marker, digest.encode())
            return _base_image(volume, image.format)

        ready = await link.run(finish, f"finish image {base}", deadline)
        log.info("kvm image ready", host=link.host.name, volume=base, sha256=digest)
        return ready

    async def _stream(
        self,
        link: HostLink,
        *,
        pool: str,
        base: str,
        image: ImageConfig,
        response: aiohttp.ClientResponse,
        length: int,
        deadline: float,
    ) -> str:
        def start(conn: libvirt.virConnect) -> libvirt.virStream:
            pool_obj = conn.storagePoolLookupByName(pool)
            volume = pool_obj.createXML(base_volume_xml(base, length, image.format), 0)
            stream = conn.newStream(0)
            volume.upload(stream, 0, length, 0)
            return stream

        stream = await link.run(start, f"create volume {base}", deadline)
        hasher = hashlib.sha256()
        sent = 0
        try:
            async for chunk in response.content.iter_chunked(self.chunk_size):
                hasher.update(chunk)
                sent += len(chunk)
                if sent > length:
                    break
                await link.run(_sender(stream, chunk), f"upload {base}", deadline)
            if sent != length:
                raise Transient(
                    f"image {image.url}: got {sent} bytes, Content-Length said {length}"
                )
            await link.run(lambda _conn: stream.finish(), f"finish upload of {base}", deadline)
        except asyncio.CancelledError:
            # The daemon would keep the half-written volume open for this stream: closing the
            # link ends both, and the next ensure deletes the leftover.
            link.close("cancelled during an image upload")
            raise
        except Exception:
            abort_by = asyncio.get_running_loop().time() + _CLEANUP_SECONDS
            with contextlib.suppress(ProviderError):
                await link.run(lambda _conn: _abort(stream), f"abort upload of {base}", abort_by)
            raise
        return hasher.hexdigest()
