"""Helper processes of ``bench.scale``; each prints ``ready`` and runs until SIGTERM.

- ``writer NATS_URL --snapshot-interval S``: a discovery replica (the product's
  ``DiscoveryService``, on a free port) that writes its snapshot passes every ``S`` seconds
  instead of every 30, so the benchmark need not wait half a minute for the pass that the
  "after" start-ups restore from. What it writes is what any replica writes.
- ``origin PORT``: what the health prober probes through. Every proxy's URL points here, and
  every request on every connection is answered ``204``, as a healthy forward proxy relays the
  check URL's answer: on a connection kept open, unless the request asked to close it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from services.discovery.service import DiscoveryService
from services.runtime.observability.logs import configure_logging
from services.runtime.service import Started, run_services
from services.runtime.settings.shared import Settings

ANSWER = b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n"
LAST_ANSWER = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


def stop_on_signals() -> None:
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)


async def writer(url: str, interval: float) -> None:
    service = DiscoveryService(host="127.0.0.1", port=0, snapshot_interval=interval)
    stop_on_signals()

    def started(_: Started) -> None:
        print("ready", flush=True)

    settings = Settings(nats_url=url, service_name="bench-scale-writer")
    with contextlib.suppress(asyncio.CancelledError):
        await run_services([service], settings, on_started=started)


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head:
                return
            last = b"connection: close" in head.lower()
            writer.write(LAST_ANSWER if last else ANSWER)
            await writer.drain()
            if last:
                return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass
    finally:
        writer.close()


async def origin(port: int) -> None:
    stop_on_signals()
    server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        async with server:
            await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_worker")
    roles = parser.add_subparsers(dest="role", required=True)
    w = roles.add_parser("writer")
    w.add_argument("nats_url")
    w.add_argument("--snapshot-interval", type=float, default=30.0)
    o = roles.add_parser("origin")
    o.add_argument("port", type=int)
    args = parser.parse_args()
    configure_logging("warning", stream=sys.stderr)
    if args.role == "writer":
        asyncio.run(writer(args.nats_url, args.snapshot_interval))
    else:
        asyncio.run(origin(args.port))


if __name__ == "__main__":
    main()
