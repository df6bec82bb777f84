"""The proxy view: what the CLI's ``get``, the status writer and discovery show for one proxy.

A pure fold: ``apply(view, recorded) -> view``. No I/O, no clock: every time comes from the
JetStream timestamp of the event, so a rebuild from sequence 1 equals the live view.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from events.schemas import (
    Condition,
    CreateInstance,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
)
from events.store import Recorded
from events.subjects import proxy_uid_of


class ProxyView(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str = ""
    name: str = ""
    spec: ProxySpec = msgspec.field(default_factory=ProxySpec)
    generation: int = 0
    phase: Phase = Phase.PENDING
    reason: str = ""
    message: str = ""
    ip: str = ""
    url: str = ""
    provider_id: str = ""
    healthy: bool | None = None
    latency_ms: float | None = None
    health_message: str = ""
    """What the last health verdict said (for an unhealthy proxy: why its probes fail)."""
    conditions: tuple[Condition, ...] = ()
    observed_generation: int = 0
    deleting: bool = False
    removed: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_seq: int = 0


def apply(view: ProxyView | None, recorded: Recorded) -> ProxyView:
    """Fold one event into the view (a new view; views are immutable)."""
    current = view or ProxyView(uid=proxy_uid_of(recorded.subject))
    stamp = {"last_seq": recorded.seq, "updated_at": recorded.timestamp}
    match recorded.event:
        case ProxyDeclared(namespace=ns, name=name, spec=spec, generation=gen):
            if current.removed:
                # Declared again after its removal: a new life, nothing of the old one carries
                # over (the reconciler's own fold does the same).
                current = ProxyView(uid=current.uid)
            return msgspec.structs.replace(
                current,
                namespace=ns,
                name=name,
                spec=spec,
                generation=gen,
                created_at=current.created_at or recorded.timestamp,
                **stamp,
            )
        case ProxySpecChanged(spec=spec, generation=gen):
            return msgspec.structs.replace(current, spec=spec, generation=gen, **stamp)
        case ProxyDeletionRequested():
            return msgspec.structs.replace(current, deleting=True, **stamp)
        case ProxyRemoved():
            return msgspec.structs.replace(current, removed=True, deleting=True, **stamp)
        case InstanceCreated(provider_id=pid):
            return msgspec.structs.replace(current, provider_id=pid, **stamp)
        case InstanceObserved(provider_id=pid):
            return msgspec.structs.replace(current, provider_id=pid, **stamp)
        case InstanceGone():
            return msgspec.structs.replace(current, **stamp)
        case HealthChanged(healthy=healthy, provider_id=pid, latency_ms=latency):
            if pid and current.provider_id and pid != current.provider_id:
                return msgspec.structs.replace(current, **stamp)  # about a replaced instance
            return msgspec.structs.replace(
                current,
                healthy=healthy,
                latency_ms=latency or None,
                health_message=recorded.event.message,
                **stamp,
            )
        case CreateInstance():
            # A new instance is coming: the old one's verdict says nothing about it.
            return msgspec.structs.replace(
                current, healthy=None, latency_ms=None, health_message="", **stamp
            )
        case PhaseChanged() as changed:
            return msgspec.structs.replace(
                current,
                phase=changed.phase,
                reason=changed.reason,
                message=changed.message,
                ip=changed.ip,
                url=changed.url,
                provider_id=changed.provider_id or current.provider_id,
                conditions=changed.conditions or current.conditions,
                observed_generation=changed.observed_generation or current.observed_generation,
                **stamp,
            )
        case _:
            return msgspec.structs.replace(current, **stamp)


def fold(events: list[Recorded]) -> ProxyView | None:
    view: ProxyView | None = None
    for recorded in events:
        view = apply(view, recorded)
    return view
