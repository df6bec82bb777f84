"""The API's protocol stack (corked, JSON 400s, head deadline) on the loop production runs:
uvloop, whose transports are not ``asyncio.Transport`` subclasses. Each answer arrives whole, in
order, also pipelined, and a refused head still gets its JSON 400 before the close."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest
import uvicorn
import uvloop

from services.discovery.http.badrequest import json_bad_request
from services.discovery.http.cork import corked
from services.discovery.http.limits import IdleConnections, head_deadline

pytestmark = pytest.mark.integration


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = json.dumps({"path": scope["path"]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _exchange(port: int, data: bytes, answers: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    while got.count(b"HTTP/1.1 ") < answers or not got.endswith((b"}", b"\n")):
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        if not chunk:
            break
        got += chunk
    writer.close()
    return got


async def _run() -> tuple[bytes, bytes, bytes]:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    protocol = corked(json_bad_request(head_deadline(5.0, IdleConnections())))
    config = uvicorn.Config(app, http=protocol, log_config=None, lifespan="off", loop="none")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 # uvicorn's flag; it offers no event
        await asyncio.sleep(0.01)
    try:
        one = await _exchange(port, b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n", 1)
        pipelined = await _exchange(
            port, b"GET /b HTTP/1.1\r\nHost: t\r\n\r\nGET /c HTTP/1.1\r\nHost: t\r\n\r\n", 2
        )
        refused = await _exchange(port, b"GET /d HTTP/1.1\r\nHost: t\r\nX-Bad: a\x01b\r\n\r\n", 1)
    finally:
        server.should_exit = True
        server.force_exit = True
        await serving
    return one, pipelined, refused


def test_answers_arrive_whole_and_in_order_on_uvloop() -> None:
    got: list[tuple[bytes, bytes, bytes]] = []
    # A thread of its own: a protocol that fails in ``connection_made`` leaves uvloop's loop
    # unable to close, and the test must fail, not hang.
    runner = threading.Thread(
        target=lambda: got.append(uvloop.run(asyncio.wait_for(_run(), 30))), daemon=True
    )
    runner.start()
    runner.join(40)
    assert got, "the exchange did not finish on uvloop"
    one, pipelined, refused = got[0]
    assert one.startswith(b"HTTP/1.1 200 ")
    assert one.endswith(b'{"path": "/a"}')
    first, second = pipelined.split(b"HTTP/1.1 200 ")[1:]
    assert first.endswith(b'{"path": "/b"}')
    assert second.endswith(b'{"path": "/c"}')
    assert refused.startswith(b"HTTP/1.1 400 ")
    assert b'"error":"invalid_request"' in refused
    assert b"X-Bad" in refused
