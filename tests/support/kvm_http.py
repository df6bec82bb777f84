"""A local HTTP server for cloud images: a real qcow2 made by qemu-img, and the ways a download
goes wrong (404, 503, no Content-Length). It counts requests per path, so a test can tell that
a second VM on the same host downloaded nothing."""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class ImageServer:
    image: bytes
    port: int = 0
    requests: Counter[str] = field(default_factory=Counter)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.image).hexdigest()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"


@contextlib.asynccontextmanager
async def image_server(image: bytes) -> AsyncIterator[ImageServer]:
    served = ImageServer(image)

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        served.requests[name] += 1
        if name == "missing.qcow2":
            return web.Response(status=404, text="no such image")
        if name == "busy.qcow2":
            return web.Response(status=503, text="try later")
        if name == "chunked.qcow2":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(served.image)
            await response.write_eof()
            return response
        # Written in pieces, so the provider's side really streams.
        response = web.StreamResponse(headers={"Content-Length": str(len(served.image))})
        await response.prepare(request)
        for start in range(0, len(served.image), 64 * 1024):
            await response.write(served.image[start : start + 64 * 1024])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.port = runner.addresses[0][1]
    try:
        yield served
    finally:
        await runner.cleanup()
