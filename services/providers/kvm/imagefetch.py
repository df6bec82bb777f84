"""An image from HTTP into a pool volume, streamed: the download half of the image cache.

The body goes straight into ``virStorageVolUpload`` chunk by chunk while being hashed, so a
multi-gigabyte image costs one chunk of memory and the host needs no Internet access. HTTP 4xx
(the URL is wrong) and a checksum mismatch (the configured sha256 is wrong, or so is the server)
are Permanent; 5xx and network failures are Transient. A response without Content-Length is
Permanent: the volume is created with the size the upload fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable

import aiohttp
import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs

from services.providers.base import Permanent, ProviderError, Transient
from services.providers.kvm.imagelock import CHUNK, send_all
from services.providers.kvm.pure.config import ImageConfig
from services.providers.kvm.pure.domain import base_volume_xml
from services.providers.kvm.transport import HostLink

# Aborting an upload must not wait on a deadline that has already passed.
_ABORT_SECONDS = 30.0


def _sender(stream: libvirt.virStream, data: bytes) -> Callable[[libvirt.virConnect], None]:
    return lambda _conn: send_all(stream, data)


def _abort(stream: libvirt.virStream) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        stream.abort()


class Fetcher:
    """Downloads into volumes; owns the HTTP client (one per provider)."""

    def __init__(self, chunk_size: int = CHUNK) -> None:
        self.chunk_size = chunk_size
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60),
                auto_decompress=False,
            )
        return self._http

    async def download(
        self, link: HostLink, pool: str, base: str, image: ImageConfig, deadline: float
    ) -> str:
        """The verified sha256 of what was uploaded into ``base``."""
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
        return digest

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
            # link ends both; the holder's cleanup (or the next holder) deletes the leftover.
            link.close("cancelled during an image upload")
            raise
        except Exception:
            abort_by = asyncio.get_running_loop().time() + _ABORT_SECONDS
            with contextlib.suppress(ProviderError):
                await link.run(lambda _conn: _abort(stream), f"abort upload of {base}", abort_by)
            raise
        return hasher.hexdigest()
