"""Traffic records as the gateway writes them (events/traffic.py), for the tests of what reads
them: the CLI and the console."""

from __future__ import annotations

from datetime import UTC, datetime

from events import subjects
from events.store import NewEvent
from events.traffic import TrafficRecorded, TrafficRow, client_key
from services.runtime.eventlog.jetstream import JetStreamEventStore


def record(client: str, uid: str, lease: str, *rows: TrafficRow) -> TrafficRecorded:
    """One replica's interval for ``client`` through the proxy ``uid`` (``crawl/<uid>``)."""
    return TrafficRecorded(
        client=client,
        replica="gw-1",
        start=datetime.now(UTC),
        interval_seconds=10.0,
        proxy_uid=uid,
        lease_id=lease,
        proxy=f"crawl/{uid}",
        rows=rows,
    )


async def append(store: JetStreamEventStore, event: TrafficRecorded, msg_id: str) -> None:
    await store.append(subjects.traffic(client_key(event.client)), [NewEvent(event, msg_id)])
