"""Two discovery replicas in separate processes, many clients over real HTTP, one proxy:
never two leases on it at once."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from events import subjects
from events.schemas import LeaseReleased
from projections.lease import LeaseView, apply
from projections.lease_queries import find
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ATTEMPTS = 1200
CLIENTS = 40


@asynccontextmanager
async def replicas(url: str, n: int, log_dir: Path) -> AsyncIterator[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[asyncio.subprocess.Process] = []
    try:
        bases: list[str] = []
        for i in range(n):
            with (log_dir / f"replica-{i}.log").open("wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "tests.support.discovery_worker",
                    url,
                    "0",
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    env=env,
                    cwd=ROOT,
                )
            procs.append(proc)
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            word, _, port = line.decode().partition(" ")
            assert word == "ready", (log_dir / f"replica-{i}.log").read_text()
            bases.append(f"http://127.0.0.1:{int(port)}")
        yield bases
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await proc.wait()


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def test_two_replicas_never_hand_out_one_proxy_twice(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    await ready_proxy(jetstream_store, "solo")
    async with replicas(nats_server.url, 2, tmp_path) as bases:
        clients = [httpx.AsyncClient(base_url=b, timeout=20) for b in bases]
        try:
            for client in clients:

                async def sees_it(c: httpx.AsyncClient = client) -> bool:
                    items = (await c.get("/v1/proxies", params={"phase": "Ready"})).json()
                    return len(items["items"]) == 1

                await until(sees_it)

            attempts = 0
            doubles = 0
            held: Counter[str] = Counter()
            """proxy uid -> crawlers holding a lease on it, as the crawlers were told."""
            grants: list[tuple[int, dict[str, Any]]] = []
            started = asyncio.get_running_loop().time()

            async def crawler(i: int) -> None:
                nonlocal attempts
                replica = i % len(bases)
                # One client (one connection) per crawler, as separate crawlers would have;
                # a shared pool's bookkeeping would make the test process the bottleneck.
                async with httpx.AsyncClient(base_url=bases[replica], timeout=20) as client:
                    await crawl(i, replica, client)

            async def crawl(i: int, replica: int, client: httpx.AsyncClient) -> None:
                nonlocal attempts, doubles
                while attempts < ATTEMPTS:
                    attempts += 1
                    got = await client.post(
                        "/v1/leases", json={"ttlSeconds": 30, "holder": f"crawler-{i}"}
                    )
                    if got.status_code == 503:
                        assert got.json()["error"] == "no_proxy_available"
                        await asyncio.sleep(0.01)  # a polite client; still many racing
                        continue
                    assert got.status_code == 201, got.text
                    lease = got.json()
                    uid = lease["proxy"]["uid"]
                    # Marked from the 201 until just before the release is sent, so a second
                    # 201 for the proxy inside that window can only be a second holder.
                    held[uid] += 1
                    doubles += held[uid] > 1
                    await asyncio.sleep(0)  # the crawl: other crawlers' answers arrive meanwhile
                    held[uid] -= 1
                    released = await client.delete(f"/v1/leases/{lease['id']}")
                    assert released.status_code == 204, released.text
                    grants.append((replica, lease))

            await asyncio.gather(*(crawler(i) for i in range(CLIENTS)))
            elapsed = asyncio.get_running_loop().time() - started
            scraped = [(await c.get("/metrics")).text for c in clients]
        finally:
            for client in clients:
                await client.aclose()

    assert attempts >= ATTEMPTS
    assert len(grants) >= 20, f"only {len(grants)} leases granted in {elapsed:.1f}s"
    assert {replica for replica, _ in grants} == {0, 1}, "both replicas must have won some"
    conflicts = sum(metric(t, "egress_lease_conflicts_total") for t in scraped)
    assert conflicts > 0, "the replicas never raced; the test proves nothing"

    assert doubles == 0, "two crawlers held the one proxy at once"
    tokens = [
        lease["fencingToken"] for _, lease in sorted(grants, key=lambda g: g[1]["acquiredAt"])
    ]
    assert all(a < b for a, b in pairwise(tokens)), tokens  # across both replicas

    # What the log says: every grant, and only those, is a lease the fold granted; none refused,
    # so optimistic concurrency alone kept the second claimant out.
    history = await jetstream_store.read(subjects.lease("solo"))
    view: LeaseView | None = None
    granted_seqs: dict[str, int] = {}
    spans: list[tuple[datetime, datetime]] = []
    for recorded in history.events:
        before = view.granted if view else 0
        view = apply(view, recorded)
        if view.granted > before:
            granted_seqs[view.lease_id] = recorded.seq
        if isinstance(recorded.event, LeaseReleased):
            record = find(view, recorded.event.lease_id)
            assert record is not None
            assert record.ended_at is not None
            spans.append((record.acquired_at, record.ended_at))
    assert view is not None
    assert view.rejected == 0
    # Each lease the clients got is a grant of the fold, and its token is that grant's sequence.
    assert granted_seqs == {lease["id"]: lease["fencingToken"] for _, lease in grants}
    assert len(spans) == len(grants)  # every grant released, inside its TTL
    assert all(end <= start for (_, end), (start, _) in pairwise(sorted(spans)))
