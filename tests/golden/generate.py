"""Writes the golden log of this build's schema, and what this build makes of every golden log.

    python -m tests.golden.generate log        # schema-<SCHEMA_VERSION>.jsonl, new or appended to
    python -m tests.golden.generate expected   # expected-events.json and expected-views.json

The log is a life of two proxies, their leases and a GC sweep, as the services write it: the
declarations come from the CLI's writer (``commands.declaring``) and every decision from the
reconciler's own ``decide`` on its fold, into an in-memory log with fixed JetStream timestamps;
the executor's, the health prober's, discovery's, the GC's and the consumers' facts are built
the way those services build them (same constructors, same ids). Every event type the build
writes appears at least once (``tests/unit/test_golden_log.py`` checks it).

See tests/golden/README.md for when to run which.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from commands import declaring
from events import codec, subjects
from events.customresource import cli_uid
from events.egress import EGRESS_MISMATCH, EgressChanged, EgressObserved
from events.schemas import (
    SCHEMA_VERSION,
    CreateInstance,
    DeadLettered,
    DeleteInstance,
    ErrorClass,
    InstanceCreated,
    InstanceGone,
    InstanceState,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseSwitched,
    ObserveInstance,
    PhaseChanged,
    ProviderFailed,
    ProxyRemoved,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import NewEvent, derive_msg_id
from projections import proxy as proxy_fold
from services.executor.meter import Meter, meter_metrics
from services.executor.pure.answers import observed
from services.gateway.pure.traffic import Exchange
from services.gateway.traffic import TrafficRecorder, traffic_metrics
from services.gc.pure.report import ProviderReport, sweep_events
from services.health.egress import finding_msg_id
from services.providers.base import Instance
from services.providers.gcp.pure.mapping import provider_id as gcp_provider_id
from services.providers.local_process import ACCESS_LOG
from services.providers.upstream.provider import Metered
from tests.golden import logs
from tests.golden.logs import Message
from tests.golden.pools_story import the_autoscaled_pool_busy, the_life_of_pool_de
from tests.golden.writers import (
    DRAIN,
    POLICY,
    T0,
    GoldenLog,
    acquire,
    answer,
    command,
    created,
    declare,
    gcp_instance,
    lease_event,
    lease_view,
    local_instance,
    reconcile,
    report,
    request_rotation,
    verdict,
)

# -------------------------------------------------------------------------------------- story

DE_1 = {
    "apiVersion": "crawl.example.com/v1alpha1",
    "kind": "Proxy",
    "metadata": {"name": "de-1", "namespace": "golden"},
    "spec": {
        "provider": "local",
        "attributes": {"country": "de", "tier": "gold"},
        "healthCheck": {"intervalSeconds": 5, "failureThreshold": 2},
    },
}
US_1 = {
    "apiVersion": "crawl.example.com/v1alpha1",
    "kind": "Proxy",
    "metadata": {"name": "us-1", "namespace": "golden"},
    "spec": {
        "provider": "gcp-eu",
        "placement": {"zone": "europe-west1-b", "machineType": "e2-micro-typo"},
        "attributes": {"country": "us"},
        "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
    },
}
ZONE = "europe-west1-b"
US_1_FIXED = {
    **US_1,
    "spec": {**US_1["spec"], "placement": {"zone": ZONE, "machineType": "e2-micro"}},  # type: ignore[dict-item]
}


def the_life_of_de_1(log: GoldenLog) -> None:
    """Declared, created, Ready and healthy; leased; rotated by its holder after a block (the
    replacement promoted, the lease switched, the old instance deleted after the drain); the
    lease renewed, reported and released; leased again, a second rotation that fails, and that
    lease expired."""
    uid = declare(log, DE_1)
    reconcile(log, uid, CreateInstance, PhaseChanged)
    first = created(log, uid)
    since = log.now
    made = InstanceCreated(
        command_id=first.command_id, provider="local", provider_id=first.instance_name
    )
    answer(log, uid, made, "created", 0.3)
    running = local_instance(uid, first.instance_name, 20417, since)
    answer(log, uid, observed(first.command_id, "local", running), "observed-Running", 1.2)
    reconcile(log, uid, PhaseChanged)
    verdict(log, uid, 3.2)

    lease_id = "6b1f3c8e-5d0a-4c2e-9a41-2f7d6c1e0b93"
    acquire(log, uid, lease_id, "crawler-7", 300.0)
    report(log, uid, lease_id, "blocked", 1)
    rotation = request_rotation(log, uid, lease_id)
    reconcile(log, uid, ReplacementStarted, CreateInstance, leased=True)
    second = created(log, uid)
    since = log.now
    made = InstanceCreated(
        command_id=second.command_id, provider="local", provider_id=second.instance_name
    )
    answer(log, uid, made, "created", 0.3)
    fresh = local_instance(uid, second.instance_name, 20533, since)
    answer(log, uid, observed(second.command_id, "local", fresh), "observed-Running", 1.1)
    reconcile(log, uid)  # running, not probed yet: the health service probes the replacement
    verdict(log, uid, 2.7)
    reconcile(log, uid, ReplacementPromoted, PhaseChanged)
    switched = LeaseSwitched(
        lease_id=lease_id,
        proxy_uid=uid,
        rotation_id=rotation,
        provider_id=fresh.provider_id,
        ip=fresh.ip,
    )
    lease_event(log, uid, switched, derive_msg_id("lease-switched", uid, rotation, lease_id), 0.2)
    log.later(DRAIN + 1.0)
    reconcile(log, uid, DeleteInstance)
    retire, _ = command(log, uid)
    gone = InstanceGone(
        command_id=retire.command_id, provider="local", provider_id=first.instance_name
    )
    answer(log, uid, gone, "gone", 0.4)

    renewed = LeaseRenewed(
        lease_id=lease_id,
        proxy_uid=uid,
        ttl_seconds=300.0,
        requested_ttl_seconds=300.0,
        deadline=POLICY.deadline(log.later(20.0)),
    )
    lease_event(log, uid, renewed, derive_msg_id("lease-renewed", lease_id, "1"), 0.01)
    report(log, uid, lease_id, "success", 2)
    released = LeaseReleased(
        lease_id=lease_id,
        proxy_uid=uid,
        cooldown_seconds=POLICY.cooldown,
        deadline=POLICY.deadline(log.later(5.0)),
    )
    lease_event(log, uid, released, derive_msg_id("lease-released", lease_id, "1"), 0.01)

    log.later(POLICY.cooldown + 1.0)
    second_lease = "0c7e2a91-3b64-4f18-8d25-9e1a7b4c6f02"
    acquire(log, uid, second_lease, "crawler-9", 60.0)
    request_rotation(log, uid, second_lease)
    reconcile(log, uid, ReplacementStarted, CreateInstance, leased=True)
    failed = ProviderFailed(
        command_id=created(log, uid).command_id,
        provider="local",
        operation="create",
        error_class=ErrorClass.PERMANENT,
        message="no free port in 20000-20999",
    )
    answer(log, uid, failed, "failed-create", 0.2)
    reconcile(log, uid, RotationEnded)
    view = lease_view(log, uid)
    assert view is not None
    assert view.current is not None
    log.now = max(log.now, view.current.expires_at)
    expired = LeaseExpired(lease_id=second_lease, proxy_uid=uid)
    msg_id = derive_msg_id("lease-expired", second_lease, str(view.last_seq))
    lease_event(log, uid, expired, msg_id, 0.4)


def the_life_of_us_1(log: GoldenLog) -> str:
    """Declared with a machine type the cloud refuses (Failed), declared again fixed, created,
    first seen Pending and looked at again (Ready), then deleted and removed. Returns the id of
    the instance the refused create left behind, which the GC finds."""
    uid = declare(log, US_1)
    reconcile(log, uid, CreateInstance, PhaseChanged)
    first = created(log, uid)
    refused = ProviderFailed(
        command_id=first.command_id,
        provider="gcp-eu",
        operation="create",
        error_class=ErrorClass.PERMANENT,
        message="400 Invalid value for field 'resource.machineType': 'e2-micro-typo'",
    )
    answer(log, uid, refused, "failed-create", 2.5)
    reconcile(log, uid, PhaseChanged)

    declare(log, US_1_FIXED)
    reconcile(log, uid, CreateInstance, PhaseChanged)
    second = created(log, uid)
    since = log.now
    pid = gcp_provider_id(ZONE, second.instance_name)
    made = InstanceCreated(command_id=second.command_id, provider="gcp-eu", provider_id=pid)
    answer(log, uid, made, "created", 0.8)
    pending = gcp_instance(uid, pid, since, InstanceState.PENDING)
    answer(log, uid, observed(second.command_id, "gcp-eu", pending), "observed-Pending", 20.0)
    reconcile(log, uid, ObserveInstance)
    look, _ = command(log, uid)
    running = gcp_instance(uid, pid, since, InstanceState.RUNNING)
    answer(log, uid, observed(look.command_id, "gcp-eu", running), "observed", 9.0)
    reconcile(log, uid, PhaseChanged)
    verdict(log, uid, 48.9)

    log.later(600.0)
    asyncio.run(declaring.delete(log, "golden", "us-1"))
    reconcile(log, uid, DeleteInstance, PhaseChanged)
    delete, _ = command(log, uid)
    gone = InstanceGone(command_id=delete.command_id, provider="gcp-eu", provider_id=pid)
    answer(log, uid, gone, "gone", 30.0)
    reconcile(log, uid, ProxyRemoved)
    return gcp_provider_id(ZONE, first.instance_name)


def gc_sweep(log: GoldenLog, us_uid: str, orphan: str) -> None:
    """One sweep of both providers (``services.gc.collector``): the instance the refused create
    left on gcp-eu is an orphan of a removed proxy, and is deleted."""
    taken = log.later(300.0)
    sweep_id = f"{taken:%Y%m%dT%H%M%S}-1"
    left = Instance(
        provider_id=orphan,
        name=orphan.rsplit("/", 1)[-1],
        state=InstanceState.STOPPED,
        owner_uid=us_uid,
        created_at=T0 + timedelta(seconds=60),
    )
    reports = [
        ProviderReport(provider="gcp-eu", listed=1, orphans=[left], deleted=[orphan]),
        ProviderReport(provider="local", listed=1),
    ]
    for report_ in reports:
        for new in sweep_events(report_, sweep_id):
            log.store(subjects.gc(report_.provider), new, after=0.3)


def dead_letter(log: GoldenLog, uid: str) -> None:
    """What a consumer writes when it gives up on a message (``services.runtime.nats.consumer``):
    here the reconciler on us-1's second declaration, during an outage, before a later event
    woke it."""
    (stored,) = (
        m
        for m in log.messages
        if m.subject == f"proxy.{uid}.declared"
        and m.headers[codec.HDR_EVENT_TYPE] == "ProxySpecChanged"
    )
    record = DeadLettered(
        consumer="reconciler",
        stream=stored.stream,
        subject=stored.subject,
        sequence=stored.seq,
        deliveries=5,
        reason="handler failed 5 times, last: StoreUnavailable: nats: timeout",
        payload=stored.payload.decode("utf-8", errors="replace"),
        headers=dict(stored.headers),
    )
    msg_id = derive_msg_id("deadletter", "reconciler", stored.stream, str(stored.seq))
    log.store(subjects.deadletter("reconciler"), NewEvent(record, msg_id), after=0.1)


def the_egress_of_de_1(log: GoldenLog) -> None:
    """de-1 asks for a German egress and replacement on mismatch: its instance is first found
    in Germany, then its address moves to an American one (the change event), and the health
    service asks for a fresh instance (``RotationRequested`` with its reason)."""
    uid = cli_uid("golden", "de-1")
    view = proxy_fold.fold(log.history(subjects.proxy(uid)).events)
    assert view is not None
    db = "GeoLite2-Country 2026-11-28 + GeoLite2-ASN 2026-11-28"
    german = EgressObserved(
        provider_id=view.provider_id,
        ip="203.0.113.5",
        scope="public",
        country="DE",
        asn=3320,
        org="Deutsche Telekom AG",
        db=db,
        checked_at=log.later(2.0),
    )
    log.store(subjects.proxy(uid), NewEvent(german, finding_msg_id(uid, german, 0)), after=0.2)
    before = proxy_fold.fold(log.history(subjects.proxy(uid)).events)
    assert before is not None
    assert before.egress
    american = EgressChanged(
        provider_id=view.provider_id,
        ip="198.51.100.7",
        scope="public",
        country="US",
        asn=7018,
        org="AT&T Services, Inc.",
        db=db,
        checked_at=log.later(600.0),
        old_ip="203.0.113.5",
        old_country="DE",
        old_asn=3320,
    )
    msg_id = finding_msg_id(uid, american, before.egress[-1].seq)
    log.store(subjects.proxy(uid), NewEvent(american, msg_id), after=0.2)
    history = log.history(subjects.proxy(uid))
    cause = f"egress-mismatch:{view.provider_id}"
    rotation_id = "rot-" + derive_msg_id(cause, uid, str(history.last_seq))[:20]
    asked = RotationRequested(
        uid=uid, rotation_id=rotation_id, client="health", reason=EGRESS_MISMATCH
    )
    msg_id = derive_msg_id("rotation-requested", rotation_id)
    log.store(subjects.proxy(uid), NewEvent(asked, msg_id), after=0.1)


def the_traffic_of_crawler_a(log: GoldenLog) -> None:
    """The gateway relays for crawler-a through de-1's second lease: a page, a block and a
    tunnel to two hosts, recorded at the end of the interval (``TrafficRecorded``), as the
    gateway's recorder writes it."""
    uid = cli_uid("golden", "de-1")
    clock = [log.later(0.5).timestamp()]
    recorder = TrafficRecorder(
        log,
        traffic_metrics(CollectorRegistry()),
        interval=10.0,
        replica="gw-golden",
        clock=lambda: clock[0],
    )
    lease_id = "0c7e2a91-3b64-4f18-8d25-9e1a7b4c6f02"

    def seen(host: str, outcome: str, status: int, up: int, down: int, *, tunnel: bool) -> None:
        exchange = Exchange("crawler-a", uid, "golden/de-1", lease_id, host, outcome, status)
        recorder.count(replace(exchange, up=up, down=down, tunnel=tunnel))

    seen("shop.example", "success", 200, 0, 5120, tunnel=False)
    seen("shop.example", "blocked", 403, 0, 310, tunnel=False)
    seen("cdn.example", "success", 200, 517, 40960, tunnel=True)
    clock[0] += 10.0
    log.later(10.0)
    assert asyncio.run(recorder.flush()) == 1


class _MeteredEntry:
    """An upstream entry ``resi-de`` as the meter sees it, with de-1 as its one session: the
    story's proxies are local, and the record only names the proxy and the lease."""

    name = "resi-de"
    max_bytes_per_day = 5_000_000_000

    def __init__(self, instance: Metered) -> None:
        self.instance = instance

    def metered(self) -> list[Metered]:
        return [self.instance]


def the_bytes_of_de_1(log: GoldenLog) -> None:
    """The executor's meter reads de-1's Squid log, as if de-1 were a session of the upstream
    entry ``resi-de``: two requests and a tunnel under its second lease, the health prober's
    request (no lease) and one Squid refused (not metered), appended as ``UpstreamMetered`` per
    lease (docs/decisions/0161-metering-upstream-bytes.md)."""
    uid = cli_uid("golden", "de-1")
    lease_id = "0c7e2a91-3b64-4f18-8d25-9e1a7b4c6f02"
    lines = [
        f"1796667600.125 412 5731 TCP_MISS {lease_id}",
        f"1796667601.480 20377 289 TCP_MISS {lease_id}",
        f"1796667603.902 1374 41236 TCP_TUNNEL {lease_id}",
        "1796667604.011 176 747 TCP_MISS -",
        "1796667604.250 131 3512 TCP_DENIED -",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        (where / ACCESS_LOG).write_text("".join(f"{line}\n" for line in lines))
        instance = Metered("de-1", "inst-de-1-golden", uid, where, where, pid=0)
        clock = [log.later(0.5).timestamp()]
        meter = Meter(
            log,
            [_MeteredEntry(instance)],
            meter_metrics(CollectorRegistry()),
            replica="executor-golden",
            clock=lambda: clock[0],
        )
        clock[0] += 10.0
        log.later(10.0)
        assert asyncio.run(meter.meter_once()) == 2


def golden_log() -> list[Message]:
    log = GoldenLog()
    the_life_of_de_1(log)
    orphan = the_life_of_us_1(log)
    gc_sweep(log, cli_uid("golden", "us-1"), orphan)
    dead_letter(log, cli_uid("golden", "us-1"))
    the_life_of_pool_de(log)  # added in schema 1 with the pool events: appended (README)
    the_autoscaled_pool_busy(log)  # added with the autoscaler's events: appended
    the_egress_of_de_1(log)  # added with verified egress: appended
    the_traffic_of_crawler_a(log)  # added with the gateway's traffic records: appended
    the_bytes_of_de_1(log)  # added with the upstream meter's records: appended
    return log.messages


# --------------------------------------------------------------------------------------- main


def write_log() -> None:
    path = logs.log_path(SCHEMA_VERSION)
    messages = golden_log()
    if path.exists():
        stored = logs.load(path)
        kept = [m.line() for m in stored]
        if not all(map(_same, stored, messages[: len(kept)])) or len(messages) < len(kept):
            sys.exit(
                f"{path.name} exists and the story no longer begins with it: a golden log is "
                "never rewritten, only appended to (new event types at the same schema). A "
                "change old readers cannot read is a new schema (docs/operations.md, Upgrades)."
            )
        if len(messages) == len(kept):
            print(f"{path.name} holds the whole story already")
            return
        messages = [*stored, *messages[len(kept) :]]  # the stored lines stay as they are
    logs.write(path, messages)
    print(f"wrote {path.name} ({len(messages)} messages)")


def _same(stored: Message, made: Message) -> bool:
    """The story made the stored message again: byte for byte, or with an event that a field
    added since (with its default, the schema's rule) makes longer, read back equal."""
    if stored.line() == made.line():
        return True
    where = (stored.stream, stored.seq, stored.subject, stored.time, stored.headers)
    if where != (made.stream, made.seq, made.subject, made.time, made.headers):
        return False
    return stored.read()[0].event == made.read()[0].event


def write_expected() -> None:
    events: dict[str, Any] = {}
    views: dict[str, Any] = {}
    for path in logs.log_paths():
        messages = logs.load(path)
        events[path.name] = logs.decoded(messages)
        views[path.name] = logs.views(messages)
    logs.EXPECTED_EVENTS.write_text(json.dumps(events, indent=1, sort_keys=True) + "\n")
    logs.EXPECTED_VIEWS.write_text(json.dumps(views, indent=1, sort_keys=True) + "\n")
    print(f"wrote {logs.EXPECTED_EVENTS.name} and {logs.EXPECTED_VIEWS.name}")


def main(argv: list[str]) -> None:
    if argv == ["log"]:
        write_log()
    elif argv == ["expected"]:
        write_expected()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
