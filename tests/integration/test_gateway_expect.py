"""A request body sent with ``Expect: 100-continue`` through the gateway: curl sends one for
every POST of more than 1 KiB, and waits for the interim ``100 Continue`` before the body. The
site answers a 100 of its own, as web servers do; the crawler must get one final answer, the
site's, and the connection must carry the next request."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.cli_process import clean_env
from tests.support.gateway import TOKENS, basic, fleet

pytestmark = pytest.mark.integration


HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"


@contextlib.asynccontextmanager
async def continuing_site() -> AsyncIterator[int]:
    """Answers ``100 Continue`` to a request that expects it (and a ``103 Early Hints`` to a
    path with ``/hints``), then 200 with the length of the body it read; keep-alive."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = 0
                for line in head.split("\r\n"):
                    if line.startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if "expect: 100-continue" in head:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if "/hints" in head.split("\r\n", 1)[0]:
                    writer.write(HINTS)
                body = await reader.readexactly(length)
                text = f"read {len(body)} bytes".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--noproxy", "", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=clean_env(),
    )


async def test_a_body_that_expects_100_continue_gets_the_sites_answer_once(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"x" * 4096)
    async with (
        continuing_site() as port,
        fleet(nats_server, jetstream_store, tmp_path) as f,
    ):
        proxy = f"http://crawler-a:{TOKENS['crawler-a']}@127.0.0.1:{f.gateway_port}"
        url = f"http://127.0.0.1:{port}/form"
        done = await asyncio.to_thread(
            curl,
            "-x", proxy,
            "-H", "Expect: 100-continue",
            "--expect100-timeout", "10",
            "--data-binary", f"@{body}",
            url,
            "--next", "-x", proxy, url + "?again",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == "read 4096 bytesread 0 bytes", done.stdout


async def test_the_gateway_says_continue_at_once_and_passes_the_final_answer_alone(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """A crawler that waits for the 100 before its body gets it from the gateway (which reads
    every body before it sends a request on); the site's interim answers (a 103) never reach
    the crawler, which gets one final answer per request, marked with its proxy and lease."""
    async with (
        continuing_site() as port,
        fleet(nats_server, jetstream_store, tmp_path) as f,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", f.gateway_port)
        auth = f"Proxy-Authorization: {basic('crawler-a', TOKENS['crawler-a'])}\r\n"
        for path in ("/form", "/hints"):
            head = f"POST http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: x\r\n{auth}"
            head += "Content-Length: 4096\r\nExpect: 100-continue\r\n\r\n"
            writer.write(head.encode())
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"y" * 4096)
            final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert final.startswith(b"HTTP/1.1 200 "), final
            assert b"X-Egress-Lease: " in final
            assert b"Early Hints" not in final
            assert await reader.readexactly(len(b"read 4096 bytes")) == b"read 4096 bytes"
        writer.close()
