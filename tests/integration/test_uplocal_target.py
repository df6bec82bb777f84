"""The target `up` serves for its local proxies (services/cli/run/uplocal.py): 200 to any probe, the
caller's address at the echo URL, even through a real Squid with an ``outgoingAddress``, and a
bounded read of whatever a client sends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from events.schemas import InstanceState
from services.cli.run import uplocal
from services.providers.local import LocalProvider
from tests.contract.provider import delete_all, request_factory
from tests.support.waiting import until

pytestmark = pytest.mark.integration

WAIT = 30.0
JUNK = 1024 * 1024


@dataclass
class Target:
    sock: socket.socket
    task: asyncio.Task[None]

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    sock = uplocal.probe_socket()
    task = asyncio.create_task(uplocal.serve_probe_target(sock))
    yield Target(sock, task)
    assert not task.done(), "the target stopped serving"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    sock.close()


async def ask(
    port: int, request: bytes, source: str = "127.0.0.1", proxy_port: int = 0
) -> tuple[bytes, dict[str, str], bytes]:
    """Status line, headers and body of one request, sent from ``source`` (any 127.x.y.z is
    bindable on Linux) to the target, or to the proxy on ``proxy_port``."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy_port or port, local_addr=(source, 0)
    )
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        body = await asyncio.wait_for(reader.read(), WAIT)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0].encode(), headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n".encode()


async def test_the_echo_url_answers_the_address_the_connection_came_from(target: Target) -> None:
    url = uplocal.echo_url(target.sock)
    assert url == f"http://127.0.0.1:{target.port}/egress"
    path = urlsplit(url).path
    status, headers, body = await ask(target.port, get(path))
    assert (status, headers["content-type"], body) == (
        b"HTTP/1.1 200 OK",
        "text/plain",
        b"127.0.0.1\n",
    )
    assert (await ask(target.port, get(f"{path}?proxy=p1"), source="127.0.0.2"))[
        2
    ] == b"127.0.0.2\n"
    # Absolute form, as a proxy client would send it.
    assert (await ask(target.port, get(url), source="127.0.0.4"))[2] == b"127.0.0.4\n"


@pytest.mark.parametrize("request_", [get("/"), get("/egressx"), b"POST /egress HTTP/1.1\r\n\r\n"])
async def test_everything_else_is_answered_ok_as_before(target: Target, request_: bytes) -> None:
    status, _, body = await ask(target.port, request_, source="127.0.0.2")
    assert (status, body) == (b"HTTP/1.1 200 OK", b"ok\n")


async def test_through_a_squid_the_echo_answers_its_outgoing_address(
    target: Target, tmp_path: Path
) -> None:
    provider = LocalProvider(
        "local", tmp_path / "local", backend="squid", stop_grace=0.5, outgoing="127.0.0.3"
    )
    try:
        provider_id = await provider.create(request_factory("local")("px"))

        async def running() -> bool:
            return (await provider.get(provider_id)).state is InstanceState.RUNNING

        await until(running, WAIT, what="Squid Running")
        proxy_port = (await provider.get(provider_id)).port
        request = get(uplocal.echo_url(target.sock))
        status, _, body = await ask(target.port, request, proxy_port=proxy_port)
        assert (status, body) == (b"HTTP/1.1 200 OK", b"127.0.0.3\n")
    finally:
        await delete_all(provider)


async def junk_answer(port: int, junk: bytes) -> bytes:
    """What the target answers ``junk``: its status line, or b"" when it closed (or reset) the
    connection without one; it must never wait for all of it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(junk)
            await writer.drain()
        try:
            return await asyncio.wait_for(reader.readline(), WAIT)
        except ConnectionError:
            return b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize(
    "junk",
    [
        pytest.param(b"x" * JUNK, id="one-long-line"),
        pytest.param(b"GET / HTTP/1.1\r\n" + b"X-Junk: y\r\n" * (JUNK // 11), id="endless-headers"),
        pytest.param(bytes(range(256)) * (JUNK // 256), id="binary"),
    ],
)
async def test_a_mebibyte_of_junk_is_refused_and_the_target_keeps_serving(
    target: Target, junk: bytes
) -> None:
    answer = await junk_answer(target.port, junk)
    assert answer in (b"", b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert (await ask(target.port, get("/egress")))[2] == b"127.0.0.1\n"


async def test_a_client_that_never_finishes_its_request_is_dropped(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uplocal, "READ_SECONDS", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    writer.write(b"GET /egress HTTP/1.1\r\nHost: t")
    assert await asyncio.wait_for(reader.read(), WAIT) == b""
    writer.close()
    await writer.wait_closed()


async def test_a_head_one_byte_over_the_cap_is_answered_431(target: Target) -> None:
    # Read in full before the cap is passed (the last line passes it), so no unread byte can
    # turn the close into a reset that loses the answer: the 431 itself is what is checked.
    start = b"GET /egress HTTP/1.1\r\nX-Pad: "
    head = start + b"p" * (uplocal.MAX_HEAD + 1 - len(start) - 4) + b"\r\n\r\n"
    assert len(head) == uplocal.MAX_HEAD + 1
    status, _, body = await ask(target.port, head)
    assert (status, body) == (b"HTTP/1.1 431 Request Header Fields Too Large", b"too large\n")
    exact = head[:-5] + b"\r\n\r\n"
    assert (await ask(target.port, exact))[2] == b"127.0.0.1\n"
