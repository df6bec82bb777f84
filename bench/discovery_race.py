"""The exclusivity check of the discovery benchmark: two API processes, many clients, one proxy.

Every client asks for the one proxy, over and over, through either API process. Each client
marks the proxy held from its 201 until just before it sends the release, so a 201 while
another client's mark is up is a double lease, counted as the clients saw it. The log is then
folded to count the same from the server's side (overlapping holds, claims the fold had to
refuse), and the replicas' conflict counters show they really raced: a run without conflicts
would prove nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from bench.discovery_worker import HttpConnection, setup
from events import subjects
from events.schemas import LeaseReleased
from projections.lease import LeaseView, apply
from projections.lease_queries import find
from services.runtime.eventlog.jetstream import JetStreamEventStore

RETRY_SECONDS = 0.01
"""A client's pause after a 503: polite, yet 64 of them keep both replicas busy."""


@dataclass
class Race:
    replicas: int
    clients: int
    attempts: int = 0
    grants: int = 0
    busy: int = 0
    doubles: int = 0
    """201s for the proxy while another client held it, as the clients saw it."""
    conflicts: float = 0.0
    """Claims that lost the optimistic-concurrency race, summed over the replicas' metrics."""
    log_granted: int = 0
    log_rejected: int = 0
    log_overlaps: int = 0
    tokens_in_order: bool = False
    """The fencing tokens strictly increase in the order of ``acquiredAt`` (they are the grants'
    stream sequences: not consecutive; docs/decisions/0080-fencing-tokens-are-the-grant-s.md)."""
    seconds: float = 0.0
    grants_by_replica: list[int] = field(default_factory=list)


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def race(
    tmp: Path, *, replicas: int = 2, clients: int = 64, grants: int = 200, seconds: float = 60.0
) -> Race:
    """Until ``grants`` leases were granted in all, or ``seconds`` passed."""
    result = Race(replicas, clients, grants_by_replica=[0] * replicas)
    async with setup(tmp, proxies=1, apis=replicas) as running:
        ports = [api.port for api in running.apis]
        conns = [await HttpConnection.open(ports[i % replicas]) for i in range(clients)]
        held: Counter[str] = Counter()
        tokens: list[tuple[str, int]] = []
        deadline = time.perf_counter() + seconds

        async def client(i: int, http: HttpConnection) -> None:
            while result.grants < grants and time.perf_counter() < deadline:
                result.attempts += 1
                body = {"ttlSeconds": 60, "holder": f"crawler-{i}"}
                status, _, raw = await http.request("POST", "/v1/leases", body)
                if status == 503:
                    result.busy += 1
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                assert status == 201, raw
                lease = json.loads(raw)
                uid = lease["proxy"]["uid"]
                held[uid] += 1
                result.doubles += held[uid] > 1
                result.grants += 1
                result.grants_by_replica[i % replicas] += 1
                tokens.append((lease["acquiredAt"], lease["fencingToken"]))
                await asyncio.sleep(0)  # the crawl: other clients' answers arrive meanwhile
                held[uid] -= 1
                status, _, raw = await http.request("DELETE", f"/v1/leases/{lease['id']}")
                assert status == 204, raw

        started = time.perf_counter()
        await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
        result.seconds = time.perf_counter() - started
        for http in conns[:replicas]:  # client i talks to replica i % replicas
            _, _, text = await http.request("GET", "/metrics")
            result.conflicts += metric(text.decode(), "egress_lease_conflicts_total")
        for http in conns:
            await http.close()
        in_order = [t for _, t in sorted(tokens)]
        result.tokens_in_order = all(a < b for a, b in pairwise(in_order))
        await check_log(running.store, result)
    return result


async def check_log(store: JetStreamEventStore, result: Race) -> None:
    """The server's side: grants the fold made, claims it refused, and overlapping holds."""
    history = await store.read(subjects.lease("bench-0"))
    view: LeaseView | None = None
    spans = []
    for recorded in history.events:
        view = apply(view, recorded)
        if isinstance(recorded.event, LeaseReleased):
            record = find(view, recorded.event.lease_id)
            if record is not None and record.ended_at is not None:
                spans.append((record.acquired_at, record.ended_at))
    spans.sort()
    result.log_overlaps = sum(1 for a, b in pairwise(spans) if b[0] < a[1])
    result.log_granted = view.granted if view else 0
    result.log_rejected = view.rejected if view else 0
