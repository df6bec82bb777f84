"""The local provider's ``outgoingAddress`` with real Squids: each proxy's requests reach a target
from the address its provider was given, which is what makes one host's proxies tell apart by
their egress address (the loopback stand-in for distinct public addresses)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.schemas import InstanceState
from services.providers.local import LocalProvider
from tests.contract.provider import delete_all, request_factory
from tests.support.echo import Echo, echo_server
from tests.support.waiting import until

pytestmark = pytest.mark.integration

WAIT = 30.0
SOURCES = ("127.0.0.2", "127.0.0.3")


@pytest.fixture
async def providers(tmp_path: Path) -> AsyncIterator[list[LocalProvider]]:
    made = [
        LocalProvider(
            f"local-{i}",
            tmp_path / f"local-{i}",
            backend="squid",
            stop_grace=0.5,
            outgoing=source,
        )
        for i, source in enumerate(SOURCES)
    ]
    yield made
    for provider in made:
        await delete_all(provider)


async def running_port(provider: LocalProvider) -> int:
    provider_id = await provider.create(request_factory(provider.name)("px"))

    async def is_running() -> bool:
        return (await provider.get(provider_id)).state is InstanceState.RUNNING

    await until(is_running, WAIT, what=f"{provider.name} Running")
    return (await provider.get(provider_id)).port


async def through(proxy_port: int, url: str) -> tuple[bytes, bytes]:
    """The status line and body of ``url`` fetched through the proxy on ``proxy_port``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    try:
        writer.write(f"GET {url} HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        return head.split(b"\r\n")[0], await asyncio.wait_for(reader.read(), WAIT)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_each_proxy_reaches_targets_from_its_own_address(
    providers: list[LocalProvider],
) -> None:
    ports = await asyncio.gather(*(running_port(p) for p in providers))
    echo: Echo
    async with echo_server() as echo:
        for port, source in zip(ports, SOURCES, strict=True):
            status, body = await through(port, echo.url)
            assert status.startswith(b"HTTP/1.1 200"), status
            assert body == f"{source}\n".encode()
        # A second request through the first proxy: the address holds, not just the first one.
        assert (await through(ports[0], echo.url))[1] == b"127.0.0.2\n"
        assert echo.requests == {"127.0.0.2": 2, "127.0.0.3": 1}


async def test_without_an_address_the_proxy_connects_from_the_hosts_choice(
    tmp_path: Path,
) -> None:
    provider = LocalProvider("plain", tmp_path / "plain", backend="squid", stop_grace=0.5)
    try:
        port = await running_port(provider)
        async with echo_server() as echo:
            assert (await through(port, echo.url))[1] == b"127.0.0.1\n"
    finally:
        await delete_all(provider)
