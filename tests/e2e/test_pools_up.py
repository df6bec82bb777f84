"""Pools through `up` with real Squids: a pool applied with the CLI gets its members, and
``maxAge`` recycles every member while a crawler with the client library fetches through a leased
one, without one failed request (the lease switches to each fresh instance make-before-break)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client.aio import AsyncClient
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

POOL = """\
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: fresh, namespace: crawl}
spec:
  replicas: 2
  maxAge: 10s
  maxSurge: 1
  template:
    provider: local
    attributes: {country: de}
    healthCheck: {intervalSeconds: 1}
"""


async def members(up: Up) -> list[dict[str, Any]]:
    got = await up.cli("get", "-l", "pool=fresh", "-n", "crawl", "-o", "json")
    assert got.returncode == 0, got.stdout + got.stderr
    items: list[dict[str, Any]] = json.loads(got.stdout)["items"]
    return items


async def test_max_age_recycles_members_under_a_crawl_without_a_failed_request(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(POOL)
    with hello_target() as target:
        async with running_up(tmp_path, "--observe-interval", "1", health_check_url=target) as up:
            applied = await up.cli("apply", "-f", str(manifest))
            assert applied.returncode == 0, applied.stdout + applied.stderr

            async def two_ready() -> bool:
                found = await members(up)
                ready = [m for m in found if m["phase"] == "Ready"]
                return len(found) == 2 and len(ready) == 2

            await until(two_ready, timeout=90.0, what="two Ready members")
            before = {m["name"] for m in await members(up)}

            ok = failed = 0
            # A local instance is a port (the URL's credentials change on every renewal).
            ports: set[int | None] = set()
            tokens: list[int] = []
            async with (
                AsyncClient(up.api, holder="pool-crawler") as client,
                client.lease({"pool": "fresh"}, ttl=6, wait=30) as lease,
            ):
                # The crawl lasts until the leased member was recycled twice (three instances
                # served it, the last one fetched through) and 100 requests went out; a member
                # lives maxAge (10 s, the least allowed) and a recycling takes a few more.
                loop = asyncio.get_running_loop()
                end = loop.time() + 120.0
                while len(ports) < 3 or ok + failed <= 100:
                    assert loop.time() < end, f"ports {ports}, tokens {tokens}, ok {ok}"
                    url = lease.url
                    ports.add(httpx.URL(url).port)
                    if not tokens or tokens[-1] != lease.lease.fencing_token:
                        tokens.append(lease.lease.fencing_token)
                    try:
                        async with httpx.AsyncClient(proxy=url, timeout=10) as http:
                            answer = await http.get(target)
                        if answer.status_code == 200:
                            ok += 1
                        else:
                            failed += 1
                    except httpx.HTTPError:
                        failed += 1
                    await asyncio.sleep(0.1)
            after = {m["name"] for m in await members(up)}

    print(f"requests ok {ok}, failed {failed}, instances {len(ports)}, tokens {tokens}")
    assert failed == 0, f"{failed} of {ok + failed} requests failed"
    assert ok > 100
    assert len(ports) >= 3, "the leased member was not recycled twice"
    assert tokens == sorted(tokens)
    assert len(tokens) >= 3  # each switch raised the fencing token
    assert after == before  # recycling renews instances; the members stay
