"""A proxy service as a provider through `up` (docs/providers.md, "upstream"; D160): the fake
service (services/testing/upstream.py) speaks Oxylabs' login grammar and leaves each session
from its own loopback address of its country; an echo server answers each of those as a public
test address the MaxMind file of the test places in Germany or France.

Two pools of two sticky sessions each, one German and one French, go Ready with their egress
verified; a crawler leases a German one and the site sees the session's exit; a rotation gives
the lease a new session, a new exit, and no failed request; a session the service drops under
the lease leaves from a new exit of its country, which is recorded as an egress change while the
holder goes on through it; one that fails every request makes its proxy unhealthy, and it is
replaced by a new session under the lease. The lease's bytes are metered to it on the METER
stream (D161), and an upload past the entry's daily budget stops the leasing of its proxies
(D162). The account's password is in no stream, no log line of `up`, and no command line.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.testing.upstream import UpstreamService
from tests.support.echo import echo_server
from tests.support.egress_site import EgressSite
from tests.support.mmdb import write_country_db
from tests.support.system import Up, fetch_via, hello_target, running_up
from tests.support.upstream_support import (
    COUNTRIES,
    DE,
    FR,
    PASSWORD,
    exit_of,
    site,
    start_service,
)
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
__all__ = ["site", "start_service"]  # fixtures

PUBLIC = {**{a: f"203.0.113.{i + 1}" for i, a in enumerate(DE)}}
PUBLIC |= {a: f"198.51.100.{i + 1}" for i, a in enumerate(FR)}
"""The fake's exits as the echo answers them: German and French test addresses."""

PROVIDERS = """\
providers:
  - name: resi
    type: upstream
    upstream:
      endpoint: "{endpoint}"
      template: oxylabs
      account: acme
      passwordEnv: RESI_PASSWORD
      sessionSeconds: 600
      allowedCountries: [de, fr]
      maxBytesPerDay: {budget}
      dataDir: "{data}"
"""
BUDGET = 2_000_000
"""Bytes a day: far above what the probes and the first requests move, below one upload."""


def pool(country: str) -> str:
    return f"""\
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {{name: resi-{country}, namespace: crawl}}
spec:
  replicas: 2
  template:
    provider: resi
    attributes: {{country: {country}}}
    healthCheck: {{intervalSeconds: 1, timeoutSeconds: 2}}
    egress: {{expect: {{country: {country}}}}}
---
"""


async def views(up: Up) -> list[dict[str, Any]]:
    status, body = await up.api_call("GET", "/v1/proxies")
    assert status == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


class Holder:
    """A crawler that reads its lease before each request, as the client library does; the
    exits the site saw, and the requests that failed."""

    def __init__(self, up: Up, lease_id: str, target: str) -> None:
        self.up, self.lease_id, self.target = up, lease_id, target
        self.ok: list[str] = []
        self.failed: list[str] = []
        self.stopped = False

    async def through(self, url: str) -> None:
        try:
            body = await asyncio.to_thread(fetch_via, url, self.target)
        except (OSError, urllib.error.URLError) as exc:
            self.failed.append(f"{url}: {exc}")
        else:
            self.ok.append(exit_of(body))

    async def run(self) -> None:
        while not self.stopped:
            status, lease = await self.up.api_call("GET", f"/v1/leases/{self.lease_id}")
            assert status == 200, lease
            await self.through(lease["proxy"]["url"])
            await asyncio.sleep(0.1)


async def test_sessions_of_a_proxy_service_are_leased_rotated_and_replaced(
    tmp_path: Path, start_service: Any, site: EgressSite
) -> None:
    service: UpstreamService = start_service("oxylabs", countries=COUNTRIES)
    providers = tmp_path / "providers.yaml"
    data = tmp_path / "resi"
    providers.write_text(PROVIDERS.format(endpoint=service.endpoint, data=data, budget=BUDGET))
    manifest = tmp_path / "pools.yaml"
    manifest.write_text(pool("de") + pool("fr"))
    country = write_country_db(
        tmp_path / "country.mmdb", {"203.0.113.0/24": "DE", "198.51.100.0/24": "FR"}
    )
    async with echo_server() as echo:
        echo.mapping.update(PUBLIC)
        flags = [
            "--providers-config", str(providers),
            "--observe-interval", "1",
            "--egress-echo-url", echo.url,
            "--egress-interval", "2",
            "--geoip-db", str(country),
            "--meter-interval", "1",
            "--replace-unhealthy-after", "3",
        ]  # fmt: skip
        with hello_target() as target:
            async with running_up(
                tmp_path,
                *flags,
                health_check_url=target,
                up_env={"RESI_PASSWORD": PASSWORD},
                local_dirs=[data],
            ) as up:
                applied = await up.cli("apply", "-f", str(manifest))
                assert applied.returncode == 0, applied.stdout + applied.stderr
                await _ready_with_verified_egress(up)
                lease = await _leased_and_seen(up, service, site)
                lease = await _rotated_without_a_failed_request(up, lease, site)
                await _dropped_session_recorded(up, service, lease, site)
                await _failing_session_replaced(up, service, lease)
                await _bytes_metered_to_the_lease(up, lease)
                await _a_spent_budget_stops_leasing(up, lease, site)
                await _password_nowhere(up, tmp_path)


async def _ready_with_verified_egress(up: Up) -> None:
    async def ready() -> bool:
        found = await views(up)
        return len(found) == 4 and all(
            p["phase"] == "Ready" and (p.get("egress") or {}).get("country") for p in found
        )

    await until(ready, timeout=150.0, what="four sessions Ready, their egress checked")
    by_country: dict[str, set[str]] = {}
    for proxy in await views(up):
        egress = proxy["egress"]
        assert egress["notLeasableBecause"] == "", proxy
        expected = "DE" if proxy["attributes"]["country"] == "de" else "FR"
        assert egress["country"] == expected, proxy
        by_country.setdefault(expected, set()).add(egress["ip"])
    assert {k: len(v) for k, v in by_country.items()} == {"DE": 2, "FR": 2}  # a session each


async def _leased_and_seen(up: Up, service: UpstreamService, site: EgressSite) -> dict[str, Any]:
    """The site sees the exit the service keeps for the leased proxy's session."""
    status, lease = await up.api_call(
        "POST", "/v1/leases", {"pool": "crawl/resi-de", "ttlSeconds": 300, "holder": "c1"}
    )
    assert status == 201, lease
    holder = Holder(up, lease["id"], site.url("/first"))
    await holder.through(lease["proxy"]["url"])
    assert holder.failed == [], holder.failed
    [seen] = holder.ok
    assert PUBLIC[seen] == lease["proxy"]["egress"]["ip"]
    sessions = {r["exit"]: r for r in service.sessions() if r.get("exit")}
    assert sessions[seen]["country"] == "de"
    return lease


async def _rotated_without_a_failed_request(
    up: Up, lease: dict[str, Any], site: EgressSite
) -> dict[str, Any]:
    holder = Holder(up, lease["id"], site.url("/rotating"))
    running = asyncio.create_task(holder.run())
    try:
        await until(lambda: len(holder.ok) >= 3, timeout=30, what="requests through the lease")
        status, rotation = await up.api_call("POST", f"/v1/leases/{lease['id']}/rotate")
        assert status == 202, rotation

        async def switched() -> dict[str, Any] | None:
            status, now = await up.api_call("GET", f"/v1/leases/{lease['id']}")
            assert status == 200, now
            return now if now["fencingToken"] > lease["fencingToken"] else None

        await until(switched, timeout=120, what="the lease on a fresh session")
        after = await switched()
        assert after is not None
        before = len(holder.ok)
        await until(lambda: len(holder.ok) >= before + 3, timeout=30, what="requests after")
    finally:
        holder.stopped = True
        await running
    assert holder.failed == []
    assert len(set(holder.ok)) == 2, holder.ok  # the old session's exit, then the new one's
    return after


async def _dropped_session_recorded(
    up: Up, service: UpstreamService, lease: dict[str, Any], site: EgressSite
) -> None:
    """The service forgets the session: its next request leaves from another exit of the same
    country. The egress check records the change with the old and the new address, the proxy
    stays leased and leasable, and the holder's requests leave from the new exit."""
    uid = lease["proxy"]["uid"]
    old_ip = lease["proxy"]["egress"]["ip"]
    exit_address = next(a for a, ip in PUBLIC.items() if ip == old_ip)
    [row] = [r for r in service.sessions() if r.get("exit") == exit_address]
    service.drop(row["session"])
    holder = Holder(up, lease["id"], site.url("/after-drop"))
    await holder.through(lease["proxy"]["url"])
    assert holder.failed == [], holder.failed
    [new_exit] = holder.ok
    assert new_exit != exit_address
    assert new_exit in DE

    async def recorded() -> dict[str, Any] | None:
        got = await up.cli("events", "--stream", "PROXY", "-o", "json")
        for line in got.stdout.splitlines():
            found = json.loads(line) if line.strip() else {}
            if found.get("type") == "EgressChanged" and found["subject"].startswith(
                f"proxy.{uid}."
            ):
                return found
        return None

    await until(recorded, timeout=60, what="the change of exit recorded")
    change = await recorded()
    assert change is not None
    assert (change["event"]["old_ip"], change["event"]["ip"]) == (old_ip, PUBLIC[new_exit])
    [proxy] = [p for p in await views(up) if p["uid"] == uid]
    assert proxy["egress"]["ip"] == PUBLIC[new_exit]
    assert proxy["egress"]["notLeasableBecause"] == ""
    assert proxy["leased"] is True


async def _failing_session_replaced(
    up: Up, service: UpstreamService, lease: dict[str, Any]
) -> None:
    """The service stops answering the leased proxy's session (it lost it and never says so):
    the proxy goes unhealthy and is replaced, as any proxy unhealthy for
    ``--replace-unhealthy-after`` is: a new instance, so a new session, and the lease holds the
    proxy through it."""
    uid = lease["proxy"]["uid"]
    [before] = [p for p in await views(up) if p["uid"] == uid]
    exit_address = next(a for a, ip in PUBLIC.items() if ip == before["egress"]["ip"])
    [row] = [r for r in service.sessions() if r.get("exit") == exit_address]
    service.stall(times=None, session=row["session"])
    try:

        async def replaced() -> bool:
            [now] = [p for p in await views(up) if p["uid"] == uid]
            return bool(now["phase"] == "Ready" and now["url"] != before["url"])

        try:
            await until(replaced, timeout=180, what="the failing session replaced")
        except AssertionError as exc:  # keep what up said
            raise AssertionError(f"{exc}; up said:\n{up.output.decode()[-8000:]}") from exc
    finally:
        service.clear()
    live = {r["session"] for r in service.sessions() if r.get("exit")}
    status, held = await up.api_call("GET", f"/v1/leases/{lease['id']}")
    assert status == 200, held
    assert held["proxy"]["uid"] == uid
    assert held["proxy"]["url"] != lease["proxy"]["url"]
    assert live - {row["session"]}  # the new instance's session


async def _bytes_metered_to_the_lease(up: Up, lease: dict[str, Any]) -> None:
    """The executor's meter read the sessions' Squid logs: the lease's requests are on the
    METER stream under its id, with the bytes they moved (D161)."""

    async def metered() -> list[dict[str, Any]]:
        got = await up.cli("events", "--stream", "METER", "-o", "json")
        assert got.returncode == 0, got.stdout + got.stderr
        found = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
        return [f["event"] for f in found if f["event"].get("lease_id") == lease["id"]]

    await until(metered, timeout=60, what="the lease's bytes metered")
    records = await metered()
    uids = {p["uid"] for p in await views(up)} | {lease["proxy"]["uid"]}
    assert {r["proxy_uid"] for r in records} <= uids
    assert sum(r["requests"] for r in records) >= 2
    assert all(r["bytes_up"] > 0 and r["bytes_down"] > 0 for r in records), records
    assert {r["provider"] for r in records} == {"resi"}


async def _a_spent_budget_stops_leasing(up: Up, lease: dict[str, Any], site: EgressSite) -> None:
    """An upload beyond the entry's budget: once the meter has recorded it, no proxy of the
    entry is leased, the refusal and the proxy's view say why, and the held lease goes on."""
    upload = b"u" * (BUDGET + 500_000)

    def post() -> int:
        with httpx.Client(proxy=lease["proxy"]["url"], timeout=30, trust_env=False) as client:
            return client.post(site.url("/upload"), content=upload).status_code

    status, now = await up.api_call("GET", f"/v1/leases/{lease['id']}")
    assert status == 200, now
    lease = now
    assert await asyncio.to_thread(post) == 200

    async def refused() -> dict[str, Any] | None:
        status, body = await up.api_call(
            "POST", "/v1/leases", {"pool": "crawl/resi-fr", "ttlSeconds": 60, "holder": "c2"}
        )
        return body if status == 503 and "budget_spent" in body.get("message", "") else None

    await until(refused, timeout=60, what="the budget spent")
    [proxy] = [p for p in await views(up) if p["uid"] == lease["proxy"]["uid"]]
    assert proxy["budget"]["notLeasableBecause"] == "budget_spent"
    assert proxy["budget"]["usedToday"] >= BUDGET
    assert proxy["available"] is False
    status, held = await up.api_call("GET", f"/v1/leases/{lease['id']}")
    assert status == 200, held  # held when it was spent: not revoked


async def _password_nowhere(up: Up, tmp_path: Path) -> None:
    for stream in ("PROXY", "LEASE", "GC", "POOL", "DEMAND", "TRAFFIC", "METER", "DEADLETTER"):
        got = await up.cli("events", "--stream", stream, "-o", "json")
        assert got.returncode == 0, got.stdout + got.stderr
        assert PASSWORD not in got.stdout, stream
    assert PASSWORD not in up.output.decode(errors="replace")
    listing = await asyncio.to_thread(
        subprocess.run, ["ps", "-eo", "args"], capture_output=True, text=True, check=True
    )
    assert PASSWORD not in listing.stdout
    configs = list((tmp_path / "resi").glob("instances/*/squid.conf"))
    assert configs  # it is there, and only there (mode 0600)
    for config in configs:
        assert config.stat().st_mode & 0o077 == 0
