"""Poison in the log, end to end: a bad message on any subject of a proxy never wedges it.

One proxy per subject category gets poison published straight into its subject (what a buggy
writer or an attacker with publish rights could leave in the immutable log). Each proxy must
still do everything a proxy does, through the real system (`up`, the CLI, Squid, the API):
be probed, be replaced after its Squid is killed, be leased, be deleted and be declared again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import nats
import pytest

from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.system import Up, fetch_via, hello_target, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

CATEGORIES = ("declared", "cmd", "instance", "health", "status", "lease")
TYPES = {
    "declared": "ProxyDeclared",
    "cmd": "CreateInstance",
    "instance": "InstanceObserved",
    "health": "HealthChanged",
    "status": "PhaseChanged",
    "lease": "LeaseAcquired",
}


def manifest(category: str) -> str:
    return f"""apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: poisoned-{category}, namespace: poison}}
spec:
  provider: local
  attributes: {{poisoned: "{category}"}}
"""


def poisons(category: str) -> list[tuple[bytes, dict[str, str]]]:
    """Not JSON; JSON of the right type with fields of the wrong kind; a null where a number
    goes; an empty body."""
    kind = TYPES[category]
    return [
        (b"{not json", {"Egress-Event-Type": kind}),
        (json.dumps({"type": kind, "uid": 7, "phase": "Bogus", "healthy": "yes"}).encode(), {}),
        (json.dumps({"type": kind, "ttl_seconds": None, "lease_id": "x"}).encode(), {}),
        (b"", {"Egress-Event-Type": kind}),
    ]


async def publish_poison(url: str, uid: str, category: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subject = f"lease.{uid}" if category == "lease" else f"proxy.{uid}.{category}"
        for payload, headers in poisons(category):
            await js.publish(subject, payload, headers=headers or None)
    finally:
        await nc.close()


async def by_name(up: Up) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in await up.proxies()}


async def wait_ready_and_healthy(up: Up, name: str, *, not_pid: int = 0) -> dict[str, Any]:
    """Ready and healthy (and, with ``not_pid``, served by a Squid other than that one)."""
    found: dict[str, Any] = {}

    async def ready() -> bool:
        proxy = (await by_name(up)).get(name)
        found.clear()
        found.update(proxy or {})
        if proxy is None or proxy["phase"] != "Ready" or proxy["healthy"] is not True:
            return False
        return not not_pid or up.squid_pid(proxy["providerID"]) != not_pid

    try:
        await until(ready, timeout=90, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{name} never became Ready and healthy: {found}") from exc
    return found


async def fetch_leased(up: Up, uid: str, target: str) -> str:
    """A fetch through the proxy with the credentials of a lease on it (the proxy refuses
    anyone else), the lease released after."""
    lease: dict[str, Any] = {}

    async def leased() -> bool:
        status, body = await up.api_call(
            "POST", "/v1/leases", {"selector": {}, "proxyUid": uid, "ttlSeconds": 30}
        )
        if status == 201:
            lease.update(body)
        return status == 201

    await until(leased, timeout=30, every=0.5)
    try:
        return await asyncio.to_thread(fetch_via, lease["proxy"]["url"], target)
    finally:
        status, _ = await up.api_call("DELETE", f"/v1/leases/{lease['id']}")
        assert status == 204


async def prove_it_works(up: Up, category: str, target: str, manifest_file: Path) -> None:
    name = f"poisoned-{category}"
    proxy = await wait_ready_and_healthy(up, name)
    assert await fetch_leased(up, proxy["uid"], target) == "hello through the proxy"

    # Probed and replaced: kill -9 its Squid; a new instance takes over, healthy.
    pid = up.squid_pid(proxy["providerID"])
    os.kill(pid, signal.SIGKILL)
    replaced = await wait_ready_and_healthy(up, name, not_pid=pid)
    assert await fetch_leased(up, replaced["uid"], target) == "hello through the proxy"

    # Leased and released through the API.
    lease: dict[str, Any] = {}

    async def leased() -> bool:
        status, body = await up.api_call(
            "POST", "/v1/leases", {"selector": {"poisoned": category}, "ttlSeconds": 30}
        )
        if status == 201:
            lease.update(body)
        return status == 201

    await until(leased, timeout=30, every=0.5)
    assert lease["proxy"]["uid"] == proxy["uid"]
    status, _ = await up.api_call("DELETE", f"/v1/leases/{lease['id']}")
    assert status == 204

    # Deleted, then declared again from the same file: a new life, Ready and healthy.
    deleted = await up.cli("delete", "-f", str(manifest_file), "--wait", "--timeout", "90")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert name not in await by_name(up)
    applied = await up.cli("apply", "-f", str(manifest_file), "--wait", "--timeout", "90")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    again = await wait_ready_and_healthy(up, name)
    assert again["uid"] == proxy["uid"]
    assert await fetch_leased(up, again["uid"], target) == "hello through the proxy"


# Six proxies through every step of a proxy's life: 47 s in one process, and up to 100 s on
# two workers of a busy 2-core machine, too close to the suite's 120 s.
@pytest.mark.timeout(240)
async def test_poison_on_every_subject_leaves_every_proxy_working(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    files = {}
    for category in CATEGORIES:
        files[category] = tmp_path / f"{category}.yaml"
        files[category].write_text(manifest(category))
    with hello_target() as target:
        async with running_up(
            tmp_path,
            "--observe-interval",
            "1",
            "--lease-cooldown",
            "1s",
            nats_url=nats_server.url,
            health_check_url=target,
        ) as up:
            # Declared side by side: each proxy's start is its own (a Squid per proxy).
            for applied in await asyncio.gather(
                *(up.cli("apply", "-f", str(files[c]), "--wait") for c in CATEGORIES)
            ):
                assert applied.returncode == 0, applied.stdout + applied.stderr
            proxies = await by_name(up)
            for category in CATEGORIES:
                await publish_poison(
                    nats_server.admin_url, proxies[f"poisoned-{category}"]["uid"], category
                )

            await asyncio.gather(*(prove_it_works(up, c, target, files[c]) for c in CATEGORIES))

            gone = await up.cli("delete", "--all", "--wait", "--timeout", "90")
            assert gone.returncode == 0, gone.stdout + gone.stderr
            # Every poison message is on record as skipped, and nothing crashed on the way.
            log = up.output.decode()
            assert "Traceback" not in log
            assert "skipped an event" in log
