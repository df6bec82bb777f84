"""The proxy view: what the CLI's ``get``, the status writer and discovery show for one proxy.

A pure fold: ``apply(view, recorded) -> view``. No I/O, no clock: every time comes from the
JetStream timestamp of the event, so a rebuild from sequence 1 equals the live view.

It is the one fold of the ``PROXY`` stream that services share, so it also keeps the few facts
some of them act on (who declared the proxy and with which cloud-init, the last instance fact,
the last verdict and whom it judged). Each is a reference or a small struct set by the event
that carries it, so the services need no folds of their own and a rebuild stays cheap. The
reconciler alone folds the stream again, for what only it decides on; the facts both keep are
held equal (docs/decisions/0146-one-proxy-history-two-folds-held-together.md).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from events.egress import EGRESS_MISMATCH
from events.schemas import (
    Condition,
    CreateInstance,
    EgressObserved,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
    ReplacementPromoted,
    RotationRequested,
)
from events.store import Recorded
from events.subjects import proxy_uid_of
from projections.egress import Egress, record
from projections.rotation import COMPLETED, GONE, IN_PROGRESS, Replacement, Rotation, Step, step

# The rotation's structs are the view's too (``projections.rotation`` folds them): its readers
# name them from here.
__all__ = [
    "COMPLETED",
    "GONE",
    "IN_PROGRESS",
    "InstanceFact",
    "ProxyView",
    "Replacement",
    "Rotation",
    "Undeclared",
    "apply",
    "fold",
    "probe_target",
    "target_verdict",
]


class Undeclared(ValueError):
    """An event about a proxy no ``ProxyDeclared`` has introduced.

    A proxy exists from its declaration: anything on ``proxy.<uid>.*`` before it (a stray or
    hostile publish, a test) would otherwise make a view with no name that every reader lists.
    A ``ValueError``, so the tolerant readers (``events.reading.apply_tolerantly``) skip it as
    unusable, count it and log it once, and keep no view
    (docs/decisions/0095-the-console-and-the-api-bound.md).
    """


class InstanceFact(msgspec.Struct, frozen=True, kw_only=True):
    """The last thing recorded about an instance: what the executor's observe sweep compares a
    provider's answer with, so that it records changes and not repeats."""

    provider_id: str
    """Empty after a ``CreateInstance``: a create is out that has made no instance yet, so the
    verdicts about the last one count for nothing."""
    state: str = ""
    """Empty while the instance is only created, then the last observed ``InstanceState``, or
    ``GONE``."""
    ip: str = ""


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
    source: str = ""
    """Who declared it (``cli``, ``kubernetes``): the watcher deletes only what Kubernetes did."""
    cloud_init: str = ""
    """The resolved cloud-init of the latest declaration. With ``spec`` it is all a declaration
    says, so a re-declaration can tell a rotated Secret from no change."""
    instance: InstanceFact | None = None
    """The last instance fact, whichever instance it was about (its ``provider_id`` may name one
    that ``provider_id`` above no longer does)."""
    verdict: HealthChanged | None = None
    """The last health verdict, whichever instance it judged (``verdict.provider_id``), but for a
    rotation's replacement, whose verdicts ``replacement.verdict`` keeps until it takes over; the
    health fields above count only verdicts about the current instance."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_seq: int = 0
    replacement: Replacement | None = None
    """The instance a rotation brings up, until it takes over or is given up."""
    rotation: Rotation | None = None
    """The latest rotation, under way or over."""
    egress: tuple[Egress, ...] = ()
    """The last egress finding about the instance and about a rotation's replacement
    (``projections.egress``)."""
    egress_replacements: int = 0
    """Rotations asked for because the egress did not match, since the spec last changed: what
    bounds ``spec.egress.onMismatch: replace``."""


def probe_target(view: ProxyView) -> tuple[str, str]:
    """The instance the health service probes, as (provider id, proxy URL): a rotation's
    replacement once it runs with an address, so that it is judged before the lease switches
    to it; the proxy's instance otherwise. Its verdicts name that instance (``target_verdict``)."""
    r = view.replacement
    if r is not None and r.provider_id and r.url and r.state == InstanceState.RUNNING:
        return r.provider_id, r.url
    return view.provider_id, view.url


def target_verdict(view: ProxyView) -> HealthChanged | None:
    """The last verdict about the ``probe_target``; None when it has none yet."""
    provider_id, _ = probe_target(view)
    r = view.replacement
    if r is not None and provider_id == r.provider_id and provider_id != view.provider_id:
        return r.verdict
    verdict = view.verdict
    if view.healthy is None or verdict is None or verdict.provider_id != view.provider_id:
        return None
    return verdict


def apply(view: ProxyView | None, recorded: Recorded) -> ProxyView:
    """Fold one event into the view (a new view; views are immutable). Raises ``Undeclared``
    for any event but a ``ProxyDeclared`` when there is no view yet."""
    if view is None and not isinstance(recorded.event, ProxyDeclared):
        uid = proxy_uid_of(recorded.subject)
        raise Undeclared(
            f"proxy {uid!r} has no ProxyDeclared before sequence {recorded.seq}: "
            "the event is skipped; declare the proxy first (`egress-proxies apply`)"
        )
    current = view or ProxyView(uid=proxy_uid_of(recorded.subject))
    stamp = {"last_seq": recorded.seq, "updated_at": recorded.timestamp}
    if isinstance(recorded.event, RotationRequested) and recorded.event.reason == EGRESS_MISMATCH:
        current = msgspec.structs.replace(
            current, egress_replacements=current.egress_replacements + 1
        )
    turned = step(current.rotation, current.replacement, recorded)
    if turned is not None and turned.turn != "failed":  # failures: see ``Replacement.failure``
        return msgspec.structs.replace(_rotated(current, turned, recorded), **stamp)
    match recorded.event:
        case ProxyDeclared(namespace=ns, name=name, spec=spec, generation=gen) as declared:
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
                source=declared.source,
                cloud_init=declared.cloud_init_resolved,
                created_at=current.created_at or recorded.timestamp,
                **stamp,
            )
        case ProxySpecChanged(spec=spec, generation=gen, cloud_init_resolved=ci):
            return msgspec.structs.replace(
                current,
                spec=spec,
                generation=gen,
                cloud_init=ci,
                egress_replacements=0,  # a new expectation gets its own replacements
                **stamp,
            )
        case ProxyDeletionRequested():
            return msgspec.structs.replace(current, deleting=True, **stamp)
        case ProxyRemoved():
            return msgspec.structs.replace(current, removed=True, deleting=True, **stamp)
        case InstanceCreated(provider_id=pid):
            fact = InstanceFact(provider_id=pid)
            return msgspec.structs.replace(current, provider_id=pid, instance=fact, **stamp)
        case InstanceObserved(provider_id=pid, state=state, ip=ip):
            fact = InstanceFact(provider_id=pid, state=state, ip=ip)
            return msgspec.structs.replace(current, provider_id=pid, instance=fact, **stamp)
        case InstanceGone(provider_id=pid):
            fact = InstanceFact(provider_id=pid, state=GONE)
            return msgspec.structs.replace(current, instance=fact, **stamp)
        case HealthChanged(healthy=healthy, provider_id=pid, latency_ms=latency) as verdict:
            if pid and not _serving(current, pid):
                # About an instance replaced, gone or not yet the proxy's (a probe still out
                # when it went): it says nothing about this one, as for the reconciler
                # (docs/decisions/0146-one-proxy-history-two-folds-held-together.md).
                return msgspec.structs.replace(current, verdict=verdict, **stamp)
            return msgspec.structs.replace(
                current,
                healthy=healthy,
                latency_ms=latency or None,
                health_message=verdict.message,
                verdict=verdict,
                **stamp,
            )
        case EgressObserved() as observed:
            found = record(current.egress, observed, recorded.seq)
            return msgspec.structs.replace(current, egress=found, **stamp)
        case CreateInstance():
            # A new instance is coming: the old one's facts and verdict say nothing about it.
            coming = InstanceFact(provider_id="")
            return msgspec.structs.replace(
                current, healthy=None, latency_ms=None, health_message="", instance=coming, **stamp
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
    """The view after ``events`` (an aggregate's history); events before the proxy's first
    declaration are skipped, as the tolerant readers skip them (``Undeclared``)."""
    view: ProxyView | None = None
    for recorded in events:
        if view is None and not isinstance(recorded.event, ProxyDeclared):
            continue
        view = apply(view, recorded)
    return view


def _serving(view: ProxyView, provider_id: str) -> bool:
    """Whether ``provider_id`` is the proxy's instance and still there: no create out since
    (``InstanceFact.provider_id``), and not gone. A fact about another instance (a cancelled
    replacement's) says nothing about it, and a log with none (the proxy declared Ready by
    hand, or external) takes the status's word."""
    fact = view.instance
    if provider_id != view.provider_id:
        return False
    if fact is None or fact.provider_id not in ("", provider_id):
        return True
    return fact.provider_id == provider_id and fact.state != GONE


def _rotated(view: ProxyView, turned: Step, recorded: Recorded) -> ProxyView:
    """The view after an event of a rotation or about its replacement (``projections.rotation``
    folded it): the replacement's takeover, and a fresh create, are the view's own to fold."""
    replace = msgspec.structs.replace
    match turned.turn, recorded.event, view.replacement:
        case "fresh", _, _:
            return apply(replace(view, rotation=turned.rotation), recorded)
        case "promote", ReplacementPromoted() as e, Replacement() as r:
            judged = r.verdict
            return replace(
                view,
                provider_id=e.provider_id,
                ip=e.ip or r.ip,
                url=e.url or r.url,
                instance=InstanceFact(provider_id=e.provider_id, state=r.state, ip=r.ip),
                healthy=judged.healthy if judged is not None else None,
                latency_ms=(judged.latency_ms or None) if judged is not None else None,
                health_message=judged.message if judged is not None else "",
                verdict=judged or view.verdict,
                replacement=None,
                rotation=turned.rotation,
            )
        case _:
            return replace(view, rotation=turned.rotation, replacement=turned.replacement)
