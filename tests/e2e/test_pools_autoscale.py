"""An autoscaled pool through `up` with real Squids: crawlers that wait for a member make the
pool grow to serve them all, and once they are gone it shrinks back after ``scaleDownAfter``
without taking a member a crawler still holds; every step is in the log with its figures."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client.aio import AsyncClient
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POOL = """\
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: auto, namespace: crawl}
spec:
  template:
    provider: local
    attributes: {country: de}
    healthCheck: {intervalSeconds: 1}
  autoscale:
    min: 2
    max: 6
    targetLeased: 1.0
    scaleUpAfter: 2s
    scaleDownAfter: 8s
"""
CRAWLERS = 5


async def members(up: Up) -> list[dict[str, Any]]:
    got = await up.cli("get", "-l", "pool=auto", "-n", "crawl", "-o", "json")
    assert got.returncode == 0, got.stdout + got.stderr
    items: list[dict[str, Any]] = json.loads(got.stdout)["items"]
    return items


async def pool_events(up: Up) -> list[dict[str, Any]]:
    got = await up.cli("events", "--stream", "POOL", "-o", "json")
    assert got.returncode == 0, got.stdout + got.stderr
    return [json.loads(line) for line in got.stdout.splitlines() if line.strip()]


async def test_waiting_crawlers_grow_the_pool_and_it_shrinks_without_taking_a_held_member(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(POOL)
    with hello_target() as target:
        async with running_up(tmp_path, "--observe-interval", "1", health_check_url=target) as up:
            applied = await up.cli("apply", "-f", str(manifest))
            assert applied.returncode == 0, applied.stdout + applied.stderr

            async def ready(count: int) -> bool:
                found = await members(up)
                return len(found) == count and all(m["phase"] == "Ready" for m in found)

            await until(lambda: ready(2), timeout=90.0, what="the minimum of two Ready members")

            held: dict[int, str] = {}
            leave = [asyncio.Event() for _ in range(CRAWLERS)]
            failed: list[str] = []

            async def crawler(i: int) -> None:
                async with (
                    AsyncClient(up.api, holder=f"crawler-{i}") as client,
                    client.lease(pool="crawl/auto", ttl=10, wait=60) as lease,
                ):
                    held[i] = lease.lease.proxy.uid
                    while not leave[i].is_set():
                        try:
                            async with httpx.AsyncClient(proxy=lease.url, timeout=10) as http:
                                answer = await http.get(target)
                            if answer.status_code != 200:
                                failed.append(f"crawler-{i}: {answer.status_code}")
                        except httpx.HTTPError as exc:
                            failed.append(f"crawler-{i}: {exc!r}")
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(leave[i].wait(), 0.5)

            tasks = [asyncio.create_task(crawler(i)) for i in range(CRAWLERS)]
            try:
                # Two are served at once; the three that wait make the pool grow to five.
                def served() -> bool:
                    for task in tasks:  # a crawler that gave up says why, at once
                        if task.done() and task.exception() is not None:
                            raise AssertionError(f"a crawler failed: {task.exception()!r}")
                    return len(held) == CRAWLERS

                await until(served, timeout=90.0, what="every crawler served")
                assert len(set(held.values())) == CRAWLERS  # a member each
                assert len(await members(up)) == CRAWLERS
                # Three leave; the two that stay keep their members through the scale-down.
                for i in range(2, CRAWLERS):
                    leave[i].set()
                await asyncio.gather(*tasks[2:])
                kept = {held[0], held[1]}
                await until(lambda: ready(2), timeout=90.0, what="back to two members")
                assert {m["uid"] for m in await members(up)} == kept
                leave[0].set()
                leave[1].set()
                await asyncio.gather(*tasks[:2])
            finally:
                for event in leave:
                    event.set()
                await asyncio.gather(*tasks, return_exceptions=True)

            assert failed == []
            decided = [
                e for e in await pool_events(up) if e["type"] in ("PoolDecided", "PoolPressure")
            ]

    scaled = [e["event"] for e in decided if e["event"].get("reason") == "Autoscale"]
    pressures = [e["event"]["pressure"] for e in decided if e["type"] == "PoolPressure"]
    sizes = [s["scaled_to"] for s in scaled]
    assert sizes[0] == 2, scaled  # held at the minimum
    # Grown to serve every crawler, and no further: a crawler once served stayed counted as
    # unserved until discovery's next report, and grew the pool to 6 (now reported at once).
    assert max(sizes) == CRAWLERS, scaled
    assert sizes[-1] == 2, scaled
    for step in scaled[1:]:
        figures = step["figures"]
        if step["scaled_to"] > 2:  # grown for the crawlers the figures counted: target 1.0
            load = figures.get("leased", 0) + figures.get("unserved", 0)
            assert step["scaled_to"] == min(load, 6), step
            assert figures.get("waiting", 0) > 0, step
    assert "up" in pressures
    assert "down" in pressures
