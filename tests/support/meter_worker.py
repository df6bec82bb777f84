"""The executor's meter as its own process, stopped for good right after its first append, so a
test can SIGKILL it between the append and the saved offset
(docs/decisions/0161-metering-upstream-bytes.md).

Usage: python -m tests.support.meter_worker NATS_URL DATA_DIR PROVIDER BUDGET MARKER

Meters the upstream entry ``PROVIDER`` (``maxBytesPerDay`` ``BUDGET``) whose records are in
``DATA_DIR`` once; after the append
returns it writes ``MARKER`` and waits to be killed. Logs go to standard error.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from events.store import AppendResult, NewEvent
from events.subjects import Aggregate
from services.executor.meter import Meter, meter_metrics
from services.providers.upstream.provider import UpstreamProvider
from services.providers.upstream.pure.templates import NAMED
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.observability.logs import configure_logging


class StopAfterAppend:
    def __init__(self, inner: JetStreamEventStore, marker: Path) -> None:
        self.inner = inner
        self.marker = marker

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        result = await self.inner.append(aggregate, events, expected_seq)
        self.marker.write_text("appended\n")
        await asyncio.sleep(3600)
        return result


def entry(data_dir: Path, name: str, budget: int) -> UpstreamProvider:
    """The entry as far as the meter reads it: its records; the login is never used."""
    return UpstreamProvider(
        name,
        data_dir,
        endpoint=("127.0.0.1", 9),
        templates=NAMED["oxylabs"],
        password="unused",
        allowed_countries=("de",),
        max_bytes_per_day=budget,
    )


async def main(url: str, data_dir: Path, name: str, budget: int, marker: Path) -> None:
    configure_logging("info")
    conn = await connect(url)
    store = StopAfterAppend(JetStreamEventStore(conn.nc, conn.js), marker)
    meter = Meter(
        store,  # type: ignore[arg-type]  # the append is all the meter uses
        [entry(data_dir, name, budget)],
        meter_metrics(CollectorRegistry()),
        replica="worker",
    )
    await meter.meter_once()


if __name__ == "__main__":
    url, data_dir, name, budget, marker = sys.argv[1:6]
    asyncio.run(main(url, Path(data_dir), name, int(budget), Path(marker)))
