"""Everything that reaches the gateway's port from outside gets a refusal with the right status,
and nothing behind it sees what it refused (docs/decisions/0156-the-gateway-s-edges.md): the real
gateway, real Squids behind it, a real discovery replica, and raw sockets for what no HTTP client
would send.

Before D156 a head of bare LFs waited out the head timeout and was answered 408; more than 128
header fields were a 400 instead of a 431; ``CONNECT host:99999`` ended the connection with a
traceback; ``127.1`` and ``[::ffff:127.0.0.1]`` reached the gateway's own ports through a Squid;
``Connection: close`` was not honoured; a crawler that stopped reading held its connection (and
the proxy's) for ever, and one that left mid-answer left the proxy's open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.bounds import LINGER, Limits
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.gateway import TOKENS, Fleet, basic, fleet
from tests.support.squid_rules import recording
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

MARGIN = 10.0
"""What a busy machine may add to a bound before the answer or the close is seen."""
A_AUTH = f"Proxy-Authorization: {basic('crawler-a', TOKENS['crawler-a'])}\r\n"


async def _ask(
    port: int, data: bytes, *, local: str = "127.0.0.1", shut: bool = False, wait: float = 30
) -> bytes:
    """Send ``data`` to the gateway from ``local`` and read until it closes (``shut``: end the
    sending side first); what it answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    try:
        writer.write(data)
        await writer.drain()
        if shut:
            writer.write_eof()
        answer = b""
        async with asyncio.timeout(wait):
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    answer += chunk
        return answer
    finally:
        writer.close()


def _status(answer: bytes) -> int:
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert found, answer[:300]
    return int(found[1])


def _header(answer: bytes, name: str) -> str:
    found = re.search(rb"\r\n" + name.encode() + rb": ([^\r]*)\r\n", answer, re.IGNORECASE)
    return found[1].decode() if found else ""


async def _leases(
    f: Fleet, client: str = "crawler-a", holder: str = "gateway/rotating"
) -> list[dict[str, Any]]:
    """The client's active leases of ``holder`` (the gateway's rotating ones by default)."""
    async with f.api_client(client) as api:
        answer = await api.get("/v1/leases", params={"holder": holder})
        items: list[dict[str, Any]] = answer.json()["items"]
        return items


# ---------------------------------------------------------------------------------- logins


async def test_logins_are_refused_and_an_address_that_guesses_is_throttled_not_its_owner(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        get = f"GET {f.page(1)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        bare = await _ask(f.gateway_port, f"{get}\r\n".encode())
        assert _status(bare) == 407
        assert "needs a proxy login" in _header(bare, "X-Egress-Error")
        assert _header(bare, "Proxy-Authenticate") == 'Basic realm="egress-proxies"'

        wrong = f"{get}Proxy-Authorization: {basic('crawler-a', 'x' * 40)}\r\n\r\n".encode()
        for _ in range(5):
            answer = await _ask(f.gateway_port, wrong)
            assert _status(answer) == 407, answer
            assert "not valid" in _header(answer, "X-Egress-Error")
        throttled = await _ask(f.gateway_port, wrong)
        assert _status(throttled) == 429, throttled
        assert 1 <= int(_header(throttled, "Retry-After")) <= 60
        # The guessing address is refused even the right token; its owner elsewhere is not.
        right = f"{get}{A_AUTH}\r\n".encode()
        assert _status(await _ask(f.gateway_port, right)) == 429
        assert not f.site.visits
        assert _status(await _ask(f.gateway_port, right, local="127.0.0.2")) == 200
        assert len(f.site.visits) == 1

        malformed = basic("crawler-a-country", TOKENS["crawler-a"])
        answer = await _ask(
            f.gateway_port,
            f"{get}Proxy-Authorization: {malformed}\r\n\r\n".encode(),
            local="127.0.0.3",
        )
        assert _status(answer) == 407
        assert "'country' has no value" in _header(answer, "X-Egress-Error")
        assert len(f.site.visits) == 1


async def test_another_clients_session_id_is_a_session_of_its_own(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        async with f.client("crawler-a-session-s1") as a:
            first = await a.get(f.page(1))
        # crawler-b names crawler-a's session: it gets a session of its own, never a's lease.
        async with f.client("crawler-b-session-s1", client="crawler-b") as b:
            second = await b.get(f.page(2))
        async with f.client("crawler-a-session-s1", client="crawler-b") as b_as_a:
            third = await b_as_a.get(f.page(3))
        assert first.status_code == second.status_code == 200
        assert first.headers["x-egress-lease"] != second.headers["x-egress-lease"]
        assert third.status_code == 407
        assert "must start with the client's name" in third.headers["x-egress-error"]
        assert [lease["id"] for lease in await _leases(f, "crawler-b", "gateway/session/s1")] == [
            second.headers["x-egress-lease"]
        ]
        assert len(f.site.visits) == 2


# ---------------------------------------------------------------------------------- targets


async def test_origin_form_is_refused_naming_the_fix_and_absolute_form_goes_through(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        for auth in ("", A_AUTH):  # a head that is no proxy request says so before any login
            origin = await _ask(
                f.gateway_port, f"GET /page/1 HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
            )
            assert _status(origin) == 400
            assert "send the absolute URL" in _header(origin, "X-Egress-Error")
        for bad in ("example.com", "example.com:0", "example.com:99999", "[::1"):
            answer = await _ask(
                f.gateway_port, f"CONNECT {bad} HTTP/1.1\r\nHost: x\r\n{A_AUTH}\r\n".encode()
            )
            assert _status(answer) == 400, (bad, answer)
            assert "CONNECT needs host:port" in _header(answer, "X-Egress-Error")
        assert not f.site.visits
        absolute = await _ask(
            f.gateway_port,
            f"GET {f.page(1)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{A_AUTH}\r\n".encode(),
        )
        assert _status(absolute) == 200
        assert b"page 1" in absolute
        assert len(f.site.visits) == 1


async def test_the_gateway_never_goes_to_its_own_ports_however_the_host_is_spelled(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    with recording() as own, recording() as other:
        async with fleet(nats_server, jetstream_store, tmp_path, own_ports=(own.port,)) as f:
            ports = {
                "gateway": f.gateway_port,
                "api": urlsplit(f.api).port,
                "nats": urlsplit(f.nats_url).port,
                "listener": own.port,
            }
            hosts = ["127.0.0.1", "localhost", "[::1]", "127.1", "[::ffff:127.0.0.1]", "0"]
            for name, port in ports.items():
                for host in hosts:
                    for line in (f"CONNECT {host}:{port}", f"GET http://{host}:{port}/"):
                        answer = await _ask(
                            f.gateway_port, f"{line} HTTP/1.1\r\nHost: x\r\n{A_AUTH}\r\n".encode()
                        )
                        assert _status(answer) == 403, (name, line, answer)
                        assert "own ports" in _header(answer, "X-Egress-Error")
            assert own.accepted == 0
            assert await _leases(f) == []  # refused before any proxy was leased
            # The same request to a port of no one's reaches it: the test sees a reach.
            line = f"GET http://127.0.0.1:{other.port}/ HTTP/1.1\r\nConnection: close\r\n"
            answer = await _ask(f.gateway_port, f"{line}{A_AUTH}\r\n".encode())
            assert _status(answer) == 200, answer
            assert other.accepted == 1


# ---------------------------------------------------------------------------------- heads

SMUGGLED = {
    "CL then TE": "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    "TE then CL": "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    "two lengths": "Content-Length: 5\r\nContent-Length: 6\r\n",
    "the same length twice": "Content-Length: 5\r\nContent-Length: 5\r\n",
    "a list of lengths": "Content-Length: 5, 5\r\n",
    "a negative length": "Content-Length: -5\r\n",
    "a length not a number": "Content-Length: five\r\n",
    "an obs-fold": "X-Folded: a\r\n b\r\nContent-Length: 5\r\n",
    "a bare LF in a field": "X-Lf: a\nContent-Length: 5\r\n",
    "a bare CR in a field": "X-Cr: a\rContent-Length: 5\r\n",
    "a space before the colon": "Content-Length : 5\r\n",
    "a transfer coding not chunked": "Transfer-Encoding: gzip\r\n",
}


async def test_smuggling_is_refused_and_the_site_sees_nothing(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    with recording() as site:
        async with fleet(nats_server, jetstream_store, tmp_path) as f:
            url = f"http://127.0.0.1:{site.port}/"
            for name, fields in SMUGGLED.items():
                head = f"POST {url} HTTP/1.1\r\nHost: x\r\n{A_AUTH}{fields}\r\n"
                answer = await _ask(
                    f.gateway_port, (head + "hello" + "GET / HTTP/1.1\r\n\r\n").encode()
                )
                assert _status(answer) == 400, (name, answer)
                assert _header(answer, "X-Egress-Error"), name
            started = time.monotonic()
            bare = f"GET {url} HTTP/1.1\nHost: x\n{A_AUTH.strip()}\n\n"
            answer = await _ask(f.gateway_port, bare.encode())
            assert _status(answer) == 400
            assert "bare LF" in _header(answer, "X-Egress-Error")
            assert time.monotonic() - started < LINGER + MARGIN  # not the head timeout
            for version in ("HTTP/2.0", "HTTP/0.9"):
                answer = await _ask(
                    f.gateway_port, f"GET {url} {version}\r\nHost: x\r\n{A_AUTH}\r\n".encode()
                )
                assert _status(answer) in {400, 505}, (version, answer)
            assert site.accepted == 0
            assert await _leases(f) == []
            good = f"POST {url} HTTP/1.1\r\n{A_AUTH}Content-Length: 2\r\nConnection: close\r\n"
            good += "\r\nhi"
            assert _status(await _ask(f.gateway_port, good.encode())) == 200
            assert site.accepted == 1


async def test_header_floods_are_answered_431(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        get = f"GET {f.page(1)} HTTP/1.1\r\nHost: x\r\n{A_AUTH}"
        many = "".join(f"X-Field-{i}: {i}\r\n" for i in range(129))
        long = "X-Long: " + "a" * 64 * 1024 + "\r\n"
        longer = "".join(f"X-Part-{i}: {'b' * 1000}\r\n" for i in range(40))
        for name, fields in {"129 fields": many, "a 64 KiB field": long, "40 KB": longer}.items():
            answer = await _ask(f.gateway_port, f"{get}{fields}\r\n".encode())
            assert _status(answer) == 431, (name, answer[:300])
        assert not f.site.visits
        ok = "".join(f"X-Field-{i}: {i}\r\n" for i in range(90))  # the site takes 100
        assert (
            _status(await _ask(f.gateway_port, f"{get}{ok}Connection: close\r\n\r\n".encode()))
            == 200
        )


# ---------------------------------------------------------------------------------- slow ones


async def _trickle(port: int, data: bytes, pace: float, sent: list[int]) -> tuple[float, bytes]:
    """Send ``data`` a byte per ``pace`` seconds (``sent`` counts the bytes) until the gateway
    answers and closes; the seconds it took and the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = time.monotonic()

    async def send() -> None:
        with contextlib.suppress(OSError):
            for byte in data:
                writer.write(bytes([byte]))
                await writer.drain()
                sent.append(byte)
                await asyncio.sleep(pace)  # the slowloris's pace: what the gateway bounds

    sender = asyncio.create_task(send())
    try:
        answer = b""
        async with asyncio.timeout(60):
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    answer += chunk
        return time.monotonic() - opened, answer
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()


async def test_a_head_that_never_ends_is_answered_408_and_closed_while_others_are_served(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    bound = 2.0
    async with fleet(
        nats_server, jetstream_store, tmp_path, limits=Limits(head_timeout=bound)
    ) as f:
        head = f"GET {f.page(1)} HTTP/1.1\r\nHost: x\r\n{A_AUTH}X-Slow: {'z' * 200}\r\n\r\n"
        sent: list[int] = []
        slow = [
            asyncio.create_task(_trickle(f.gateway_port, head.encode(), 0.1, sent))
            for _ in range(20)
        ]
        await until(lambda: len(sent) >= 20 * 3, 10, what="every slow client sending")
        async with f.client() as http:
            assert (await http.get(f.page(2))).status_code == 200
        for took, answer in await asyncio.gather(*slow):
            assert _status(answer) == 408
            assert "no whole request head within 2 s" in _header(answer, "X-Egress-Error")
            assert bound <= took < bound + LINGER + MARGIN
        assert [v.path for v in f.site.visits] == ["/page/2"]


async def test_a_crawler_that_stops_reading_is_let_go_after_the_idle_timeout(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """A site that sends without end to a crawler that never reads: the gateway's buffers fill,
    and its end of the connection is closed ``idle_timeout`` (and as long again for what it
    still had to send) later, not never."""
    idle = 2.0
    server = await asyncio.start_server(_flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with (
        server,
        fleet(nats_server, jetstream_store, tmp_path, limits=Limits(idle_timeout=idle)) as f,
    ):
        sock = socket.create_connection(("127.0.0.1", f.gateway_port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n{A_AUTH}\r\n".encode())
        sock.settimeout(10)
        assert (await asyncio.to_thread(sock.recv, 64)).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        inode = _inode(f.gateway_port, sock.getsockname()[1])
        assert inode
        assert _held(inode)
        try:
            # Not reading: the gateway's writes to us stall, and it must let go.
            await until(lambda: not _held(inode), 2 * idle + MARGIN, 0.2, what="the let-go")
            assert time.monotonic() - started >= idle
        finally:
            sock.close()


async def test_connections_to_proxies_are_bounded_and_their_slots_come_back(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """With room for one connection to a proxy, a second request while the first streams is
    answered 503 by the gateway (no proxy blamed, no site reached); once the first ends, the
    slot is free again."""
    server = await asyncio.start_server(_flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = Limits(upstreams=1, idle_timeout=2.0)
    async with server, fleet(nats_server, jetstream_store, tmp_path, limits=limits) as f:
        endless = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n{A_AUTH}\r\n".encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", f.gateway_port)
        writer.write(endless)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        page = f"GET {f.page(1)} HTTP/1.1\r\nConnection: close\r\n{A_AUTH}\r\n".encode()
        busy = await _ask(f.gateway_port, page)
        assert _status(busy) == 503
        assert _header(busy, "Retry-After") == "1"
        assert "connections to proxies" in _header(busy, "X-Egress-Error")
        assert not f.site.visits
        writer.close()  # the endless answer ends with its crawler

        async def served() -> bool:
            return _status(await _ask(f.gateway_port, page)) == 200

        await until(served, MARGIN + 10, 0.5, what="the proxy's slot back")
        assert len(f.site.visits) == 1


async def _flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A site whose answer never ends."""
    with contextlib.suppress(OSError):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n")
        while True:
            writer.write(b"x" * 65536)
            await writer.drain()
    writer.close()


def _inode(local_port: int, remote_port: int) -> str:
    """The inode of the TCP socket from ``local_port`` to ``remote_port`` on loopback."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{local_port:04X}") and fields[2].endswith(f":{remote_port:04X}"):
            return fields[9]
    return ""


def _held(inode: str) -> bool:
    """Whether this process still has the socket open."""
    target = f"socket:[{inode}]"
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return True
    return False


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------------------------- floods

IDLE = 10_000
BATCH = 64
"""Connections opened at once: more overflow the listen queue, and a dropped handshake is
retried seconds later (what a flood costs the flooder, not what the gateway does)."""


async def test_ten_thousand_idle_connections_cost_one_address_its_bound_and_no_more(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """The per-address bound (1024 by default) holds; the rest are answered 429 and closed at
    once; another address is served meanwhile; the gateway's descriptors stay within the bound
    (the process's limit, ``ulimit -n``, is far above: the gateway fits its total under it)."""
    per_address = 1024
    limits = Limits(per_address=per_address, head_timeout=600)  # idle for the whole test
    async with fleet(nats_server, jetstream_store, tmp_path, limits=limits) as f:
        async with f.client() as http:  # the lease, the API connection: before the count
            assert (await http.get(f.page(1))).status_code == 200
        before = _fds()
        opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for start in range(0, IDLE, BATCH):
            batch = [
                asyncio.open_connection("127.0.0.1", f.gateway_port)
                for _ in range(start, min(start + BATCH, IDLE))
            ]
            opened += await asyncio.gather(*batch)

        # The excess is answered as the gateway accepts it; the held ones are never answered.
        reads = [asyncio.create_task(reader.read()) for reader, _ in opened]
        refusals = IDLE - per_address
        await until(lambda: sum(r.done() for r in reads) >= refusals, 120, 0.2, what="429s")
        await asyncio.sleep(1)
        answered = [r for r in reads if r.done()]
        assert len(answered) == refusals
        assert all(_status(r.result()) == 429 for r in answered)
        first = answered[0].result()
        assert "too many connections from this address" in _header(first, "X-Egress-Error")
        held = [w for (_, w), r in zip(opened, reads, strict=True) if not r.done()]
        for (_, writer), r in zip(opened, reads, strict=True):
            if r.done():
                writer.close()
        await asyncio.sleep(0.5)
        gateway_side = _fds() - before - len(held)
        assert gateway_side <= per_address + 64, (gateway_side, _fds(), before)

        request = f"GET {f.page(2)} HTTP/1.1\r\nConnection: close\r\n{A_AUTH}\r\n".encode()
        assert _status(await _ask(f.gateway_port, request, local="127.0.0.2")) == 200
        assert (
            _status(
                await _ask(f.gateway_port, f"GET {f.page(3)} HTTP/1.1\r\n{A_AUTH}\r\n".encode())
            )
            == 429
        )
        for read in reads:
            read.cancel()
        for writer in held:
            writer.close()


async def test_a_client_over_its_max_leases_rotates_within_one_and_a_second_session_waits(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(
        nats_server, jetstream_store, tmp_path, max_leases=1, rotating_leases=4, rotating_idle=1.0
    ) as f:
        async with f.client() as http:
            answers = [await http.get(f.page(n)) for n in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        assert len({a.headers["x-egress-lease"] for a in answers}) == 1

        async def released() -> bool:  # the rotating lease, idle, is let go
            return not await _leases(f)

        await until(released, MARGIN + 10, 0.2, what="the idle rotating lease released")
        async with (
            f.client("crawler-a-session-one") as one,
            f.client("crawler-a-session-two") as two,
        ):
            assert (await one.get(f.page(1))).status_code == 200
            second = await two.get(f.page(2))
            assert second.status_code == 429, second.text
            assert int(second.headers["retry-after"]) >= 1
            assert "maxLeases" in second.headers["x-egress-error"]
            assert (await one.get(f.page(3))).status_code == 200
        assert [v.path for v in f.site.visits][-2:] == ["/page/1", "/page/3"]


# ---------------------------------------------------------------------------------- anything

EXAMPLES = 300


async def test_any_bytes_are_answered_or_closed_and_the_gateway_serves_on(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """Bytes of every kind, some shaped like a request with a good login (so that they reach
    the lease and the relay): each connection gets an HTTP answer or a close within a bound,
    the event loop sees no unhandled exception, and a good request goes through after."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        async with fleet(nats_server, jetstream_store, tmp_path) as f:
            port, page = f.gateway_port, f.page(1)
            await asyncio.to_thread(_fuzz, port, page)
            assert not unhandled, unhandled[:3]
            async with f.client() as http:
                assert (await http.get(f.page(2))).status_code == 200
    finally:
        loop.set_exception_handler(None)


_LINES = st.sampled_from(
    [
        b"GET ",
        b"CONNECT ",
        b"POST ",
        b"http://",
        b"127.0.0.1:",
        b" HTTP/1.1\r\n",
        b"\r\n",
        b"\n",
        b"\r",
        b":",
        b"Host: x\r\n",
        b"Content-Length: ",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: close\r\n",
        b"Proxy-Authorization: Basic ",
        b"X-Egress-Params: ",
        b"-",
        b"0",
        b"99999999999999999999",
        b"\x00",
        b"\xff",
        b"[::1]",
        b"%",
        b" ",
    ]
)


def _fuzz(port: int, page: str) -> None:
    auth = A_AUTH.encode()
    shaped = st.builds(
        lambda pieces, tail: f"GET {page} HTTP/1.1\r\n".encode() + auth + b"".join(pieces) + tail,
        st.lists(_LINES, max_size=20),
        st.binary(max_size=64),
    )
    strategy = st.one_of(
        st.binary(max_size=4096), st.lists(_LINES, max_size=30).map(b"".join), shaped
    )

    @settings(
        max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(strategy)
    def one(data: bytes) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            with contextlib.suppress(ConnectionError):
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            answer = b""
            with contextlib.suppress(ConnectionError):
                while chunk := sock.recv(65536):
                    answer += chunk
        assert not answer or re.match(rb"HTTP/1\.[01] \d{3} ", answer), answer[:200]

    one()
