"""Discovery's views fed by hand, as its projectors would feed them: tests of the lease logic
without servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.schemas import (
    Condition,
    Event,
    HealthChanged,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import Recorded
from projections.lease import LeaseRecord, LeaseView
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore


class Fleet:
    """A ``Views`` fed by hand, as its projectors would feed it."""

    def __init__(self, views: Views | None = None) -> None:
        self.views = views or Views(None, InMemoryEventStore())  # type: ignore[arg-type]
        self.seq = 0

    def _record(self, subject: str, event: Event, at: datetime) -> Recorded:
        self.seq += 1
        return Recorded(event=event, seq=self.seq, subject=subject, timestamp=at)  # type: ignore[arg-type]

    def proxy(self, uid: str, attributes: dict[str, str], *events: Event) -> Fleet:
        declared = ProxyDeclared(
            uid=uid, namespace="crawl", name=uid, spec=ProxySpec(attributes=attributes)
        )
        ready = PhaseChanged(
            phase=Phase.READY,
            url="http://127.0.0.1:3128",
            conditions=(Condition(type="Ready", status="True"),),
        )
        for event in (declared, ready, HealthChanged(healthy=True), *events):
            views = self.views.proxies.views
            views[uid] = self.views._on_proxy(
                views.get(uid), self._record(f"proxy.{uid}.x", event, datetime.now(UTC))
            )
        return self

    def lease(self, uid: str, event: Event, at: datetime) -> Fleet:
        views = self.views.leases.views
        views[uid] = self.views._on_lease(views.get(uid), self._record(f"lease.{uid}", event, at))
        return self


def held_lease(uid: str, now: datetime, *, ends_in: float, cooldown: float = 0.0) -> LeaseView:
    """A lease view whose lease was taken a minute before ``now`` and ends ``ends_in`` seconds
    after it (negative: ended), resting ``cooldown`` seconds after its end."""
    record = LeaseRecord(
        lease_id=f"lease-{uid}",
        proxy_uid=uid,
        acquired_at=now - timedelta(minutes=1),
        expires_at=now + timedelta(seconds=ends_in),
        ttl_seconds=60.0 + ends_in,
        fencing_token=1,
        cooldown_seconds=cooldown,
    )
    return LeaseView(proxy_uid=uid, current=record, fencing_token=1)
