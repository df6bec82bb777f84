"""The test echo server (tests/support/echo.py): what each source is answered, and the ways it
can be made to misbehave for one source while answering the others."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.echo import MAX_HEAD, Echo, echo_server
from tests.support.waiting import until

pytestmark = pytest.mark.integration

WAIT = 10.0


async def connect(echo: Echo, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``source``: any 127.x.y.z is bindable on Linux without setup."""
    return await asyncio.open_connection("127.0.0.1", echo.port, local_addr=(source, 0))


async def fetch(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, path: str = "/ip"
) -> tuple[int, dict[str, str], bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: echo\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split(" ")[1]), headers, body


async def get(echo: Echo, source: str, path: str = "/ip") -> tuple[int, dict[str, str], bytes]:
    reader, writer = await connect(echo, source)
    try:
        return await fetch(writer, reader, path)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_each_source_is_answered_its_own_address_unless_mapped() -> None:
    async with echo_server() as echo:
        assert echo.url == f"http://127.0.0.1:{echo.port}/ip"
        echo.mapping["127.0.0.2"] = "203.0.113.7"
        status, headers, body = await get(echo, "127.0.0.1")
        assert (status, headers["content-type"], body) == (200, "text/plain", b"127.0.0.1\n")
        assert (await get(echo, "127.0.0.2"))[2] == b"203.0.113.7\n"
        assert (await get(echo, "127.0.0.3", "/anything"))[2] == b"127.0.0.3\n"
        # A mapping changed while the server runs applies to the next request.
        echo.mapping["127.0.0.3"] = "2001:db8::3"
        assert (await get(echo, "127.0.0.3"))[2] == b"2001:db8::3\n"
        assert echo.requests == {"127.0.0.1": 1, "127.0.0.2": 1, "127.0.0.3": 2}


async def test_json_format_answers_an_object_with_the_address() -> None:
    async with echo_server() as echo:
        echo.mapping["127.0.0.2"] = "198.51.100.20"
        status, headers, body = await get(echo, "127.0.0.2", "/ip?x=1&format=json")
        assert (status, headers["content-type"]) == (200, "application/json")
        assert json.loads(body) == {"ip": "198.51.100.20"}
        assert echo.json_url.endswith("/ip?format=json")
        assert json.loads((await get(echo, "127.0.0.5", "/ip?format=json"))[2]) == {
            "ip": "127.0.0.5"
        }


async def test_a_kept_alive_connection_is_counted_per_request() -> None:
    async with echo_server() as echo:
        reader, writer = await connect(echo, "127.0.0.2")
        assert (await fetch(writer, reader))[2] == b"127.0.0.2\n"
        assert (await fetch(writer, reader))[2] == b"127.0.0.2\n"
        writer.close()
        await writer.wait_closed()
        assert echo.requests == {"127.0.0.2": 2}


async def test_html_and_error_go_to_their_source_only() -> None:
    async with echo_server() as echo:
        echo.behaviour["127.0.0.2"] = "html"
        echo.behaviour["127.0.0.3"] = "error"
        status, headers, body = await get(echo, "127.0.0.2")
        assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
        assert body.startswith(b"<!DOCTYPE html>")
        assert (await get(echo, "127.0.0.3"))[0] == 500
        assert (await get(echo, "127.0.0.4"))[2] == b"127.0.0.4\n"
        del echo.behaviour["127.0.0.3"]
        assert (await get(echo, "127.0.0.3"))[2] == b"127.0.0.3\n"
        assert echo.requests == {"127.0.0.2": 1, "127.0.0.3": 2, "127.0.0.4": 1}


async def test_a_hanging_answer_never_comes_and_ends_with_the_server() -> None:
    async with echo_server() as echo:
        echo.behaviour["127.0.0.2"] = "hang"
        reader, writer = await connect(echo, "127.0.0.2")
        writer.write(b"GET /ip HTTP/1.1\r\nHost: echo\r\n\r\n")
        await until(lambda: echo.requests["127.0.0.2"] == 1, WAIT, what="the request counted")
        # Other sources are answered meanwhile.
        assert (await get(echo, "127.0.0.3"))[2] == b"127.0.0.3\n"
    # Leaving the block closed the hanging connection without a byte of answer.
    assert await asyncio.wait_for(reader.read(), WAIT) == b""
    writer.close()


async def test_an_unknown_behaviour_cannot_be_set() -> None:
    async with echo_server() as echo:
        with pytest.raises(ValueError, match="behaviour 'slow': use one of"):
            echo.behaviour["127.0.0.2"] = "slow"
        assert echo.behaviour == {}


async def test_an_oversized_request_head_is_refused() -> None:
    async with echo_server() as echo:
        reader, writer = await connect(echo, "127.0.0.2")
        writer.write(b"GET /ip HTTP/1.1\r\nX-Junk: " + b"j" * (MAX_HEAD + 1) + b"\r\n\r\n")
        status = await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT)
        assert status.startswith(b"HTTP/1.1 431 ")
        writer.close()
        assert echo.requests == {}
        assert (await get(echo, "127.0.0.2"))[2] == b"127.0.0.2\n"
