"""A consumer replica as its own process, so a test can SIGKILL it mid-batch.

Usage: python -m tests.support.consumer_worker NATS_URL DURABLE HANDLER_DELAY ACK_WAIT
"""

from __future__ import annotations

import asyncio
import sys

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.nats.consumer import ConsumerLoop, Handler
from tests.support.workload import effect_handler, spec


async def main(url: str, durable: str, delay: float, ack_wait: float) -> None:
    conn = await connect(url)
    store = JetStreamEventStore(conn.nc, conn.js)
    handler: Handler = effect_handler(store, delay)  # type: ignore[assignment]
    loop = ConsumerLoop(
        conn, spec(durable, ack_wait=ack_wait, batch=4, concurrency=4), handler, store=store
    )
    print("ready", flush=True)
    await loop.run()


if __name__ == "__main__":
    url, durable, delay, ack_wait = sys.argv[1:5]
    asyncio.run(main(url, durable, float(delay), float(ack_wait)))
