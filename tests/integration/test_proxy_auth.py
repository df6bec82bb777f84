"""Leases enforced at the proxy (D84), on real Squids started by the local provider.

Credentials are minted by the code that mints them in production (discovery's
``LeaseCredentials``, the health prober's ``ProbeCredentials``) and checked by the real helper
that Squid runs, so the tests cover the whole path a holder's request takes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from events.schemas import InstanceState, ProxySpec
from projections.lease import LeaseRecord
from projections.proxy import ProxyView
from services.discovery.leasing.credentials import LeaseCredentials
from services.health.credentials import ProbeCredentials
from services.health.probe_client import CheckUrl, ProbeClient
from services.providers import local_auth
from services.providers.base import CreateRequest, Provider
from services.providers.local import LocalProvider
from services.providers.squidauth.keyed import lease_keyed
from tests.contract.provider import delete_all
from tests.support.health import RecordingTarget
from tests.support.squid_fixtures import local_squids, origin_url  # noqa: F401  # fixtures `local` and `target`
from tests.support.system import processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.integration

MASTER = b"integration-test-master-secret-0123456789"
WAIT = 30.0
FENCE_SECONDS = 2.0
"""The issue's bound: old credentials are refused within 2 s."""


@dataclass
class Proxy:
    uid: str
    url: str
    instance_dir: Path


async def start(provider: Provider, local: LocalProvider, name: str) -> Proxy:
    uid = str(uuid.uuid4())
    request = CreateRequest(
        name=name, owner_uid=uid, namespace="crawl", proxy_name=name, spec=ProxySpec()
    )
    provider_id = await provider.create(request)

    async def running() -> bool:
        return (await local.get(provider_id)).state is InstanceState.RUNNING

    await until(running, WAIT, what=f"{name} Running")
    instance = await local.get(provider_id)
    return Proxy(uid, instance.url, local.data_dir / "instances" / provider_id)


def status_via(proxy_url: str, target: str, headers: dict[str, str] | None = None) -> int:
    """The status of a GET of ``target`` through ``proxy_url`` (user:password in it become
    ``Proxy-Authorization``, as in curl and every HTTP client)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    request = urllib.request.Request(target, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:  # it holds the response's socket until closed
            return exc.code


def lease(proxy: Proxy, token: int, seconds: float) -> str:
    """The proxy URL discovery would hand the holder of a lease with ``token``."""
    now = datetime.now(UTC)
    record = LeaseRecord(
        lease_id=str(uuid.uuid4()),
        proxy_uid=proxy.uid,
        acquired_at=now,
        expires_at=now + timedelta(seconds=seconds),
        ttl_seconds=seconds,
        fencing_token=token,
    )
    return LeaseCredentials(MASTER).url(ProxyView(uid=proxy.uid, url=proxy.url), record)


async def refused_after(proxy_url: str, target: str) -> float:
    """Seconds until a request with ``proxy_url`` is answered 407 (polled every 50 ms)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while await asyncio.to_thread(status_via, proxy_url, target) != 407:
        assert loop.time() - started < 10, "never refused"
        await asyncio.sleep(0.05)
    return loop.time() - started


async def test_only_a_current_lease_passes(local: LocalProvider, target: str) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-a")
    assert await asyncio.to_thread(status_via, proxy.url, target) == 407
    current = lease(proxy, 10, 60)
    assert "@" in current
    assert await asyncio.to_thread(status_via, current, target) == 200
    parts = urlsplit(current)
    forged = current.replace(f":{parts.password}@", ":10.9999999999999.0bad@")
    assert await asyncio.to_thread(status_via, forged, target) == 407


async def test_an_expired_lease_is_refused_within_two_seconds(
    local: LocalProvider, target: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-b")
    expires_in = 1.5
    url = lease(proxy, 10, expires_in)
    loop = asyncio.get_running_loop()
    minted = loop.time()
    assert await asyncio.to_thread(status_via, url, target) == 200
    waited = await refused_after(url, target)
    late = minted + waited - (minted + expires_in)
    assert late < FENCE_SECONDS, f"refused {late:.2f}s after its expiry"


async def test_the_previous_holder_is_fenced_once_a_newer_lease_is_used(
    local: LocalProvider, target: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-c")
    old, new = lease(proxy, 10, 300), lease(proxy, 25, 300)
    assert await asyncio.to_thread(status_via, old, target) == 200
    assert await asyncio.to_thread(status_via, old, target) == 200  # still its turn
    assert await asyncio.to_thread(status_via, new, target) == 200
    assert await refused_after(old, target) < FENCE_SECONDS
    assert await asyncio.to_thread(status_via, new, target) == 200
    # The helper's fencing state outlives the helpers: killed, Squid starts new ones, which
    # still refuse the old lease.
    mine = processes_mentioning(str(proxy.instance_dir) + os.sep)
    helpers = [pid for pid in processes_mentioning(local_auth.HELPER_FILE) if pid in mine]
    assert helpers, "no helper process found"
    for pid in helpers:
        os.kill(pid, signal.SIGKILL)
    await until(lambda: status_via(new, target) == 200, 10, what="new helpers")
    assert await asyncio.to_thread(status_via, old, target) == 407


async def test_the_probe_credential_passes_and_fences_nobody(
    local: LocalProvider, target: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-d")
    holder = lease(proxy, 10, 300)
    assert await asyncio.to_thread(status_via, holder, target) == 200
    views = {proxy.uid: ProxyView(uid=proxy.uid, url=proxy.url)}
    client = ProbeClient()
    try:
        check = CheckUrl.parse(target)
        refused = await client.probe(proxy.url, check, 5.0)
        assert (refused.ok, refused.status) == (False, 407)
        client.proxy_auth = ProbeCredentials(MASTER, lambda: views)
        for _ in range(3):
            result = await client.probe(proxy.url, check, 5.0)
            assert result.ok, result
    finally:
        await client.close()
    assert await asyncio.to_thread(status_via, holder, target) == 200


async def test_credentials_open_only_their_own_proxy(local: LocalProvider, target: str) -> None:
    keyed = lease_keyed(local, MASTER)
    one, two = await start(keyed, local, "px-e"), await start(keyed, local, "px-f")
    for_one = lease(one, 10, 60)
    at_two = for_one.replace(urlsplit(one.url).netloc, urlsplit(two.url).netloc)
    assert await asyncio.to_thread(status_via, for_one, target) == 200
    assert await asyncio.to_thread(status_via, at_two, target) == 407
    other_master = LeaseCredentials(b"another master secret, not ours").url(
        ProxyView(uid=one.uid, url=one.url),
        LeaseRecord(
            lease_id="x",
            proxy_uid=one.uid,
            acquired_at=datetime.now(UTC),
            expires_at=datetime.now(UTC) + timedelta(minutes=1),
            ttl_seconds=60,
            fencing_token=99,
        ),
    )
    assert await asyncio.to_thread(status_via, other_master, target) == 407


async def test_auth_none_serves_without_credentials(local: LocalProvider, target: str) -> None:
    proxy = await start(local, local, "px-g")  # not keyed: what `auth: none` builds
    assert await asyncio.to_thread(status_via, proxy.url, target) == 200
    assert "auth_param" not in (proxy.instance_dir / "squid.conf").read_text()
    # A lease URL's credentials are simply not asked for.
    assert await asyncio.to_thread(status_via, lease(proxy, 10, 60), target) == 200


async def test_the_proxypy_backend_enforces_the_same_leases(tmp_path: Path, target: str) -> None:
    local = LocalProvider("local", tmp_path / "pp", backend="proxypy", stop_grace=0.5)
    try:
        proxy = await start(lease_keyed(local, MASTER), local, "px-h")
        assert await asyncio.to_thread(status_via, proxy.url, target) == 407
        old, new = lease(proxy, 10, 300), lease(proxy, 25, 300)
        assert await asyncio.to_thread(status_via, old, target) == 200
        assert await asyncio.to_thread(status_via, new, target) == 200
        assert await asyncio.to_thread(status_via, old, target) == 407
        assert await refused_after(lease(proxy, 30, 0.5), target) < FENCE_SECONDS
        views = {proxy.uid: ProxyView(uid=proxy.uid, url=proxy.url)}
        header = ProbeCredentials(MASTER, lambda: views)(proxy.url)
        probe = {"Proxy-Authorization": header}
        assert await asyncio.to_thread(status_via, proxy.url, target, probe) == 200
    finally:
        await delete_all(local)


async def test_no_credential_reaches_the_target(local: LocalProvider) -> None:
    recording = RecordingTarget()
    await recording.start()
    client = ProbeClient()
    try:
        proxy = await start(lease_keyed(local, MASTER), local, "px-i")
        holder = lease(proxy, 10, 300)
        assert await asyncio.to_thread(status_via, holder, recording.url()) == 204
        views = {proxy.uid: ProxyView(uid=proxy.uid, url=proxy.url)}
        client.proxy_auth = ProbeCredentials(MASTER, lambda: views)
        result = await client.probe(proxy.url, CheckUrl.parse(recording.url()), 5.0)
        assert result.ok, result
    finally:
        await client.close()
        await recording.close()
    assert len(recording.requests) == 2
    for _, headers in recording.requests:
        assert "proxy-authorization" not in headers
        assert "authorization" not in headers
