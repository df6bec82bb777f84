"""What the rotation tests share: a proxy declared and serving, a lease on it claimed as
discovery would, a rotation asked for as discovery would, and the health service's verdict on
the replacement, appended as the prober would after probing ``projections.proxy.probe_target``
(docs/decisions/0085-a-fresh-ip-without-downtime.md). For the tests of the whole system:
``rotating_up``, requests through a proxy as they go (``Requests``) and the local provider's
instances."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path

from commands.declaring import apply
from events import subjects
from events.errors import ConcurrencyError
from events.schemas import HealthChanged, LeaseAcquired, ReplacementPromoted, RotationRequested
from events.store import EventStore, NewEvent
from projections import lease
from projections.proxy import ProxyView
from services.cli.fleet.manifests import parse_resources
from tests.support.lifecycle import view
from tests.support.system import Up, fetch_via, hello_target, running_up
from tests.support.waiting import until


def manifest(provider: str, name: str = "rot", zone: str = "a") -> str:
    return f"""
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: {name}, namespace: crawl}}
spec:
  provider: {provider}
  placement: {{zone: {zone}}}
"""


async def declared(store: EventStore, provider: str, name: str = "rot", zone: str = "a") -> str:
    """Declare (or re-declare, with a new spec) a proxy; its uid."""
    [resource] = parse_resources(manifest(provider, name, zone), "test")
    return (await apply(store, resource)).uid


async def serving(store: EventStore, uid: str) -> ProxyView:
    async def ready() -> ProxyView | None:
        v = await view(store, uid)
        return v if v is not None and v.phase.value == "Ready" and v.ip else None

    await until(ready, timeout=60)
    found = await ready()
    assert found is not None
    return found


async def leased(store: EventStore, uid: str) -> int:
    """A lease on the proxy, claimed as discovery would; its fencing token."""
    claim = LeaseAcquired(lease_id="lease-1", proxy_uid=uid, ttl_seconds=600)
    await store.append(subjects.lease(uid), [NewEvent(claim, "claim-1")], expected_seq=0)
    return await token(store, uid)


async def token(store: EventStore, uid: str) -> int:
    folded = lease.fold(list((await store.read(subjects.lease(uid))).events))
    assert folded is not None
    assert folded.current is not None
    return folded.current.fencing_token


async def request_rotation(store: EventStore, uid: str) -> None:
    for _ in range(50):
        history = await store.read(subjects.proxy(uid))
        event = RotationRequested(uid=uid, rotation_id="rot-1", lease_id="lease-1")
        try:
            await store.append(
                subjects.proxy(uid), [NewEvent(event, "rotate-1")], expected_seq=history.last_seq
            )
            return
        except ConcurrencyError:
            continue
    raise AssertionError("the proxy never held still for the request")


async def replacement_running(store: EventStore, uid: str) -> str:
    """Wait for the replacement to run; its provider id."""

    async def running() -> str:
        v = await view(store, uid)
        r = v.replacement if v is not None else None
        return r.provider_id if r is not None and r.state == "Running" else ""

    await until(running, timeout=60)
    return await running()


async def judge_healthy(store: EventStore, uid: str, provider_id: str) -> None:
    """What the health service appends once the replacement passed its probes."""
    verdict = HealthChanged(healthy=True, reason="ProbeSucceeded", provider_id=provider_id)
    for _ in range(50):
        history = await store.read(subjects.proxy(uid))
        try:
            await store.append(
                subjects.proxy(uid),
                [NewEvent(verdict, f"verdict-{provider_id}")],
                expected_seq=history.last_seq,
            )
            return
        except ConcurrencyError:
            continue
    raise AssertionError("the proxy never held still for the verdict")


async def promoted(store: EventStore, uid: str) -> bool:
    history = await store.read(subjects.proxy(uid))
    return any(isinstance(r.event, ReplacementPromoted) for r in history.events)


# ------------------------------------------------------------------ the whole system

PROXY = """apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: rot-1, namespace: crawl}
spec:
  provider: local
  attributes: {country: de}
"""


class Requests:
    """Request after request through a proxy, each answer noted as it went."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.ok: list[str] = []
        self.failed: list[str] = []
        self.stopped = False

    async def through(self, url: str) -> None:
        try:
            body = await asyncio.to_thread(fetch_via, url, self.target)
        except (OSError, urllib.error.URLError) as exc:
            self.failed.append(f"{url}: {exc}")
        else:
            assert body == "hello through the proxy"
            self.ok.append(url)


def instances(up: Up) -> list[str]:
    return sorted(p.name for p in (up.data_dir / "local" / "instances").iterdir() if p.is_dir())


@contextlib.asynccontextmanager
async def rotating_up(tmp_path: Path) -> AsyncIterator[tuple[Up, str]]:
    """``up`` with real Squids (the local provider), a 2 s rotation drain and no cooldown, its
    probes aimed at a loopback target, and ``PROXY`` applied and Ready; yields ``up`` and the
    target's URL, which answers "hello through the proxy"."""
    yaml_file = tmp_path / "proxy.yaml"
    yaml_file.write_text(PROXY)
    with hello_target() as target:
        async with running_up(
            tmp_path, "--rotation-drain", "2", "--lease-cooldown", "0", health_check_url=target
        ) as up:
            applied = await up.cli("apply", "-f", str(yaml_file), "--wait")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            yield up, target
